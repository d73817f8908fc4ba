"""The loop gateway's wire: what a request to a loop may say (fields honoured, ignored,
refused by name), the run it becomes (question, conversation, the config it runs under, the
digest an idempotent retry is checked against), and the response made of the run's result."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import JSONResponse

from lanefold.config import LoopConfig, parse_config
from lanefold.execution import LaneResult, RunResult
from lanefold.primitives import (
    MAX_LANE_TOKENS,
    BudgetExhaustedError,
    LanefoldError,
    RunState,
    normalize_answer,
)
from lanefold.serve._guard import HTTPError
from lanefold.serve._keys import GatewayKey
from lanefold.serve._outcomes import told
from lanefold.serve._wire import ChatMessageIn, refusal

__all__ = (
    "Ask",
    "Chat",
    "Completion",
    "Go",
    "NoAnswer",
    "Options",
    "config_for_request",
    "gateway_run_id",
    "out_of_quota",
    "parse_ask",
    "refused",
    "request_digest",
    "response_body",
)

# Fields a loop cannot honour: refused by name rather than silently dropped.
_REFUSED = {
    "tools": "a loop answers in text; tool calls are not supported",
    "tool_choice": "a loop answers in text; tool calls are not supported",
    "functions": "a loop answers in text; function calls are not supported",
    "function_call": "a loop answers in text; function calls are not supported",
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


@dataclass(frozen=True, slots=True)
class Ask:
    """One request to a loop, checked."""

    loop: str
    kind: str  # "chat.completion" or "text_completion"
    question: str
    conversation: tuple[tuple[str, str], ...] | None  # a chat's turns before the question
    options: Options
    digest: str


def _validated(data: Any, model: type[Options]) -> Options:
    if not isinstance(data, dict):
        raise HTTPError(400, "the request body must be a JSON object")
    for name, why in _REFUSED.items():
        value = data.get(name)
        if value not in (None, False, [], {}) and not (name == "logprobs" and value == 0):
            raise HTTPError(400, f"{name}: {why}", param=name, code="unsupported_parameter")
    response_format = data.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type", "text") != "text":
        raise HTTPError(
            400,
            "response_format: a loop answers in text",
            param="response_format",
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
        turns = [("system" if m.role == "developer" else m.role, m.text()) for m in chat.messages]
        if turns[-1][0] != "user":
            raise HTTPError(400, "messages: the last message must be the user's question", param="messages")
        if not turns[-1][1].strip():
            raise HTTPError(400, "messages: the last user message is empty", param="messages")
        return Ask(loop, kind, turns[-1][1], tuple(turns[:-1]), chat, request_digest(body))
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


def config_for_request(config: LoopConfig, options: Options) -> LoopConfig:
    """The loop's config with the request's ceiling and the sampling fields it lets a request
    set (`[sampling] from_request`); for a completion, `[prompt] form = "auto"` made the form
    the run sends (raw text where the backend takes it, as OpenAI means a completion), so the
    run records it and a resume sends the same."""
    ceiling = options.max_completion_tokens or options.max_tokens
    raw = config.model_dump(mode="json")
    sampling = raw["sampling"]
    changed = False
    if isinstance(options, Completion) and config.prompt.form == "auto":
        raw["prompt"]["form"], changed = config.prompt_form(completion=True), True
    if ceiling is not None and ceiling < sampling["max_tokens"]:
        sampling["max_tokens"], changed = ceiling, True
    for name in config.sampling.from_request:
        value = getattr(options, name)
        if value is not None and value != sampling[name]:
            sampling[name], changed = value, True
    return parse_config(raw, folder=config.folder) if changed else config


def _usage(result: RunResult) -> dict[str, Any]:
    """The whole run's bill in OpenAI's shape: every lane's prompt (cached prefill in
    `cached_tokens`) and output; a judge's tokens count as completion tokens."""
    u = result.usage
    prompt = u.prefill_tokens + u.cached_prefill_tokens
    completion = u.decode_tokens + u.verifier_tokens + u.cut_off_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": u.cached_prefill_tokens},
    }


def _choices(result: RunResult, state: RunState | None, n: int) -> list[tuple[str, str | None]]:
    """(text, finish_reason) of the top `n` distinct answers: the winner first, then by votes
    (or by score), each from its first lane that gave it."""
    texts: dict[tuple[int, int], tuple[str | None, str | None]] = {}
    if state is not None:
        for wave_no, wave in sorted(state.waves.items()):
            for lane_no, lane_state in sorted(wave.lanes.items()):
                texts[(wave_no, lane_no)] = (lane_state.text, lane_state.finish_reason)
    winner_finish = next(
        (
            lane.finish_reason
            for lane in reversed(result.lanes)
            if lane.lane == result.winner_lane and result.winner_wave in (None, lane.wave)
        ),
        "stop",
    )
    chosen: list[tuple[str, str | None]] = [(result.winner_text or "", winner_finish or "stop")]
    if n == 1 or result.answer is None:
        return chosen
    if result.votes:
        ranked = sorted(result.votes, key=lambda a: -float(result.votes[a]))
    else:
        by_answer: dict[str, float] = {}
        for scored in result.lanes:
            if scored.answer is not None and scored.score is not None:
                by_answer[scored.answer] = max(by_answer.get(scored.answer, -math.inf), scored.score)
        ranked = sorted(by_answer, key=lambda a: -by_answer[a])
    for answer in ranked:
        if len(chosen) >= n:
            break
        if answer == result.answer:
            continue
        lane = next((x for x in result.lanes if x.answer == answer and x.status == "completed"), None)
        if lane is None:
            continue
        text, finish = texts.get((lane.wave, lane.lane), (None, None))
        if text is not None:
            chosen.append((text, finish or "stop"))
    return chosen


