"""Runs with tools on the engine (issue 40, item 4): what a run holds for its prompt is what the
engine prefills, tools and all; a history of calls and results given to `Session.run` is
recorded and reaches the model; the command line and a session send one prompt; and SmolLM2
with the tools in its system turn writes a call on every lane of a forked wave (slow)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_tool_render import TIME, smollm2_tokenizer

from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.config import parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import ChatMessage, MessageToolCall, parse_event, parse_tools
from lanefold.primitives.events import TurnData


def test_a_runs_hold_with_tools_is_what_the_engine_prefills(
    make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    """The prompt tokens a run with tools is charged are the rendered prompt's, tools and all
    (one token a byte here), held exactly: no overrun, the lane's prefill the same count."""
    engine = make_engine()
    engine.tokenizer = smollm2_tokenizer()
    config = parse_config(
        {
            "loop": {"k": 2, "min_quorum": 1, "seed": 3},
            "prompt": {"template": "{question}"},
            "sampling": {"max_tokens": 4},
            "extract": {"method": "regex", "regex": r"(?s)(.)"},
        }
    )
    tools = [{"name": "get_time"}]  # one short tool: the tiny model's context is 512 tokens

    async def go() -> None:
        async with Session(config, backend=EngineBackend(engine=engine), runs_dir=tmp_path) as session:
            await session.run("Weather in Paris?", tools=tools, tool_choice="auto", run_id="tools")

    anyio.run(go)
    rendered = engine.tokenizer.encode_chat(
        [ChatMessage("user", "Weather in Paris?")], tools=(TIME,), tool_choice="auto"
    )
    assert '{"name": "get_time"' in engine.tokenizer.decode(rendered)  # the tools are in it
    state = read_state(open_store(None, tmp_path), "tools")
    (wave,) = state.waves.values()
    assert wave.info.prompt_tokens == len(rendered)
    lanes = list(wave.lanes.values())
    assert len(lanes) == 2
    charged = sum(
        lane.usage.input_tokens + lane.usage.cached_input_tokens for lane in lanes if lane.usage is not None
    )
    assert charged == 2 * len(rendered)  # the forked lanes share one prefill of the same prompt
    events = [parse_event(line) for line in (tmp_path / "tools" / "events.jsonl").read_bytes().splitlines()]
    assert not any(e.type == "budget.overrun" for e in events)


