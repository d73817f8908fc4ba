"""Constrained decoding: every lane of a forked wave held to a JSON schema (each lane's text
parses and validates), the value's end stops a lane, `max_tokens` still binds, end-of-sequence
waits for a whole value, a bad schema is one ConfigError line, and a lane held to nothing
decodes as it did."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import anyio
import jsonschema
import pytest
import torch
from tiny import TINY, byte_tokenizer, tiny_checkpoint

from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._model import build_model
from lanefold.primitives import (
    ConfigError,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    TextDelta,
    sample_all,
)

PROMPT = [(7 * i + 3) % 256 for i in range(40)]


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    arguments = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# Bounded values, so that the tiny random model, held to the schema, ends its value well within
# the lanes' allotment (a string of 8 characters is at most 48 bytes, escapes and all).
SMALL = {"type": "integer", "minimum": 0, "maximum": 99}
TOOL_CALL = {
    "anyOf": [
        _tool(
            "get_weather",
            {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "celsius": {"type": "boolean"}},
            ["city"],
        ),
        _tool("add", {"a": SMALL, "b": SMALL}, ["a", "b"]),
        _tool("search", {"query": {"type": "string", "maxLength": 8}, "limit": SMALL}, ["query"]),
    ]
}
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": -999, "maximum": 999}},
    "required": ["answer"],
    "additionalProperties": False,
}
LANES = 8


def lanes(k: int, max_tokens: int = 160) -> list[LaneRequest]:
    return [LaneRequest(i, 100 + i, max_tokens) for i in range(k)]


@pytest.mark.parametrize("schema", [TOOL_CALL, ANSWER], ids=["tool call", "answer"])
def test_the_grammar_holds_on_every_lane_of_a_forked_wave(
    make_engine: Callable[..., Engine], schema: dict[str, Any]
) -> None:
    engine = make_engine()
    params = SamplingParams(temperature=1.0, max_tokens=160)
    request = engine.generate(PROMPT, params, lanes(LANES), schema=json.dumps(schema))
    texts = [s.text for s in request.sequences]
    for seq in request.sequences:
        jsonschema.validate(json.loads(seq.text), schema)
        assert seq.finish_reason == "stop", seq.text  # ended where its value did, not cut
    assert len(set(texts)) > 1, texts  # forks advanced separately
    assert request.metrics.prompt_tokens_computed == len(PROMPT)  # one prefill, K forks
    # one compiled grammar shared, a matcher of its own per lane
    grammars = [s.grammar for s in request.sequences]
    assert all(g is not None and g.grammar is grammars[0].grammar for g in grammars), grammars  # type: ignore[union-attr]
    assert len({id(g.matcher) for g in grammars if g is not None}) == LANES
    assert engine.grammars is not None and len(engine.grammars) == 1
    assert engine.pool.num_free == engine.pool.num_blocks


def test_unconstrained_the_tiny_model_writes_no_json(make_engine: Callable[..., Engine]) -> None:
    """What the mask does: the same lanes held to nothing write text that is not the value."""
    params = SamplingParams(temperature=1.0, max_tokens=40)
    request = make_engine().generate(PROMPT, params, lanes(LANES, 40))
    for seq in request.sequences:
        with pytest.raises(ValueError):
            json.loads(seq.text)


def test_a_lane_ends_where_its_value_does(make_engine: Callable[..., Engine]) -> None:
    """The tiny model has no end-of-sequence token: the value's last token ends the lane."""
    params = SamplingParams(temperature=0.0, max_tokens=160)
    seq = make_engine().generate(PROMPT, params, lanes(1), schema=json.dumps(ANSWER)).sequences[0]
    assert seq.finish_reason == "stop"
    jsonschema.validate(json.loads(seq.text), ANSWER)
    assert seq.num_generated == len(seq.text.encode())  # a token a byte, none past the "}"


def test_max_tokens_still_binds(make_engine: Callable[..., Engine]) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 50}}, "required": ["s"]}
    params = SamplingParams(temperature=1.0, max_tokens=12)
    request = make_engine().generate(PROMPT, params, lanes(3, 12), schema=json.dumps(schema))
    for seq in request.sequences:
        assert (seq.finish_reason, seq.num_generated) == ("length", 12)
        assert seq.text.startswith('{"s": "')
        with pytest.raises(ValueError):
            json.loads(seq.text)  # a cut value: the extractor gives no answer


