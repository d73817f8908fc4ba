"""What a gateway request says about calls and structured answers, and the reply made of them.

A request's `tools` and `tool_choice` become the run's tools (`Session.run(tools=...)`), read by
`[extract] method = "tool_call"`; `response_format` (`json_schema`, `json_object`) becomes
`method = "json"` with its schema. The chat's turns, an agent's calls and its tools' results
among them, become `ChatMessage`s: the turns before the last user turn (the question) and the
turns after it. A winning call goes back as `message.tool_calls` with `finish_reason:
"tool_calls"`, a winning value as the content (its canonical JSON), so a client's parser reads
what the lanes voted on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema
import jsonschema.exceptions

from lanefold.primitives import (
    ChatMessage,
    ConfigError,
    MessageToolCall,
    ToolCall,
    ToolSpec,
    canonical_json,
    check_tool_choice,
    parse_tools,
)
from lanefold.serve._guard import HTTPError
from lanefold.serve._wire import ChatMessageIn

__all__ = ("Answering", "Turns", "answering", "reply_message", "turns_of")


@dataclass(frozen=True, slots=True)
class Answering:
    """How a request's lanes answer: the run's `tools` and `tool_choice`, and the `[extract]`
    that replaces the loop's (None: the loop's own, a text answer)."""

    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    extract: Mapping[str, Any] | None = None

    @property
    def calls(self) -> bool:
        """Whether a lane's answer is a call (and the reply's winner goes as `tool_calls`)."""
        return self.extract is not None and self.extract.get("method") == "tool_call"

    @property
    def values(self) -> bool:
        """Whether a lane's answer is a JSON value (`response_format`), served as its content."""
        return self.extract is not None and self.extract.get("method") == "json"


_CHOICES = 'expected "auto", "required", "none" or {"type": "function", "function": {"name": ...}}'


def _bad(param: str, message: str) -> HTTPError:
    return HTTPError(400, f"{param}: {message}", param=param)


def _choice(raw: object, tools: Sequence[ToolSpec]) -> str | None:
    """`tool_choice` as a word or `{"type": "function", "function": {"name": ...}}`."""
    if raw is None:
        return None
    if isinstance(raw, Mapping):
        function = raw.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if raw.get("type") != "function" or not isinstance(name, str):
            raise _bad("tool_choice", _CHOICES)
        raw = name
    if not isinstance(raw, str):
        raise _bad("tool_choice", f"expected a string or an object, got {type(raw).__name__}")
    try:
        check_tool_choice(raw, tools)
    except ConfigError as exc:
        raise HTTPError(400, str(exc), param="tool_choice") from None
    return raw


def _response_format(raw: object) -> Mapping[str, Any] | None:
    """The `[extract]` a `response_format` asks for (None: text)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("type"), str):
        raise _bad(
            "response_format", 'expected an object whose "type" is "text", "json_object" or "json_schema"'
        )
    kind = raw["type"]
    if kind == "text":
        return None
    if kind == "json_object":  # JSON mode: any object
        return {"method": "json", "schema": {"type": "object"}}
    if kind != "json_schema":
        raise _bad("response_format.type", f'{kind!r} is none of "text", "json_object", "json_schema"')
    spec = raw.get("json_schema")
    schema = spec.get("schema", {}) if isinstance(spec, Mapping) else None
    if not isinstance(schema, Mapping):
        raise _bad("response_format.json_schema.schema", "expected a JSON Schema object")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.exceptions.SchemaError as exc:
        where = "".join(f".{p}" for p in exc.path)
        why = " ".join(exc.message.split())[:160]
        raise _bad(f"response_format.json_schema.schema{where}", f"not a JSON Schema ({why})") from None
    return {"method": "json", "schema": dict(schema)}


def answering(data: Mapping[str, Any]) -> Answering:
    """A chat request's `tools`, `tool_choice`, `parallel_tool_calls` and `response_format`,
    checked (400 naming the field). A choice of "none" keeps the loop's text answer (the tools
    still travel, as to an OpenAI server); `parallel_tool_calls` may be given either way, as a
    loop answers with one call, the lanes' winner."""
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls", f"expected a boolean, got {type(parallel).__name__}")
    raw_tools = data.get("tools")
    try:
        tools = parse_tools(raw_tools) if raw_tools not in (None, []) else ()
    except ConfigError as exc:
        param = str(exc).split(":", 1)[0]
        raise HTTPError(400, str(exc), param=param) from None
    choice = _choice(data.get("tool_choice"), tools)
    value = _response_format(data.get("response_format"))
    if tools and choice != "none":
        if value is not None:
            raise _bad(
                "response_format",
                "with tools a loop's lanes answer with calls: send tools or a response_format, "
                'or tool_choice "none"',
            )
        return Answering(tools, choice or "auto", {"method": "tool_call"})
    return Answering(tools, choice, value)