def test_a_runs_history_of_calls_and_results_reaches_the_model(
    make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    """`Session.run(conversation=...)` takes a history with an assistant's call and the tool's
    result: recorded in `run.started` with its calls (a plain turn still as a pair), rendered
    in the format of the tools, held and prefilled exactly, and read back by resume as sent."""
    engine = make_engine()
    engine.tokenizer = smollm2_tokenizer()
    config = parse_config(
        {
            "loop": {"k": 1, "min_quorum": 1, "seed": 3},
            "prompt": {"template": "{question}"},
            "sampling": {"max_tokens": 2},
            "extract": {"method": "regex", "regex": r"(?s)(.)"},
        }
    )
    history = [
        ("user", "Time?"),
        ChatMessage("assistant", "", tool_calls=(MessageToolCall("c1", "get_time", "{}"),)),
        ChatMessage("tool", "14:05", tool_call_id="c1"),
    ]

    async def go() -> None:
        async with Session(config, backend=EngineBackend(engine=engine), runs_dir=tmp_path) as session:
            # "none": no tools shown (the tiny model's context is 512), the history written all the same
            await session.run(
                "And now?",
                tools=[{"name": "get_time"}],
                tool_choice="none",
                conversation=history,
                run_id="turns",
            )

    anyio.run(go)
    sent = [ChatMessage("user", "Time?"), *history[1:], ChatMessage("user", "And now?")]
    rendered = engine.tokenizer.render_chat(sent, (TIME,), "none")  # type: ignore[arg-type]
    assert "You can call" not in rendered
    assert 'assistant\n{"name": "get_time", "arguments": {}}<|im_end|>' in rendered
    assert "<|im_start|>user\nResult of get_time:\n14:05<|im_end|>" in rendered
    state = read_state(open_store(None, tmp_path), "turns")
    (wave,) = state.waves.values()
    assert wave.info.prompt_tokens == len(engine.tokenizer.encode(rendered))
    assert state.started is not None and state.started.conversation is not None
    recorded = state.started.conversation
    assert recorded[0] == ("user", "Time?")  # a plain turn is recorded as it always was
    assert [TurnData.message(turn) for turn in recorded] == sent[:3]
    line = (tmp_path / "turns" / "events.jsonl").read_text().splitlines()[0]
    assert '"tool_calls":[{"id":"c1","name":"get_time","arguments":"{}"}]' in line


def _strict(name: str, description: str, argument: str) -> dict[str, Any]:
    """A tool of one string argument and no other (`additionalProperties: false`: held to it, a
    lane cannot pad its call with keys the tool does not take)."""
    parameters = {
        "type": "object",
        "properties": {argument: {"type": "string"}},
        "required": [argument],
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


@pytest.mark.slow
def test_smollm2_writes_one_call_on_every_lane_of_a_forked_wave(smollm2: Engine, tmp_path: Path) -> None:
    """SmolLM2 with the tools in its system turn, held to a call of them: a wave of 4 forked
    lanes, each lane's text a valid call of one of the tools, voted to one call."""
    import jsonschema

    from lanefold.primitives import ToolCall, tools_schema

    config = parse_config(
        {
            "loop": {"k": 4, "max_concurrency": 4, "seed": 7, "reducer": "majority_vote"},
            "prompt": {"template": "{question}"},
            "sampling": {"temperature": 0.7, "max_tokens": 96},
            "extract": {"method": "tool_call"},
            "backend": {"kind": "engine", "model": "smollm2-135m", "device": "cpu"},
        }
    )
    tools = parse_tools(
        [
            _strict("get_weather", "Weather in a city", "city"),
            _strict("get_time", "The time in a timezone", "timezone"),
        ]
    )
    backend = EngineBackend(engine=smollm2)

    async def go() -> Any:
        async with Session(config, backend=backend, runs_dir=tmp_path) as session:
            return await session.run("What is the weather in Paris?", tools=tools, run_id="call")

    result = anyio.run(go)
    schema = json.loads(tools_schema(tools) or "{}")
    state = read_state(open_store(None, tmp_path), "call")
    (wave,) = state.waves.values()
    texts = [lane.text for lane in wave.lanes.values()]
    assert len(texts) == 4
    for text in texts:
        assert text is not None
        jsonschema.validate(json.loads(text), schema)  # each lane's text a valid call
    asked = [ChatMessage("user", "What is the weather in Paris?")]
    rendered = smollm2.tokenizer.encode_chat(asked, tools=tools, tool_choice="required")
    assert wave.info.prompt_tokens == len(rendered)  # prefilled once, forked for the other lanes
    call = ToolCall.from_answer(result.answer)
    assert call is not None and call.name in ("get_weather", "get_time")
    assert sum(result.votes.values()) == 4 and result.votes[result.answer] == max(result.votes.values())


@pytest.mark.slow
def test_the_command_line_and_a_session_send_one_prompt_with_tools(
    smollm2: Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`orchestrator run --tools FILE` and `Session.run(tools=...)` reach the one prompt path:
    the same question and tools are held and prefilled as the same prompt, the tools in it."""
    from lanefold.cli import main

    raw = {
        "loop": {"k": 1, "min_quorum": 1, "seed": 2},
        "prompt": {"template": "{question}"},
        "sampling": {"max_tokens": 4},
        "extract": {"method": "regex", "regex": r"(?s)(.)"},
        "backend": {"kind": "engine", "model": "smollm2-135m", "device": "cpu"},
    }
    config_file = tmp_path / "tools.json"  # configs may be JSON
    config_file.write_text(json.dumps(raw))
    tools = [_strict("get_weather", "Weather in a city", "city")]
    (tmp_path / "tools-list.json").write_text(json.dumps(tools))
    argv = ["run", str(config_file), "--question", "Weather in Paris?", "--runs-dir", str(tmp_path / "cli")]
    assert main([*argv, "--run-id", "cli", "--tools", str(tmp_path / "tools-list.json"), "--json"]) == 0
    capsys.readouterr()

    async def go() -> None:
        backend = EngineBackend(engine=smollm2)
        async with Session(parse_config(raw), backend=backend, runs_dir=tmp_path / "py") as session:
            await session.run("Weather in Paris?", tools=tools, run_id="py")

    anyio.run(go)
    held = []
    for folder, run_id in ((tmp_path / "cli", "cli"), (tmp_path / "py", "py")):
        (wave,) = read_state(open_store(None, folder), run_id).waves.values()
        held.append(wave.info.prompt_tokens)
    asked = [ChatMessage("user", "Weather in Paris?")]
    rendered = smollm2.tokenizer.encode_chat(asked, tools=parse_tools(tools), tool_choice="auto")
    assert held == [len(rendered), len(rendered)]