def _boosted(engine: Engine, ids: list[int]) -> None:
    """Make `ids` the model's favourites at every step, far above any other token."""
    logits = engine.model.logits
    bias = torch.zeros(TINY.vocab_size)
    bias[ids] = 1000.0
    engine.model.logits = lambda hidden: logits(hidden) + bias  # type: ignore[method-assign]


def test_ids_that_are_no_token_are_never_drawn(make_engine: Callable[..., Engine]) -> None:
    """The tiny model's ids 256-259 have no text, and 256 is the end the grammar library is told
    of (the model has none): the model prefers them, the mask leaves a digit to draw instead."""
    engine = make_engine()
    _boosted(engine, [256, 257, 258, 259])
    params = SamplingParams(temperature=0.0, max_tokens=20)
    seq = engine.generate(PROMPT, params, lanes(1, 20), schema='{"type": "integer"}').sequences[0]
    assert (seq.finish_reason, seq.num_generated) == ("length", 20)  # an integer never ends
    assert seq.text.lstrip("-").isdigit() and max(seq.output_ids) < 256, seq.output_ids
    free = make_engine()
    _boosted(free, [256, 257, 258, 259])
    assert set(free.generate(PROMPT, params, lanes(1, 20)).sequences[0].output_ids) <= {256, 257, 258, 259}


def test_end_of_sequence_waits_for_a_whole_value(make_engine: Callable[..., Engine]) -> None:
    """A model that would end at once (its EOS always likeliest) writes a whole value first."""
    tokenizer = byte_tokenizer()
    from tokenizers import AddedToken

    tokenizer.backend.add_tokens([AddedToken("<|end|>", special=True, normalized=False)])
    args = dataclasses.replace(TINY, eos_token_ids=(256,))
    cpu = torch.device("cpu")
    engine = Engine(
        build_model(tiny_checkpoint(0, args), cpu, torch.float32), num_blocks=256, tokenizer=tokenizer
    )
    _boosted(engine, [256])
    params = SamplingParams(temperature=0.0, max_tokens=20)
    alone = engine.generate(PROMPT, params, lanes(1, 20)).sequences[0]
    assert (alone.finish_reason, alone.text) == ("stop", "")
    held = engine.generate(PROMPT, params, lanes(2, 20), schema=json.dumps(ANSWER)).sequences
    for seq in held:  # the "}" leaves nothing but the end to follow: the lane stops there
        assert seq.finish_reason == "stop"
        jsonschema.validate(json.loads(seq.text), ANSWER)
    number = engine.generate(PROMPT, params, lanes(1, 20), schema='{"type": "integer"}').sequences[0]
    assert number.finish_reason == "stop"  # one digit is a whole integer: the EOS may follow
    assert number.text.lstrip("-").isdigit() and len(number.output_ids) == len(number.text)


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ("{not json", "schema: not JSON text"),
        ("[1, 2]", "schema: a JSON Schema is an object, not an array"),
        ('{"type": "frog"}', "schema: "),
        ('{"type": "string", "minLength": 5, "maxLength": 2}', "schema: "),
        ('{"type": "string", "pattern": "(("}', "schema: "),
        ('{"$ref": "#/nowhere"}', "schema: "),
    ],
)
def test_a_schema_that_cannot_compile_is_one_config_error_line(
    make_engine: Callable[..., Engine], schema: str, says: str
) -> None:
    engine = make_engine()
    with pytest.raises(ConfigError) as caught:
        engine.add_request(PROMPT, SamplingParams(), lanes(2), schema=schema)
    message = str(caught.value)
    assert message.startswith(says) and "\n" not in message and len(message) > len("schema: ")
    assert not engine.has_work()  # nothing was queued

    async def main() -> None:
        backend = EngineBackend(engine=engine)
        request = SampleRequest("x", SamplingParams(max_tokens=4), tuple(lanes(2, 4)), schema=schema)
        with pytest.raises(ConfigError, match=r"^schema: "):
            await sample_all(backend, request)
        assert not engine.has_work()

    anyio.run(main)


def test_a_lane_held_to_nothing_decodes_as_alone_beside_a_held_one(
    make_engine: Callable[..., Engine],
) -> None:
    params = SamplingParams(temperature=0.9, top_k=30, max_tokens=24)
    alone = make_engine().generate(PROMPT, params, [LaneRequest(0, 7, 24)]).sequences[0]
    engine = make_engine()
    held = engine.add_request(PROMPT[::-1], params, lanes(4, 24), schema=json.dumps(TOOL_CALL))
    free = engine.add_request(PROMPT, params, [LaneRequest(0, 7, 24)])
    while not (held.finished and free.finished):
        engine.step()
    assert free.sequences[0].output_ids == alone.output_ids