@dataclass(frozen=True, slots=True)
class Turns:
    """A chat as a run takes it: its `question` (the last user turn), the turns `before` it
    and the turns `after` it (an agent's calls and their tools' results since it asked)."""

    question: str
    before: tuple[ChatMessage, ...]
    after: tuple[ChatMessage, ...]


def _message(index: int, message: ChatMessageIn) -> ChatMessage:
    role = "system" if message.role == "developer" else message.role
    made = message.tool_calls or ()
    calls = tuple(MessageToolCall(c.id, c.function.name, c.function.arguments) for c in made)
    if calls and role != "assistant":
        raise _bad(f"messages.{index}.tool_calls", "only an assistant turn makes calls")
    if role == "tool" and not message.tool_call_id:
        raise _bad(f"messages.{index}.tool_call_id", "a tool turn names the call it answers")
    if role != "tool":
        return ChatMessage(role, message.text(), calls)
    return ChatMessage(role, message.text(), (), message.tool_call_id, message.name)


def turns_of(messages: Sequence[ChatMessageIn]) -> Turns:
    """A chat's messages split at its last user turn; the turns after it may only be the
    assistant's calls and the tools' results (400 otherwise, or without a user turn)."""
    turns = [_message(i, m) for i, m in enumerate(messages)]
    last = max((i for i, t in enumerate(turns) if t.role == "user"), default=None)
    if last is None or (last != len(turns) - 1 and turns[-1].role != "tool"):
        raise _bad("messages", "the last message must be the user's question or a tool's result")
    after = tuple(turns[last + 1 :])
    if any(t.role not in ("assistant", "tool") for t in after):
        raise _bad(
            "messages", "after the user's question only the assistant's calls and their results may come"
        )
    if not turns[last].content.strip():
        raise _bad("messages", "the last user message is empty")
    return Turns(turns[last].content, tuple(turns[:last]), after)


def _call_id(run_id: str, index: int) -> str:
    """A reply's call id: a function of the run and the choice, so a replay says the same."""
    return "call_" + hashlib.sha256(f"{run_id}\0{index}".encode()).hexdigest()[:24]


def reply_message(
    answering: Answering, answer: str | None, text: str, finish: str | None, run_id: str, index: int
) -> tuple[dict[str, Any], str]:
    """A chat choice's `message` and `finish_reason`: a call as `tool_calls` (its arguments as
    canonical JSON), a JSON value as the content in canonical JSON, else the lane's text."""
    call = ToolCall.from_answer(answer) if answering.calls else None
    if call is not None:
        function = {"name": call.name, "arguments": canonical_json(call.arguments)}
        tool_call = {"id": _call_id(run_id, index), "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [tool_call]}, "tool_calls"
    if answering.values and answer is not None and finish in ("stop", None):
        return {"role": "assistant", "content": answer}, "stop"
    return {"role": "assistant", "content": text}, finish or "stop"
