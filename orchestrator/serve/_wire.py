"""Request bodies the served app accepts, the chat-messages-to-prompt flattening, and the
logprobs shapes it answers with."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanefold.primitives import MAX_LANE_TOKENS, ChatMessage, Sample, flatten_chat

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

__all__ = (
    "MAX_CHAT_TOP_LOGPROBS",
    "MAX_COMPLETION_LOGPROBS",
    "ChatBody",
    "ChatMessageIn",
    "CompletionBody",
    "StreamOptions",
    "TextFormat",
    "TextPart",
    "chat_logprobs",
    "completion_logprobs",
    "flatten_messages",
    "refusal",
)

MAX_COMPLETION_LOGPROBS = 5  # /v1/completions' `logprobs`, as OpenAI's legacy API
MAX_CHAT_TOP_LOGPROBS = 20  # /v1/chat/completions' `top_logprobs`, as OpenAI and vLLM
# JSON has no -inf: a token the model rules out is told at this logprob, as vLLM does.
_FLOOR = -9999.0
# Types as the JSON says them, as OpenAI checks them: "16" is a string, not an integer, and a
# NaN or Infinity (which Python's JSON parser lets through) is no number a knob can take.
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
_JSON_TYPES = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
    type(None): "null",
}
_EXPECTED = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
}
_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "TextPart", "TextFormat", "StreamOptions"})


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk carrying the request's usage."""

    model_config = _STRICT

    include_usage: bool = False


class _Body(BaseModel):
    # Unknown fields are refused, as OpenAI does: a silently ignored knob is a wrong answer.
    model_config = _STRICT

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_LANE_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # vLLM's extension; -1 and 0 are "off"
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for abuse tracking: accepted, not used
    ignore_eos: bool = False  # vLLM's and llama.cpp's extension: decode through end-of-sequence
    # Knobs common clients send at their no-op values: accepted there, refused anywhere else.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float) -> float:
        if value != 0:
            raise ValueError("this server supports only 0 (no penalty)")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("this server supports only {} (no bias)")
        return value

    def stops(self) -> tuple[str, ...]:
        """`stop` as a tuple, whichever form it came in."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionBody(_Body):
    """A `/v1/completions` request; one prompt (a list of one is accepted)."""

    prompt: str | list[str]
    # Each token's logprob and, from 1 on, that many most likely tokens at each position
    # (OpenAI's legacy API allows up to 5).
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: Literal[False] = False
    best_of: Literal[1] | None = None
    suffix: None = None


class TextPart(BaseModel):
    """A text part of a chat message's content list."""

    model_config = _STRICT

    type: Literal["text"]
    text: str


class TextFormat(BaseModel):
    """`response_format`: plain text only (no JSON mode or schema)."""

    model_config = _STRICT

    type: Literal["text"]


class ChatMessageIn(BaseModel):
    """One chat message; content as a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The message's text, parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_Body):
    """A `/v1/chat/completions` request."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)  # as OpenAI
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_LANE_TOKENS)
    response_format: TextFormat | None = None


def refusal(errors: Sequence[ErrorDetails]) -> tuple[str, str | None]:
    """(message, param) for a request body's validation errors, in words a client can act on:
    the field, then what it got where the type is wrong, or that a NaN is not a number.

    Of the errors about the first field wrong, the one reaching deepest is told: `"stop": [1]`
    is about the 1 in the list (`stop.0`), not about `stop` not being a string.
    """
    first = errors[0]["loc"][:1]
    error = max((e for e in errors if e["loc"][:1] == first), key=lambda e: len(_path(e)))
    param = ".".join(_path(error)) or None
    value = error.get("input")
    where = f"{param}: " if param else ""
    if error["type"] == "finite_number" and isinstance(value, float):
        if math.isnan(value):
            return f"{where}NaN is not a number", param
        return f"{where}{'-' if value < 0 else ''}Infinity is not a finite number", param
    expected = _EXPECTED.get(error["type"])
    if expected is not None:
        got = _JSON_TYPES.get(type(value), type(value).__name__)
        return f"{where}{expected} was expected, got {got} ({json.dumps(value)[:40]})", param
    return f"{where}{error['msg']}", param


def _path(error: ErrorDetails) -> list[str]:
    # pydantic names the member of a union it tried (`stop.str`); the client wrote no such key.
    return [
        str(part)
        for part in error["loc"]
        if not (isinstance(part, str) and (part in _TYPE_TAGS or "[" in part))
    ]


def flatten_messages(messages: Sequence[tuple[str, str]]) -> str:
    """Chat messages as one prompt, for a backend that cannot template `SampleRequest.messages`.

    A lone user message passes through verbatim; any other conversation becomes a role-tagged
    transcript ending in an open assistant turn (`lanefold.primitives.flatten_chat`, the rule
    a backend without a template follows too).
    """
    return flatten_chat([ChatMessage(role, content) for role, content in messages])


def completion_logprobs(sample: Sample, top: int = 0) -> dict[str, Any] | None:
    """A completion choice's `logprobs` in OpenAI's legacy shape.

    With `top` (the request's `logprobs`) from 1 on, `top_logprobs` holds a {token: logprob}
    object per token: the `top` most likely there and the sampled token (so up to top + 1, as
    OpenAI). It is null where none were asked for, or the backend computes none.
    """
    if sample.logprobs is None:
        return None
    tokens = list(sample.tokens) if sample.tokens is not None else None
    offsets = None
    if tokens is not None:
        offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    alternatives = None
    if top and sample.top_logprobs is not None and tokens is not None:
        alternatives = []
        for token, value, step in zip(tokens, sample.logprobs, sample.top_logprobs, strict=False):
            entry: dict[str, float] = {}
            for text, lp in (*step[:top], (token, value)):  # two ids of one text: the likelier
                entry.setdefault(text, max(lp, _FLOOR))
            alternatives.append(entry)
    return {
        "tokens": tokens,
        "token_logprobs": [max(v, _FLOOR) for v in sample.logprobs],
        "top_logprobs": alternatives,
        "text_offset": offsets,
    }


def chat_logprobs(sample: Sample, top: int = 0) -> dict[str, Any] | None:
    """A chat choice's `logprobs` in OpenAI's shape: one entry per token, each with its `top`
    most likely tokens (`top_logprobs`: [] where none were asked for or the backend computes
    none)."""
    if sample.logprobs is None:
        return None
    tokens = sample.tokens or ("",) * len(sample.logprobs)
    steps = sample.top_logprobs if top and sample.top_logprobs is not None else ()
    content = [
        {
            "token": token,
            "logprob": max(value, _FLOOR),
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": text, "logprob": max(lp, _FLOOR), "bytes": list(text.encode())}
                for text, lp in (steps[i][:top] if i < len(steps) else ())
            ],
        }
        for i, (token, value) in enumerate(zip(tokens, sample.logprobs, strict=False))
    ]
    return {"content": content, "refusal": None}
