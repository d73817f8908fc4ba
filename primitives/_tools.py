"""Tools a run may carry, and the call a lane makes: what crosses from a caller to a backend.

A tool is a function the model may call, as OpenAI's `tools` describe it: a name, a
description and a JSON Schema of its parameters. A run's tools reach every sampled lane's
`SampleRequest` (an OpenAI-compatible server takes them natively); a backend that constrains
decoding gets one schema instead, `tools_schema`'s: the call as the lane's whole text,
`{"name": <one of the tools>, "arguments": <an object valid under its parameters>}`.
Everything here is hashable (schemas as JSON text), since requests are cache keys.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import jsonschema.exceptions

from lanefold.primitives._errors import ConfigError

__all__ = ("TOOL_CHOICES", "ToolCall", "ToolSpec", "check_tool_choice", "parse_tools", "tools_schema")

TOOL_CHOICES = ("auto", "required", "none")
"""The `tool_choice` words (OpenAI's); any other choice is the name of one of the run's tools."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
_EMPTY_PARAMETERS = '{"properties":{},"type":"object"}'


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: a function's `name`, its `description` and its `parameters` (a JSON Schema
    of its arguments object, as JSON text so that a request holding it stays hashable)."""

    name: str
    description: str = ""
    parameters: str = _EMPTY_PARAMETERS

    def parameters_schema(self) -> dict[str, Any]:
        """The parameters' JSON Schema as a dict."""
        schema: dict[str, Any] = json.loads(self.parameters)
        return schema

    def to_openai(self) -> dict[str, Any]:
        """The tool as OpenAI's `tools` list holds it (and as `run.started` records it)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters_schema()
        return {"type": "function", "function": function}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A lane's call, parsed: the function's `name` and its `arguments` (the JSON object, with
    the defaults its schema gives filled in). A verifier may ask for it (see `CallableVerifier`)."""

    name: str
    arguments: Mapping[str, Any]

    @classmethod
    def from_answer(cls, answer: str | None) -> ToolCall | None:
        """The call a `tool_call` answer (its canonical text) holds; None for any other answer."""
        if not answer or not answer.startswith("{"):
            return None
        try:
            value = json.loads(answer)
        except ValueError:
            return None
        if (
            isinstance(value, dict)
            and set(value) == {"name", "arguments"}
            and isinstance(value["name"], str)
            and isinstance(value["arguments"], dict)
        ):
            return cls(value["name"], value["arguments"])
        return None


def parse_tools(raw: object, *, where: str = "tools") -> tuple[ToolSpec, ...]:
    """Tools from what a caller gives: a list of OpenAI tools (`{"type": "function",
    "function": {...}}`), of bare functions (`{"name", "description", "parameters"}`) or of
    `ToolSpec`s. Names must be unique and OpenAI's (letters, digits, `_`, `-`, at most 64), and
    each `parameters` a JSON Schema of an object; ConfigError naming `where[i]` otherwise."""
    if isinstance(raw, str | bytes) or not isinstance(raw, Sequence):
        raise ConfigError(f"{where}: expected a list of tools, got {type(raw).__name__}")
    tools: list[ToolSpec] = []
    for index, item in enumerate(raw):
        if isinstance(item, ToolSpec):
            _check_name(item.name, f"{where}[{index}]")
        tools.append(item if isinstance(item, ToolSpec) else _tool(item, f"{where}[{index}]"))
    names = [tool.name for tool in tools]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ConfigError(f"{where}[{index}]: a second tool named {name!r}")
    return tuple(tools)


def _tool(item: object, where: str) -> ToolSpec:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: expected an object, got {type(item).__name__}")
    function: object = item
    if "function" in item or "type" in item:
        if item.get("type", "function") != "function":
            raise ConfigError(f"{where}.type: only 'function' tools are supported, got {item.get('type')!r}")
        function, where = item.get("function"), f"{where}.function"
        if not isinstance(function, Mapping):
            raise ConfigError(f"{where}: expected an object with the function's name and parameters")
    assert isinstance(function, Mapping)
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (name, description, parameters)")
    name, description = function.get("name"), function.get("description", "")
    if not isinstance(name, str):
        raise ConfigError(f"{where}.name: expected the function's name, a string")
    _check_name(name, where)  # named where the client wrote it (`tools[0].function.name`)
    if not isinstance(description, str):
        raise ConfigError(f"{where}.description: expected a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    return ToolSpec(name, description, _parameters(parameters, f"{where}.parameters"))


def _check_name(name: str, where: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"{where}.name: {name!r} is not a function name (letters, digits, _ and -, 1 to 64)"
        )


def _parameters(schema: object, where: str) -> str:
    if not isinstance(schema, Mapping):
        raise ConfigError(f"{where}: expected a JSON Schema object, got {type(schema).__name__}")
    if schema.get("type", "object") != "object":
        raise ConfigError(f"{where}.type: a tool's arguments are an object, not {schema.get('type')!r}")
    check_schema(schema, where)
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_schema(schema: Mapping[str, Any], where: str) -> None:
    """ConfigError naming `where` unless `schema` is a JSON Schema (draft 2020-12)."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        path = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise ConfigError(f"{where}{path}: not a JSON Schema ({_one_line(exc.message)})") from None


def check_tool_choice(choice: str | None, tools: Sequence[ToolSpec], *, where: str = "tool_choice") -> None:
    """A `tool_choice` is one of `TOOL_CHOICES` or the name of one of `tools`; a choice
    without tools is refused (ConfigError naming `where`)."""
    if choice is None:
        return
    if not tools:
        raise ConfigError(f"{where}: {choice!r} chooses among the run's tools, and it has none")
    if choice not in TOOL_CHOICES and choice not in {tool.name for tool in tools}:
        names = ", ".join(tool.name for tool in tools)
        raise ConfigError(f"{where}: {choice!r} is none of auto, required, none, or a tool's name ({names})")


def tools_schema(tools: Sequence[ToolSpec], choice: str | None = None) -> str | None:
    """The JSON Schema (as JSON text) a lane's whole text meets when it calls one of `tools`:
    an `anyOf` of one object per tool, `name` its `const` and `arguments` its parameters,
    nothing else at the top (`additionalProperties: false`). A choice naming a tool keeps that
    one; `"none"` or no tools give None (nothing to call)."""
    if choice == "none":
        return None
    chosen = [tool for tool in tools if choice in (None, *TOOL_CHOICES) or tool.name == choice]
    if not chosen:
        return None
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters_schema()},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in chosen
    ]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    return json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _one_line(text: str, limit: int = 160) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
