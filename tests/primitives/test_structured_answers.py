"""Answers that are JSON values or tool calls: their canonical form, their checks, the reasons
a lane has none, and the vote over them (issue 40, items 1 and 2)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from lanefold.primitives import (
    Ballot,
    ConfigError,
    ExtractSpec,
    LaneRequest,
    SampleRequest,
    SamplingParams,
    ToolCall,
    canonical_json,
    describe_answer,
    estimate_prompt_tokens,
    normalize_answer,
    parse_tools,
    read_answer,
    tools_schema,
    vote_fold,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "default": 1},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}
TOOLS = parse_tools([WEATHER, TIME])
CALLS = ExtractSpec(method="tool_call").with_tools(TOOLS)


def test_a_call_is_its_canonical_text_with_defaults_filled() -> None:
    read = read_answer('{"name": "get_weather", "arguments": {"city": "Paris"}}', CALLS)
    assert read.answer == '{"arguments":{"city":"Paris","days":1},"name":"get_weather"}'
    assert read.reason is None


def test_five_calls_differing_in_key_order_and_number_format_vote_as_one() -> None:
    texts = [
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
        '{"arguments": {"days": 2.0, "city": "Paris"}, "name": "get_weather"}',
        '```json\n{"name":"get_weather","arguments":{"days":2e0,"city":"Paris"}}\n```',
        '{\n  "arguments": {"city": "Paris", "days": 20E-1},\n  "name": "get_weather"\n}',
        'I will call it: {"name": "get_weather", "arguments": {"days": 2.000, "city": "Paris"}}',
    ]
    answers = [read_answer(text, CALLS).answer for text in texts]
    assert len(set(answers)) == 1 and answers[0] is not None
    result = vote_fold([Ballot(i, a) for i, a in enumerate(answers)])
    assert result.counts == {answers[0]: 5}
    assert result.winner == answers[0]


def test_whitespace_and_case_inside_strings_are_kept() -> None:
    one = read_answer('{"name": "get_weather", "arguments": {"city": "New  York"}}', CALLS).answer
    two = read_answer('{"name": "get_weather", "arguments": {"city": "new york"}}', CALLS).answer
    assert one is not None and two is not None
    assert '"New  York"' in one
    assert normalize_answer(one) == one  # canonical JSON is kept as it is
    assert len(vote_fold([Ballot(0, one), Ballot(1, two)]).counts) == 2


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"name": "get_weather", "arguments": {"city": 3}}', "arguments.city: 3 is not of type 'string'"),
        ('{"name": "get_weather", "arguments": {}}', "arguments: 'city' is a required property"),
        (
            '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "k"}}',
            "arguments.unit: 'k' is not one of",
        ),
        ('{"name": "get_wether", "arguments": {"city": "Oslo"}}', "'get_wether', which is not a tool here"),
        ('{"name": "get_time", "arguments": "zone=UTC"}', "arguments are a string, not an object"),
        ('{"name": "get_time", "arguments": {}, "id": 1}', "a key 'id' besides name and arguments"),
        ('{"arguments": {}}', "no function name"),
        ("[1, 2]", "the call is not a JSON object but an array"),
        ('{"name": "get_weather", "arguments": {"city": "Os', "no JSON object in the text"),
        ("", "the text is empty"),
    ],
)
def test_an_invalid_call_is_a_lane_without_answer_and_says_why(text: str, reason: str) -> None:
    read = read_answer(text, CALLS)
    assert read.answer is None
    assert read.reason is not None and reason in read.reason


def test_a_tool_choice_naming_a_tool_admits_that_one_only() -> None:
    only = ExtractSpec(method="tool_call").with_tools(TOOLS, "get_time")
    assert read_answer('{"name": "get_time", "arguments": {}}', only).answer is not None
    read = read_answer('{"name": "get_weather", "arguments": {"city": "Oslo"}}', only)
    assert read.answer is None and "(get_time)" in (read.reason or "")


def test_json_values_checked_against_the_schema() -> None:
    spec = ExtractSpec.model_validate(
        {
            "method": "json",
            "schema": {
                "type": "object",
                "properties": {"answer": {"type": "integer"}},
                "required": ["answer"],
            },
        }
    )
    assert read_answer('{"answer": 391.0}', spec).answer == '{"answer":391}'
    assert read_answer('{"answer": "391"}', spec).reason == "answer: '391' is not of type 'integer'"
    assert read_answer("Answer: 391", spec).reason == "no JSON value in the text"
    free = ExtractSpec(method="json")
    assert read_answer("  [3, 1.50, null]  ", free).answer == "[3,1.5,null]"
    assert read_answer('"Paris"', free).answer == '"Paris"'
    assert read_answer("NaN", free).answer is None


def test_schema_is_json_only_and_must_be_a_schema() -> None:
    with pytest.raises(ValidationError, match="only used with method 'json'"):
        ExtractSpec.model_validate({"method": "regex", "regex": "(x)", "schema": {"type": "object"}})
    with pytest.raises(ValidationError, match="not a JSON Schema"):
        ExtractSpec.model_validate({"method": "json", "schema": {"type": "objekt"}})
    as_text = ExtractSpec.model_validate({"method": "json", "schema": '{"type": "object"}'})
    assert as_text.model_dump(mode="json")["schema"] == '{"type":"object"}'
    # absent, it stays out of the dump: configs written before it hash as they did
    assert "schema" not in ExtractSpec().model_dump(mode="json")


def test_tools_are_checked_with_the_place_named() -> None:
    with pytest.raises(ConfigError, match=r"tools\[1\]: a second tool named 'get_time'"):
        parse_tools([TIME, TIME])
    with pytest.raises(ConfigError, match=r"tools\[0\]\.function\.parameters\.type"):
        parse_tools([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}])
    with pytest.raises(ConfigError, match=r"tools\[0\]\.name: 'a b' is not a function name"):
        parse_tools([{"name": "a b"}])
    with pytest.raises(ConfigError, match="expected a list of tools"):
        parse_tools({"name": "f"})


def test_tools_schema_is_an_any_of_one_object_per_tool() -> None:
    schema = json.loads(tools_schema(TOOLS) or "")
    assert [option["properties"]["name"] for option in schema["anyOf"]] == [
        {"const": "get_weather"},
        {"const": "get_time"},
    ]
    assert all(option["additionalProperties"] is False for option in schema["anyOf"])
    assert json.loads(tools_schema(TOOLS, "get_time") or "")["properties"]["name"] == {"const": "get_time"}
    assert tools_schema(TOOLS, "none") is None
    assert CALLS.output_schema() == tools_schema(TOOLS)
    assert CALLS.with_tools(TOOLS, "auto").output_schema() is None  # the model may answer in prose


def test_a_call_reads_back_and_reads_well() -> None:
    answer = read_answer('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}', CALLS).answer
    call = ToolCall.from_answer(answer)
    assert call == ToolCall("get_weather", {"city": "Paris", "days": 1, "unit": "c"})
    assert describe_answer(answer or "") == 'get_weather(city="Paris", days=1, unit="c")'
    assert describe_answer('{"b":[1,2],"a":"x"}') == '{"a": "x", "b": [1, 2]}'
    assert describe_answer("391") == "391"
    assert ToolCall.from_answer("391") is None


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


@given(_json)
def test_canonical_json_is_a_fixed_point_of_reading(value: object) -> None:
    text = canonical_json(value)
    again = canonical_json(json.loads(text, parse_float=Decimal))
    assert again == text
    read = read_answer(text, ExtractSpec(method="json"))
    assert read.answer == text
    if text[:1] in "{[":
        assert normalize_answer(text) == text


def test_a_remote_backends_hold_counts_the_tools_it_sends() -> None:
    """A server renders the tools into the prompt: the conservative estimate holds their bytes."""
    bare = SampleRequest("Weather?", SamplingParams(), (LaneRequest(0, 1, 8),))
    with_tools = SampleRequest("Weather?", SamplingParams(), (LaneRequest(0, 1, 8),), tools=TOOLS)
    sent = sum(len((t.name + t.description + t.parameters).encode()) for t in TOOLS)
    assert estimate_prompt_tokens(with_tools) == estimate_prompt_tokens(bare) + sent


@pytest.mark.parametrize(
    ("text", "answer", "reason"),
    [
        ("It is sunny in Paris.", "It is sunny in Paris.", None),
        ('  {"answer": 4} is what I found ', '{"answer": 4} is what I found', None),  # no call attempted
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', None, None),  # a call: canonical below
        ('{"name": "get_wether", "arguments": {}}', None, "the call names 'get_wether'"),
        ("   ", None, "the text is empty"),
    ],
    ids=["prose", "an object without a name", "a call", "an invalid call", "empty"],
)
def test_under_auto_a_text_without_a_call_is_the_models_reply(
    text: str, answer: str | None, reason: str | None
) -> None:
    """`tool_choice` "auto" lets the model answer instead of calling: a text with no call in
    it (no object with a `name`) is its answer, the whole text; a call attempted and invalid
    is still no answer with its reason. Any other choice reads a call or nothing."""
    read = read_answer(text, CALLS.with_tools(TOOLS, "auto"))
    if text.startswith('{"name": "get_weather"'):
        assert read.answer == '{"arguments":{"city":"Paris","days":1},"name":"get_weather"}'
    else:
        assert read.answer == answer
    assert (read.reason or "").startswith(reason or "")
    if answer is not None:
        assert read_answer(text, CALLS.with_tools(TOOLS, "required")).answer is None
