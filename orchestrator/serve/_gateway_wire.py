"""The loop gateway's wire: what a request to a loop may say (fields honoured, ignored,
refused by name), the run it becomes (question, conversation, the config it runs under, the
digest an idempotent retry is checked against), and how a failed run is told. The response
made of a run's result is `_gateway_reply`'s."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lanefold.config import LoopConfig, parse_config
from lanefold.primitives import (
    MAX_LANE_TOKENS,
    BudgetExhaustedError,
    ChatMessage,
    ConfigError,
    LanefoldError,
)
from lanefold.serve._gateway_tools import Answering, answering, turns_of
from lanefold.serve._guard import HTTPError
from lanefold.serve._keys import GatewayKey
from lanefold.serve._outcomes import told
from lanefold.serve._wire import ChatMessageIn, refusal

__all__ = (
    "Ask",
    "Chat",
    "Completion",
    "Go",
    "Options",
    "config_for_request",
    "gateway_run_id",
    "out_of_quota",
    "parse_ask",
    "refused",
    "request_digest",
)

# Fields a loop cannot honour: refused by name rather than silently dropped.
_REFUSED = {
    "functions": "the legacy functions are not supported: send them as tools",
    "function_call": "the legacy function_call is not supported: send tool_choice",
    "logprobs": "a loop's answer is reduced from many lanes; it has no logprobs",
    "top_logprobs": "a loop's answer is reduced from many lanes; it has no logprobs",
    "logit_bias": "a loop samples with its config's settings; logit_bias is not supported",
    "audio": "a loop answers in text",
    "prediction": "predicted outputs are not supported on a loop",
    "echo": "a loop's answer does not echo its prompt",
    "suffix": "suffix is not supported on a loop",
    "best_of": "best_of is a loop of its own: name a best-of-N loop as the model",
}
# Fields that change nothing a loop returns: left out of the digest an idempotent retry is
# checked against (a retry may stream where the first did not).
_NOT_THE_REQUEST = ("stream", "stream_options", "user", "metadata", "store")


class _StreamOptions(BaseModel):
    """`stream_options`: an object; its `include_usage` a boolean (other keys pass)."""

    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False


class Options(BaseModel):
    """The fields of a request a loop reads (the rest are refused above or ignored).

    Types are the JSON's own, as OpenAI checks them (strict): `"n": "3"` is a string, not an
    integer, and `"stream": "yes"` no boolean. The fields clients commonly send that a loop
    does not use are typed too, so a wrong one is told, not silently taken."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1, le=MAX_LANE_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_LANE_TOKENS)
    temperature: float | None = Field(None, ge=0, le=5)
    top_p: float | None = Field(None, gt=0, le=1)
    stream_options: _StreamOptions | None = None
    # Accepted and not used by a loop (its config decides), but checked for their JSON type.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None


class Chat(Options):
    messages: list[ChatMessageIn] = Field(min_length=1)


class Completion(Options):
    prompt: str | list[str]


def request_digest(body: Mapping[str, Any]) -> str:
    """sha256 of the request as a loop reads it (canonical JSON, stream flags left out)."""
    kept = {k: v for k, v in body.items() if k not in _NOT_THE_REQUEST}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def gateway_run_id(caller: str, idempotency_key: str) -> str:
    """The run id of an idempotent request: a function of (caller, idempotency key) alone."""
    digest = hashlib.sha256(f"{caller}\0{idempotency_key}".encode()).hexdigest()
    return f"gw-{digest[:32]}"


_TEXT = Answering()  # a request without tools or response_format: the loop's own answers


@dataclass(frozen=True, slots=True)
class Ask:
    """One request to a loop, checked."""

    loop: str
    kind: str  # "chat.completion" or "text_completion"
    question: str
    conversation: tuple[ChatMessage, ...] | None  # a chat's turns before the question
    options: Options
    digest: str
    answering: Answering = _TEXT  # its tools, or the JSON its lanes answer with
    turns_after: tuple[ChatMessage, ...] = ()  # a chat's turns after the question (calls, results)


