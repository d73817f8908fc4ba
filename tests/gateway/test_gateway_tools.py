"""The gateway's tools and structured answers at their edges (issue 40): a key's hold is exact
with the tools and the history of calls a template renders, what a client sends wrong is a 400
naming the place (nothing recorded), `tool_choice` "none" keeps the loop's text answer, "auto"
serves prose where the lanes answered in prose, and a replay says the same call id."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lanefold.config import parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import Store
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, load_keys

pytest.importorskip("starlette")
from starlette.testclient import TestClient

ALICE = "alice-key-0123456789"
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
HISTORY = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "10:00"},
]


def _loop(**backend: Any) -> Any:
    return parse_config(
        {
            "loop": {"k": 4, "seed": 3},
            "prompt": {"template": "{question}"},
            "sampling": {"max_tokens": 32},
            "backend": {
                "kind": "simulated",
                "prompt_tokens": 40,
                "template_tokens": 7,
                "output_tokens": 12,
                "answer": CALL,
                "accuracy": 1.0,
                **backend,
            },
        }
    )


@contextmanager
def served(tmp_path: Path, **backend: Any) -> Iterator[tuple[TestClient, Store]]:
    store = open_store(None, tmp_path / "runs")
    loops = {"agent": _loop(**backend)}
    keys_file = tmp_path / "keys.toml"
    sha = hashlib.sha256(ALICE.encode()).hexdigest()
    keys_file.write_text(f'[[keys]]\nname = "alice"\nsha256 = "{sha}"\nbudget = {{max_tokens = 5000}}\n')
    keys = load_keys(keys_file, loops)
    pools = KeyPools(keys, store)
    pools.prepare()
    app = create_gateway(Session(store=store), loops, keys=keys, pools=pools, heartbeat_s=0.05)
    with TestClient(app, base_url="http://gateway/v1", raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {ALICE}"
        yield client, store


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "agent", "messages": HISTORY, "tools": TOOLS, **fields}


def test_a_keys_hold_is_exact_with_the_tools_and_the_calls_a_template_renders(tmp_path: Path) -> None:
    with served(tmp_path) as (client, store):
        reply = client.post("/chat/completions", json=_chat())
        assert reply.status_code == 200, reply.text
        state = read_state(store, reply.headers["x-lanefold-run-id"])
        (wave,) = state.waves.values()
        # system, the question, the assistant's call, the tool's result, and the two tools
        sent = 40 + 7 * (4 + len(TOOLS))
        assert wave.info.prompt_tokens == sent
        assert {
            lane.usage.input_tokens + lane.usage.cached_input_tokens
            for lane in wave.lanes.values()
            if lane.usage
        } == {sent}
        assert store.read_budget("key:alice").spent_tokens == state.spend.tokens  # type: ignore[attr-defined]
        usage = reply.json()["usage"]
        assert usage["prompt_tokens"] == 4 * sent  # every lane's prompt, prefix-cached or not


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"messages": [*HISTORY[:3], {"role": "tool", "content": "10:00"}]},
            "messages.3.tool_call_id",
            "a tool turn names the call it answers",
        ),
        (
            {"messages": [{**HISTORY[1], "tool_calls": HISTORY[2]["tool_calls"]}]},
            "messages.0.tool_calls",
            "only an assistant turn makes calls",
        ),
        (
            {"messages": [*HISTORY, {"role": "assistant", "content": "Sunny."}]},
            "messages",
            "the last message must be the user's question or a tool's result",
        ),
        ({"messages": [HISTORY[0], HISTORY[3]]}, "messages", "the last message must be the user's question"),
        (
            {"response_format": {"type": "json_object"}},
            "response_format",
            "with tools a loop's lanes answer with calls",
        ),
        ({"tool_choice": {"type": "function"}}, "tool_choice", 'expected "auto", "required", "none"'),
        ({"tool_choice": "get_date"}, "tool_choice", "'get_date' is none of auto, required, none"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters.type",
            "a tool's arguments are an object",
        ),
        (
            {"tools": [], "response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
            "response_format.json_schema.schema",
            "expected a JSON Schema object",
        ),
        (
            {"tools": [], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format.json_schema.schema.type",
            "not a JSON Schema",
        ),
    ],
    ids=[
        "tool turn without its call",
        "a user's calls",
        "an assistant last",
        "no user turn",
        "tools and a format",
        "a choice without a name",
        "a choice of no tool",
        "a tool of no object",
        "a schema of no object",
        "no JSON Schema",
    ],
)
def test_a_bad_tools_request_is_a_400_naming_the_place(
    tmp_path: Path, fields: dict[str, Any], param: str, message: str
) -> None:
    with served(tmp_path) as (client, store):
        refused = client.post("/chat/completions", json=_chat(**fields))
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == param and error["message"].startswith(param)
        assert message in error["message"]
        assert store.list_runs() == []  # nothing recorded


def test_tools_on_a_completion_are_refused(tmp_path: Path) -> None:
    with served(tmp_path) as (client, _):
        refused = client.post("/completions", json={"model": "agent", "prompt": "q", "tools": TOOLS})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_parameter"


def test_tool_choice_none_keeps_the_loops_text_answer(tmp_path: Path) -> None:
    with served(tmp_path, answer="391", distractors=["381"]) as (client, store):
        reply = client.post(
            "/chat/completions",
            json=_chat(tool_choice="none", messages=[{"role": "user", "content": "What is 17 * 23?"}]),
        )
        assert reply.status_code == 200, reply.text
        (choice,) = reply.json()["choices"]
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
        assert choice["message"]["content"].endswith("Answer: 391")  # the winning lane's prose
        started = read_state(store, reply.headers["x-lanefold-run-id"]).started
        assert started is not None and started.tool_choice == "none" and started.tools is not None
        assert started.config["extract"]["method"] is None  # the loop's own (its regex)


def test_auto_serves_the_lanes_prose_once_the_tools_have_answered(tmp_path: Path) -> None:
    with served(tmp_path, after_tool_results=["It is 10:00 in Paris."]) as (client, _):
        reply = client.post("/chat/completions", json=_chat(tool_choice="auto"))
        assert reply.status_code == 200, reply.text
        body = reply.json()
        (choice,) = body["choices"]
        assert choice == {
            "index": 0,
            "message": {"role": "assistant", "content": "It is 10:00 in Paris."},
            "finish_reason": "stop",
            "logprobs": None,
        }
        assert body["lanefold"]["votes"] == {"it is 10:00 in paris": 4}


def test_a_replayed_call_says_the_same_id_and_streams_as_a_call(tmp_path: Path) -> None:
    with served(tmp_path) as (client, _):
        first = client.post("/chat/completions", json=_chat(), headers={"Idempotency-Key": "k"})
        again = client.post("/chat/completions", json=_chat(stream=True), headers={"Idempotency-Key": "k"})
    assert first.status_code == 200 and again.status_code == 200
    (call,) = first.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    chunks = [json.loads(line[6:]) for line in again.text.splitlines() if line.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert {"index": 0, **call} in [d["delta"].get("tool_calls", [None])[0] for d in deltas]
    assert deltas[-1]["finish_reason"] == "tool_calls"
