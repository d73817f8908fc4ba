"""Structured answers: a lane's JSON value or tool call, checked, and written in one canonical form.

`[extract] method = "json"` reads a JSON value from a lane's text (checked against `[extract]
schema` where one is given), `method = "tool_call"` a call of one of the run's tools. Either is
the lane's answer as its canonical JSON text, so that answers meaning the same are the same
string for every reducer, the vote, the log and resume: keys sorted, numbers normalised
(`1.0`, `1e0` and `1` are `1`; `0.50` is `0.5`), no spaces outside strings, the whitespace and
case inside strings kept, and the defaults a schema gives for absent properties filled in.
What is not a valid value or call is no answer, with the reason (`AnswerRead.reason`):
never an exception, since one lane's bad output must not sink a wave.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import jsonschema
import jsonschema.exceptions

from lanefold.primitives._tools import ToolSpec

__all__ = ("AnswerRead", "canonical_json", "describe_answer", "fill_defaults", "read_structured")

_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*\Z", re.DOTALL)
_EXPONENT_SPAN = 30  # past 1e30 (or below 1e-30) a number is written with an exponent, 1E+40


@dataclass(frozen=True, slots=True)
class AnswerRead:
    """What the extractor read in a lane's text: its `answer`, or None and, for a structured
    answer, the `reason` (recorded as `lane.completed`'s `answer_error`)."""

    answer: str | None
    reason: str | None = None


def canonical_json(value: Any) -> str:
    """`value` (JSON's types; numbers as int, float or Decimal) as its canonical JSON text:
    keys sorted, numbers normalised, no spaces outside strings, strings as they are."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float | Decimal):
        return _number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        items = sorted((str(k), v) for k, v in value.items())
        return (
            "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{canonical_json(v)}" for k, v in items) + "}"
        )
    if isinstance(value, Sequence):
        return "[" + ",".join(canonical_json(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _number(value: int | float | Decimal) -> str:
    number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not number.is_finite():
        raise ValueError(f"not a JSON number: {value!r}")
    if number.is_zero():
        return "0"
    number = number.normalize()
    if abs(number.adjusted()) > _EXPONENT_SPAN:
        return str(number)  # e.g. 1E+40: JSON, and short
    return format(number, "f")


def _plain(value: Any) -> Any:
    """`value` as jsonschema checks it: a whole Decimal an int (3.0 is an integer, as JSON
    Schema says), any other a float."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def fill_defaults(value: Any, schema: Mapping[str, Any]) -> Any:
    """`value` with each absent property that `schema` gives a `default` for filled in, along
    `properties` and `items` at any depth (not through `$ref`, `anyOf` and the like: which
    branch applies is not known before validation)."""
    if isinstance(value, dict):
        properties = schema.get("properties")
        if isinstance(properties, Mapping):
            for key, sub in properties.items():
                if not isinstance(sub, Mapping):
                    continue
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
                elif key in value:
                    value[key] = fill_defaults(value[key], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [fill_defaults(item, schema["items"]) for item in value]
    return value


def read_structured(
    text: str,
    *,
    method: str,
    schema: str | None = None,
    tools: Sequence[ToolSpec] = (),
    tool_choice: str | None = None,
) -> AnswerRead:
    """The answer of a lane's `text` under `method` "json" (a value, valid under `schema`
    where given) or "tool_call" (a call of one of `tools`, its arguments valid under that
    tool's parameters; a `tool_choice` naming a tool admits that one only). The value is the
    whole text (a Markdown code fence around it allowed), else the last JSON object (for
    "json", or array) in it; for a call, an object `{"name": ..., "arguments": {...}}`. Under
    `tool_choice` "auto" a text with no call in it (no object with a `name`) is the model's
    reply instead, the whole text its answer."""
    found = _value_in(text, objects_only=method == "tool_call")
    if method == "tool_call" and tool_choice == "auto" and _prose(found):
        # "auto" lets the model answer instead of calling: a text with no call in it is its
        # reply, the whole text (a call attempted and invalid stays no answer, with its reason)
        reply = text.strip()
        return AnswerRead(reply) if reply else AnswerRead(None, "the text is empty")
    if isinstance(found, str):
        return AnswerRead(None, found)
    try:
        if method == "tool_call":
            return _call(found[0], tools, tool_choice)
        return _value(found[0], schema)
    except RecursionError:
        return AnswerRead(None, "the value nests too deep to read")


def _value(value: Any, schema: str | None) -> AnswerRead:
    parsed = json.loads(schema) if schema is not None else None
    if parsed is not None:
        value = fill_defaults(value, parsed)
        problem = _invalid(value, parsed, "")
        if problem is not None:
            return AnswerRead(None, problem)
    return AnswerRead(canonical_json(value))


def _value_in(text: str, *, objects_only: bool) -> tuple[Any] | str:
    """The JSON value in `text` (in a one-element tuple), or why there is none."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced is not None:
        body = fenced.group(1).strip()
    if not body:
        return "the text is empty"
    decoder = json.JSONDecoder(parse_float=Decimal, parse_constant=_no_constant)
    try:
        value, end = decoder.raw_decode(body)
        if body[end:].strip():
            raise ValueError("extra text after the value")
    except (ValueError, RecursionError):
        value = _last_embedded(body, decoder, "{" if objects_only else "{[")
        if value is None:
            return "no JSON value in the text" if not objects_only else "no JSON object in the text"
    if objects_only and not isinstance(value, dict):
        return f"the call is not a JSON object but {_kind(value)}"
    return (value,)


def _last_embedded(text: str, decoder: json.JSONDecoder, openers: str) -> Any:
    """The last top-level JSON object (or array) inside prose, None where there is none."""
    last: Any = None
    index = min((i for i in (text.find(c) for c in openers) if i != -1), default=-1)
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except (ValueError, RecursionError):
            end = index + 1
        else:
            last = value
        nexts = [i for i in (text.find(c, end) for c in openers) if i != -1]
        index = min(nexts, default=-1)
    return last


def _prose(found: tuple[Any] | str) -> bool:
    """Whether what `_value_in` found is no call attempted: no object, or one without `name`."""
    return isinstance(found, str) or not (isinstance(found[0], dict) and "name" in found[0])


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _call(value: dict[str, Any], tools: Sequence[ToolSpec], choice: str | None) -> AnswerRead:
    extra = sorted(set(value) - {"name", "arguments"})
    if extra:
        return AnswerRead(None, f"the call has a key {extra[0]!r} besides name and arguments")
    name = value.get("name")
    if not isinstance(name, str):
        return AnswerRead(None, "the call has no function name (a string under 'name')")
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return AnswerRead(None, f"the call's arguments are {_kind(arguments)}, not an object")
    allowed = [t for t in tools if choice in (None, "auto", "required", "none") or t.name == choice]
    tool = next((t for t in allowed if t.name == name), None)
    if tool is None:
        names = ", ".join(t.name for t in allowed) or "none"
        return AnswerRead(None, f"the call names {name!r}, which is not a tool here ({names})")
    parameters = tool.parameters_schema()
    arguments = fill_defaults(arguments, parameters)
    problem = _invalid(arguments, parameters, "arguments")
    if problem is not None:
        return AnswerRead(None, problem)
    return AnswerRead(canonical_json({"name": name, "arguments": arguments}))


def _invalid(value: Any, schema: Mapping[str, Any], root: str) -> str | None:
    """Why `value` is not valid under `schema` (the first error, at its path), or None."""
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(_plain(value)))
    if error is None:
        return None
    path = root + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    message = " ".join(error.message.split())
    if len(message) > 160:
        message = message[:159] + "…"
    return f"{path.lstrip('.') or 'the value'}: {message}"


def describe_answer(answer: str) -> str:
    """An answer as a person reads it: a call as `name(key=value, ...)` (values in JSON), a
    JSON object or array with a space after each `:` and `,`, any other answer as it is."""
    if not answer or answer[0] not in "{[":
        return answer
    try:
        value = json.loads(answer, parse_float=Decimal)
    except ValueError:
        return answer
    if (
        isinstance(value, dict)
        and set(value) == {"name", "arguments"}
        and isinstance(value["arguments"], dict)
    ):
        listed = ", ".join(f"{k}={_spaced(v)}" for k, v in sorted(value["arguments"].items()))
        return f"{value['name']}({listed})"
    return _spaced(value)


def _spaced(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(
                f"{json.dumps(k, ensure_ascii=False)}: {_spaced(v)}" for k, v in sorted(value.items())
            )
            + "}"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_spaced(v) for v in value) + "]"
    return canonical_json(value)
