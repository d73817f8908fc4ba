"""The wire format: request bodies out, pydantic-validated response bodies in.

Responses are validated with pydantic models rather than read with `.get()` chains, so a
body that does not have the shape the backend relies on is one clear `ValidationError`.
Unknown fields are ignored: servers add their own (timings, system_fingerprint, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lanefold.backends.openai._config import OpenAIConfig
from lanefold.backends.openai._usage import Tally
from lanefold.primitives import TOOL_CHOICES, ConfigError, SampleRequest, canonical_json
from lanefold.primitives import ChatMessage as Turn  # the wire has its own ChatMessage (a reply's)

__all__ = (
    "ChatResponse",
    "CompletionResponse",
    "WireChoice",
    "WireUsage",
    "build_body",
    "call_text",
    "output_fields",
    "parse_response",
)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ChatTopLogprob(_Wire):
    """One of the most likely tokens at a position of a chat choice."""

    token: str
    logprob: float


class ChatTokenLogprob(_Wire):
    """One sampled token of a chat choice's logprobs, and the most likely tokens there."""

    token: str | None = None
    logprob: float
    top_logprobs: list[ChatTopLogprob] | None = None


class ChatLogprobs(_Wire):
    """A chat choice's logprobs: one entry per sampled token."""

    content: list[ChatTokenLogprob] | None = None


class WireFunction(_Wire):
    """The function a tool call calls: its name and its arguments (JSON text, as OpenAI sends
    them; an object from a server that sends one)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class WireToolCall(_Wire):
    """One tool call of an assistant message."""

    function: WireFunction


class ChatMessage(_Wire):
    """The assistant message of a chat choice; `content` is null for tool calls."""

    content: str | None = None
    tool_calls: list[WireToolCall] | None = None


class ChatChoice(_Wire):
    """One choice of a chat completion."""

    index: int | None = Field(default=None, ge=0)
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class CompletionLogprobs(_Wire):
    """A text completion choice's logprobs (the legacy parallel-lists shape)."""

    tokens: list[str] | None = None
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[dict[str, float] | None] | None = None  # {token: logprob} per position


class CompletionChoice(_Wire):
    """One choice of a text completion."""

    index: int | None = Field(default=None, ge=0)
    text: str
    finish_reason: str | None = None
    logprobs: CompletionLogprobs | None = None


class PromptTokensDetails(_Wire):
    """Breakdown of the prompt tokens; `cached_tokens` were served from a prefix cache."""

    cached_tokens: int | None = Field(default=None, ge=0)