class NoAnswer(HTTPError):
    """A run that ended without an answer, as the client hears it: 422 with `code` and `type`
    `no_answer`, the run's reason in the message, and the reply's `lanefold` object inside
    `error` (where the SDKs hand it on, as the exception's `body`). Never retried: the same
    request samples the same lanes."""

    def __init__(self, lanefold: dict[str, Any]) -> None:
        super().__init__(
            422,
            f"the loop gave no answer: {lanefold['reason']}",
            kind="no_answer",
            code="no_answer",
            headers={"x-lanefold-run-id": lanefold["run_id"], "x-should-retry": "false"},
        )
        self.lanefold = lanefold

    def error(self) -> dict[str, Any]:
        """The `error` object of the response body (and of a stream's error event)."""
        return {
            "message": str(self),
            "type": self.kind,
            "param": None,
            "code": self.code,
            "lanefold": self.lanefold,
        }

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.error()}, status_code=self.status, headers=self.headers)


def response_body(ask: Ask, result: RunResult, state: RunState | None, created: int) -> dict[str, Any]:
    """The reply to `ask` from its run's result (and, for more than one choice or a run
    without an answer, its folded log). A run without an answer raises `NoAnswer`, unless its
    config says `[loop] on_no_answer = "best_lane"`: then the best lane's text is the one
    choice, its `finish_reason` and `lanefold.status` "no_answer"."""
    lanefold = _lanefold(ask.loop, result)
    if result.status == "no_answer":
        best = _best_lane(result, state) if _on_no_answer(state) == "best_lane" else None
        if best is None:
            raise NoAnswer(lanefold)
        lane, text = best
        lanefold["served_lane"] = {"wave": lane.wave, "lane": lane.lane}
        chosen: list[tuple[str, str | None]] = [(text, "no_answer")]
    else:
        chosen = _choices(result, state, ask.options.n)
    choices = []
    for i, (text, finish) in enumerate(chosen):
        if ask.kind == "chat.completion":
            message = {"role": "assistant", "content": text}
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
        else:
            choices.append({"index": i, "text": text, "finish_reason": finish, "logprobs": None})
    return {
        "id": f"{'chatcmpl' if ask.kind == 'chat.completion' else 'cmpl'}-{result.run_id}",
        "object": ask.kind,
        "created": created,
        "model": ask.loop,
        "choices": choices,
        "usage": _usage(result),
        "lanefold": lanefold,
    }


def _on_no_answer(state: RunState | None) -> str:
    """What the run's recorded config says to reply without an answer (a replay answers as
    the run was served, whatever the loop's file says now)."""
    config = state.started.config if state is not None and state.started is not None else {}
    loop = config.get("loop")
    return str(loop.get("on_no_answer", "error")) if isinstance(loop, dict) else "error"


def _best_lane(result: RunResult, state: RunState | None) -> tuple[LaneResult, str] | None:
    """The sampled lane to serve without an answer, and its text: one whose answer has the
    most votes (below the quorum), else the best judged, else the first that stopped on its
    own, else the first that completed; None where none completed."""

    def rank(lane: LaneResult) -> tuple[float, float, bool, int, int]:
        answer = normalize_answer(lane.answer) if lane.answer else ""
        votes = float(result.votes.get(answer, 0.0)) if answer else 0.0
        score = lane.score if lane.score is not None else -math.inf
        return (-votes, -score, lane.finish_reason != "stop", lane.wave, lane.lane)

    if state is None:
        return None
    for lane in sorted((x for x in result.lanes if x.status == "completed"), key=rank):
        wave = state.waves.get(lane.wave)
        landed = wave.lanes.get(lane.lane) if wave is not None else None
        if landed is not None and landed.text is not None:
            return lane, landed.text
    return None


def _lanefold(loop: str, result: RunResult) -> dict[str, Any]:
    return {
        "run_id": result.run_id,
        "loop": loop,
        "status": result.status,
        "reason": result.reason,
        "answer": result.answer,
        "votes": result.votes,
        "scores": {str(k): v for k, v in result.scores.items()},
        "agreement": result.agreement,
        "margin": result.margin,
        "lanes": result.lanes_completed,
        "lanes_failed": result.lanes_failed,
        "lanes_answered": result.lanes_answered,
        "resumes": result.resumes,
        "bill": {
            "usage": result.usage.model_dump(mode="json"),
            "cost": result.cost.model_dump(mode="json"),
        },
    }


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
    trace_context: dict[str, str] | None = None  # the client's W3C traceparent/tracestate