def test_sample_and_stream_hold_every_lane(make_engine: Callable[..., Engine]) -> None:
    schema = json.dumps(TOOL_CALL)
    request = SampleRequest(
        "The call: ", SamplingParams(temperature=1.0, max_tokens=160), tuple(lanes(4)), schema=schema
    )

    async def main() -> tuple[list[Sample], dict[int, str], list[Sample]]:
        backend = EngineBackend(engine=make_engine())
        sampled = await sample_all(backend, request)
        deltas: dict[int, str] = {}
        streamed: list[Sample] = []
        async for item in backend.stream(request):
            if isinstance(item, TextDelta):
                deltas[item.lane] = deltas.get(item.lane, "") + item.text
            else:
                streamed.append(item)
        return [s for s in sampled if isinstance(s, Sample)], deltas, streamed

    sampled, deltas, streamed = anyio.run(main)
    assert len(sampled) == len(streamed) == 4
    for sample in [*sampled, *streamed]:
        jsonschema.validate(json.loads(sample.text), TOOL_CALL)
        assert sample.finish_reason == "stop"
    assert {s.lane: s.text for s in streamed} == deltas
    assert sorted(s.text for s in streamed) == sorted(s.text for s in sampled)  # same seeds


def test_compiled_schemas_are_kept_up_to_a_bound() -> None:
    from lanefold.backends.engine._grammar import Grammars

    grammars = Grammars(byte_tokenizer(), TINY.vocab_size, (), capacity=2)
    a, b, c = ('{"type": "integer"}', '{"type": "boolean"}', '{"type": "null"}')
    first = grammars.compile(a)
    grammars.compile(b)
    assert grammars.compile(a) is first  # a hit, and now the most recent
    grammars.compile(c)  # b, the least recent, goes
    assert len(grammars) == 2 and grammars.compile(a) is first
    assert grammars.compile(b) is not None and len(grammars) == 2


def test_an_engine_without_a_tokenizer_refuses_a_schema() -> None:
    model = build_model(tiny_checkpoint(0), torch.device("cpu"), torch.float32)
    engine = Engine(model, num_blocks=64, tokenizer=None)
    with pytest.raises(ConfigError, match=r"^schema: the engine has no tokenizer"):
        engine.add_request(PROMPT, SamplingParams(), lanes(1), schema='{"type": "integer"}')


def _bounded_tool_call() -> dict[str, Any]:
    """A tool call SmolLM2 is asked for: strings and numbers bounded, so every lane's value
    ends within its allotment whatever the machine's rounding makes it write."""
    text = {"type": "string", "maxLength": 40}
    number = {"type": "integer", "minimum": -(10**6), "maximum": 10**6}
    return {
        "anyOf": [
            _tool("get_weather", {"city": text, "unit": {"enum": ["celsius", "fahrenheit"]}}, ["city"]),
            _tool("add", {"a": number, "b": number}, ["a", "b"]),
            _tool("search", {"query": text}, ["query"]),
        ]
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("question", "schema"),
    [
        (
            "You may call get_weather(city, unit), add(a, b) or search(query). Answer with the call "
            'as JSON, {"name": ..., "arguments": {...}}. What is the weather in Paris?',
            _bounded_tool_call(),
        ),
        (
            'What is 7 + 8? Answer as JSON, {"answer": <the number>}.',
            ANSWER,
        ),
    ],
    ids=["tool call", "answer"],
)
def test_smollm2_holds_every_lane_of_a_forked_wave(
    smollm2: Engine, question: str, schema: dict[str, Any]
) -> None:
    assert smollm2.tokenizer is not None
    prompt = smollm2.tokenizer.encode(question, chat=True)
    params = SamplingParams(temperature=0.8, max_tokens=128)
    request = smollm2.generate(prompt, params, lanes(LANES, 128), schema=json.dumps(schema))
    for seq in request.sequences:
        assert seq.finish_reason == "stop", seq.text
        jsonschema.validate(json.loads(seq.text), schema)
    assert request.metrics.prompt_tokens_computed <= len(prompt)  # one prefill for the 8 forks
    assert smollm2.pool.num_free == smollm2.pool.num_blocks