class WireUsage(_Wire):
    """Usage of one HTTP request, all of its choices together (as the server counted it)."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    prompt_tokens_details: PromptTokensDetails | None = None

    @property
    def cached_tokens(self) -> int:
        """Cached prompt tokens, 0 where the server does not say."""
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details is not None else 0


class ChatResponse(_Wire):
    """A `/chat/completions` response body."""

    choices: list[ChatChoice]
    usage: WireUsage | None = None


class CompletionResponse(_Wire):
    """A `/completions` response body."""

    choices: list[CompletionChoice]
    usage: WireUsage | None = None


@dataclass(frozen=True, slots=True)
class WireChoice:
    """A choice of either API, normalised. `token_count` is exact where logprobs give it."""

    index: int | None
    text: str
    finish_reason: str
    logprobs: tuple[float, ...] | None
    token_count: int | None
    tokens: tuple[str, ...] | None = None  # each token's text, where the server sent them all
    # The most likely tokens at each position, most likely first, where the server sent them
    # for every position (a completion's may include the sampled token beyond the N asked)
    top_logprobs: tuple[tuple[tuple[str, float], ...], ...] | None = None
    tool_calls: int = 0  # the calls the message held (its text is the first one's)

    def tally(self) -> Tally:
        """What this choice evidently holds, for usage apportioning."""
        return Tally(
            token_count=self.token_count,
            chars=len(self.text),
            utf8_bytes=len(self.text.encode()),
            hit_length=self.finish_reason == "length",
        )


def _finish(reason: str | None) -> str:
    # llama.cpp says "eos" in places; a missing reason is a natural stop.
    return "stop" if reason in (None, "eos") else reason


def _all_texts(tokens: list[str] | list[str | None] | None) -> tuple[str, ...] | None:
    if tokens is None or any(token is None for token in tokens):
        return None
    return tuple(token for token in tokens if token is not None)


def _likeliest_first(
    steps: list[list[tuple[str, float]] | None],
) -> tuple[tuple[tuple[str, float], ...], ...] | None:
    """Every position's alternatives sorted, most likely first; None unless every position
    has some (a server that sends none, or sends them for only part of the text)."""
    if not steps or any(not step for step in steps):
        return None
    return tuple(tuple(sorted(step, key=lambda pair: -pair[1])) for step in steps if step)


def call_text(call: WireToolCall) -> str:
    """A tool call as a lane's text: `{"name": ..., "arguments": {...}}` in canonical JSON (the
    form a `tool_call` answer is read from); arguments that are not a JSON object's text are
    kept as the string they are, for the extractor to refuse with its reason."""
    arguments: Any = call.function.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments, parse_float=Decimal) if arguments.strip() else {}
        except ValueError:
            pass  # not JSON: kept as the string it is
    return canonical_json({"name": call.function.name, "arguments": arguments})


def _from_chat(choice: ChatChoice) -> WireChoice:
    content = choice.logprobs.content if choice.logprobs is not None else None
    values = tuple(entry.logprob for entry in content) if content is not None else None
    top = None
    if content is not None:
        top = _likeliest_first(
            [
                None
                if entry.top_logprobs is None
                else [(alt.token, alt.logprob) for alt in entry.top_logprobs]
                for entry in content
            ]
        )
    calls = choice.message.tool_calls or []
    return WireChoice(
        index=choice.index,
        text=call_text(calls[0]) if calls else choice.message.content or "",
        finish_reason=_finish(choice.finish_reason),
        logprobs=values,
        token_count=len(content) if content is not None else None,
        tokens=_all_texts([entry.token for entry in content] if content is not None else None),
        top_logprobs=top,
        tool_calls=len(calls),
    )


def _from_completion(choice: CompletionChoice) -> WireChoice:
    lp = choice.logprobs
    values: tuple[float, ...] | None = None
    count: int | None = None
    if lp is not None and lp.token_logprobs is not None:
        values = tuple(v for v in lp.token_logprobs if v is not None)
        count = len(lp.token_logprobs)
    elif lp is not None and lp.tokens is not None:
        count = len(lp.tokens)
    top = None
    if lp is not None and lp.top_logprobs is not None:
        top = _likeliest_first([None if step is None else list(step.items()) for step in lp.top_logprobs])
    return WireChoice(
        index=choice.index,
        text=choice.text,
        finish_reason=_finish(choice.finish_reason),
        logprobs=values,
        token_count=count,
        tokens=_all_texts(lp.tokens if lp is not None else None),
        top_logprobs=top,
    )


def parse_response(api: str, raw: bytes) -> tuple[list[WireChoice], WireUsage | None]:
    """Validate a 2xx body of `api` and normalise its choices. Raises `ValueError`."""
    if api == "chat":
        chat = ChatResponse.model_validate_json(raw)
        return [_from_chat(c) for c in chat.choices], chat.usage
    completion = CompletionResponse.model_validate_json(raw)
    return [_from_completion(c) for c in completion.choices], completion.usage


def output_fields(request: SampleRequest) -> dict[str, Any]:
    """What a chat request says of the lanes' output: the run's `tools` and `tool_choice` as
    OpenAI takes them (a run that reads calls and names no choice asks for one, "required",
    as the engine holds its lanes to the tools' schema), else the schema as `response_format`."""
    if request.tools:
        fields: dict[str, Any] = {"tools": [tool.to_openai() for tool in request.tools]}
        choice = request.tool_choice or ("required" if request.schema is not None else None)
        if choice in TOOL_CHOICES:
            fields["tool_choice"] = choice
        elif choice is not None:
            fields["tool_choice"] = {"type": "function", "function": {"name": choice}}
        return fields
    if request.schema is not None:
        schema = json.loads(request.schema)
        return {
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        }
    return {}


def _message(turn: Turn) -> dict[str, Any]:
    """A conversation's turn as OpenAI's messages hold it: an assistant's `tool_calls` (its
    content null when it said nothing else), a tool turn's `tool_call_id` and `name`; the
    server renders them with its own template."""
    message: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.tool_calls:
        message["content"] = turn.content or None
        message["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in turn.tool_calls
        ]
    if turn.tool_call_id is not None:
        message["tool_call_id"] = turn.tool_call_id
    if turn.name is not None:
        message["name"] = turn.name
    return message


def build_body(
    config: OpenAIConfig, request: SampleRequest, *, n: int, seed: int, max_tokens: int
) -> dict[str, Any]:
    """The JSON body of one HTTP request carrying `n` lanes of `request`."""
    params = request.params
    # A merged request asks for logprobs whatever the loop wants: they count each choice's own
    # tokens, where some servers' usage counts one choice of n (llama-server). The backend hands
    # them on only where the loop asked.
    logprobs = params.logprobs or n > 1
    body: dict[str, Any] = dict(config.extra_body)
    body["model"] = config.model
    if config.api != "chat" and (request.tools or request.schema is not None):
        raise ConfigError(
            f"backend.api: {config.api!r} has no field for the run's tools or schema; "
            'use api = "chat" (tools, tool_choice and response_format go with it)'
        )
    if config.api == "chat":
        messages = (
            [] if config.system_prompt is None else [{"role": "system", "content": config.system_prompt}]
        )
        if request.messages is None:
            messages.append({"role": "user", "content": request.prompt})
        else:  # a conversation goes as its own turns (a system turn replaces system_prompt)
            if any(m.role in ("system", "developer") for m in request.messages):
                messages = []
            messages += [_message(m) for m in request.messages]
        body["messages"] = messages
        if logprobs:
            body["logprobs"] = True
        if params.logprobs and params.top_logprobs:
            body["top_logprobs"] = params.top_logprobs
        body.update(output_fields(request))
    else:
        body["prompt"] = request.prompt
        if logprobs:  # 1, not 0: some servers read 0 as "off"
            body["logprobs"] = max(1, params.top_logprobs if params.logprobs else 0)
    body["max_tokens"] = max_tokens
    body["temperature"] = params.temperature
    body["top_p"] = params.top_p
    body["seed"] = seed
    if n > 1:
        body["n"] = n  # left out at 1: a few servers reject the field outright
    if params.stop:
        body["stop"] = list(params.stop)
    if params.top_k > 0:
        body["top_k"] = params.top_k  # not OpenAI's own; a server without it says so (400)
    if params.ignore_eos:
        body["ignore_eos"] = True  # vLLM's and llama.cpp's extension, likewise
    return body