def _validated(data: Any, model: type[Options]) -> Options:
    if not isinstance(data, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    for name, why in _REFUSED.items():
        value = data.get(name)
        if value not in (None, False, [], {}) and not (name == "logprobs" and value == 0):
            raise HTTPError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
    if model is Completion:  # calls and structured answers are a chat's
        for name in ("tools", "tool_choice", "response_format"):
            value = data.get(name)
            if value not in (None, [], {}) and not (name == "response_format" and value == {"type": "text"}):
                raise HTTPError(
                    400,
                    f"{name}: a completion answers in text; send it as a chat",
                    param=name,
                    code="unsupported_parameter",
                )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = refusal(exc.errors())
        raise HTTPError(400, message, param=param) from None


def parse_ask(loop: str, kind: str, body: dict[str, Any]) -> Ask:
    if kind == "chat.completion":
        chat = _validated(body, Chat)
        assert isinstance(chat, Chat)
        how = answering(body)
        turns = turns_of(chat.messages)
        return Ask(loop, kind, turns.question, turns.before, chat, request_digest(body), how, turns.after)
    completion = _validated(body, Completion)
    assert isinstance(completion, Completion)
    prompt = completion.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise HTTPError(400, "prompt: one prompt per request", param="prompt")
        prompt = prompt[0]
    if not prompt.strip():
        raise HTTPError(400, "prompt: empty", param="prompt")
    return Ask(loop, kind, prompt, None, completion, request_digest(body))


def config_for_request(config: LoopConfig, options: Options, how: Answering | None = None) -> LoopConfig:
    """The loop's config with the request's ceiling and the sampling fields it lets a request
    set (`[sampling] from_request`); for a completion, `[prompt] form = "auto"` made the form
    the run sends (raw text where the backend takes it, as OpenAI means a completion), so the
    run records it and a resume sends the same. A request with tools or a `response_format`
    reads its lanes' calls or JSON values (`[extract]` replaced): a loop that cannot reduce
    them is a 400 naming the field."""
    ceiling = options.max_completion_tokens or options.max_tokens
    raw = config.model_dump(mode="json")
    sampling = raw["sampling"]
    changed = False
    if how is not None and how.extract is not None:
        raw["extract"], changed = dict(how.extract), True
    if isinstance(options, Completion) and config.prompt.form == "auto":
        raw["prompt"]["form"], changed = config.prompt_form(completion=True), True
    if ceiling is not None and ceiling < sampling["max_tokens"]:
        sampling["max_tokens"], changed = ceiling, True
    for name in config.sampling.from_request:
        value = getattr(options, name)
        if value is not None and value != sampling[name]:
            sampling[name], changed = value, True
    if not changed:
        return config
    try:
        return parse_config(raw, folder=config.folder)
    except ConfigError as exc:
        param = "tools" if how is not None and how.calls else "response_format"
        raise HTTPError(400, f"{param}: this loop cannot answer so: {exc}", param=param) from None


def out_of_quota(message: str) -> HTTPError:
    """429 insufficient_quota: the key's budget cannot fund the loop. A retry cannot succeed
    either, so `x-should-retry: false` tells the OpenAI SDKs (and LangChain, LiteLLM over them)
    not to repeat it, each repeat a refused run in the store."""
    return HTTPError(
        429,
        message,
        kind="insufficient_quota",
        code="insufficient_quota",
        headers={"x-should-retry": "false"},
    )


def refused(exc: LanefoldError) -> HTTPError:
    """A run's failure as the client hears it."""
    if isinstance(exc, BudgetExhaustedError):
        return out_of_quota(str(exc))
    t = told(exc)
    return HTTPError(t.status, t.message, kind=t.kind, code=t.code, headers=t.headers)


@dataclass(frozen=True, slots=True)
class Go:
    """A request's run: what was asked, its id, who asked, whether a retry may resume it."""

    ask: Ask
    run_id: str
    caller: str | None
    key: GatewayKey | None
    idempotent: bool
    request_id: str | None = None  # recorded with the run (X-Request-ID, or the gateway's own)
    trace_context: dict[str, str] | None = None  # the client's W3C traceparent/tracestate
