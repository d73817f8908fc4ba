"""The openai backend passes a run's tools and schema through and reads tool calls back (issue 40,
item 5), against the loopback stub: `tools`, `tool_choice` and `response_format` in the body as
OpenAI takes them, each choice's first tool call as its lane's text in canonical form, `n`-merged
as any wave; and a whole run voting over the server's calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai_stub import Recorded, Stub, choices_body
from openai_stub import make_backend as backend
from starlette.responses import JSONResponse, Response

import lanefold
from lanefold.backends.openai import OpenAIConfig
from lanefold.backends.openai._wire import build_body
from lanefold.primitives import (
    ChatMessage,
    ConfigError,
    ExtractSpec,
    LaneRequest,
    MessageToolCall,
    Sample,
    SampleRequest,
    SamplingParams,
    parse_tools,
    read_answer,
    sample_all,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
            "required": ["city"],
        },
    },
}
TOOLS = parse_tools([WEATHER])
CALLS = ExtractSpec(method="tool_call").with_tools(TOOLS)
SCHEMA = '{"properties":{"answer":{"type":"integer"}},"required":["answer"],"type":"object"}'


def request(k: int = 1, **fields: Any) -> SampleRequest:
    lanes = tuple(LaneRequest(lane=i, seed=7 + i, max_tokens=64) for i in range(k))
    return SampleRequest("Weather in Paris?", SamplingParams(max_tokens=64), lanes, **fields)


def body(req: SampleRequest, **config: Any) -> dict[str, Any]:
    cfg = OpenAIConfig(base_url="http://127.0.0.1:1/v1", model="m", **config)
    return build_body(cfg, req, n=1, seed=7, max_tokens=64)


def test_tools_and_a_choice_go_as_openai_takes_them() -> None:
    sent = body(request(tools=TOOLS, tool_choice="auto"))
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "auto"
    assert "response_format" not in sent
    named = body(request(tools=TOOLS, tool_choice="get_weather", schema=CALLS.output_schema()))
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_a_run_reading_calls_without_a_choice_asks_for_one() -> None:
    assert body(request(tools=TOOLS, schema=CALLS.output_schema()))["tool_choice"] == "required"
    assert "tool_choice" not in body(request(tools=TOOLS))  # tools passed through, the server's default


def test_a_schema_without_tools_is_the_response_format() -> None:
    sent = body(request(schema=SCHEMA))
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": json.loads(SCHEMA)},
    }
    assert "tools" not in body(request())


def test_a_history_of_calls_and_results_goes_as_openai_messages_hold_it() -> None:
    """The server renders a conversation's calls with its own template: each assistant turn's
    `tool_calls` and each tool turn's `tool_call_id` go as OpenAI's messages hold them."""
    call = MessageToolCall("call_1", "get_weather", '{"city": "Paris"}')
    turns = (
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "18C", tool_call_id="call_1", name="get_weather"),
        ChatMessage("user", "And tomorrow?"),
    )
    assert body(request(tools=TOOLS, messages=turns))["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "content": "18C", "tool_call_id": "call_1", "name": "get_weather"},
        {"role": "user", "content": "And tomorrow?"},
    ]


def test_the_completions_api_refuses_tools_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"backend\.api: 'completions' has no field for the run's tools"):
        body(request(tools=TOOLS), api="completions")


def tool_calls(arguments: list[Any]) -> Any:
    """A reply of one choice per `arguments` (n of them), each calling get_weather with them."""

    def reply(rec: Recorded) -> Response:
        out = choices_body(rec, ["" for _ in arguments])
        for choice, args in zip(out["choices"], arguments, strict=True):
            calls = [{"id": f"c{choice['index']}", "type": "function", "function": {"name": "get_weather"}}]
            calls[0]["function"]["arguments"] = args  # type: ignore[index]
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
            choice["finish_reason"] = "tool_calls"
        return JSONResponse(out)

    return reply


@pytest.mark.anyio
async def test_each_choices_call_is_its_lanes_text_n_merged(stub: tuple[Stub, str]) -> None:
    server, url = stub
    server.reply = tool_calls(['{"city": "Paris"}', '{"days":2.0, "city":"Paris"}', "city=Paris"])
    async with backend(url) as client:
        out = await sample_all(client, request(3, tools=TOOLS, schema=CALLS.output_schema()))
    assert len(server.requests) == 1 and server.requests[0].n == 3  # one request for the wave
    sent = server.requests[0].body
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "required"
    assert all(isinstance(s, Sample) for s in out)
    texts = [s.text for s in out if isinstance(s, Sample)]
    assert texts == [
        '{"arguments":{"city":"Paris"},"name":"get_weather"}',
        '{"arguments":{"city":"Paris","days":2},"name":"get_weather"}',
        '{"arguments":"city=Paris","name":"get_weather"}',
    ]
    assert [s.finish_reason for s in out if isinstance(s, Sample)] == ["tool_calls"] * 3
    assert [s.extra["tool_calls"] for s in out if isinstance(s, Sample)] == [1, 1, 1]
    reads = [read_answer(text, CALLS) for text in texts]
    assert reads[0].answer == '{"arguments":{"city":"Paris","days":1},"name":"get_weather"}'
    assert reads[2].reason == "the call's arguments are a string, not an object"


def test_a_run_votes_over_the_servers_calls(stub: tuple[Stub, str], tmp_path: Path) -> None:
    server, url = stub
    server.reply = tool_calls(
        ['{"city": "Paris", "days": 2}', '{"days": 2.0, "city": "Paris"}', '{"city": "Lyon"}']
    )
    config = lanefold.parse_config(
        {
            "loop": {"coordinator": "parallel_sample", "k": 3},
            "backend": {"kind": "openai", "base_url": url, "model": "m", "api": "chat"},
            "extract": {"method": "tool_call"},
        }
    )
    result = lanefold.run_sync(config, "Weather in Paris for two days?", runs_dir=tmp_path, tools=[WEATHER])
    assert result.answer == '{"arguments":{"city":"Paris","days":2},"name":"get_weather"}'
    assert result.votes == {
        result.answer: 2,
        '{"arguments":{"city":"Lyon","days":1},"name":"get_weather"}': 1,
    }
    sent = server.requests[0].body
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "required" and sent["n"] == 3
