"""The loop gateway: loops served over the OpenAI API, a model name per loop config.

`POST /v1/chat/completions` (or `/v1/completions`) naming a served loop is one governed run in
the store: the conversation's last user turn is the run's question, the turns before it go
ahead of every sampled lane's prompt through the backend's chat template, and the answer is the
winning lane's text. `usage` is what the whole run paid (every lane, every judge call), so a
client's own accounting sees the true cost; `lanefold` in the body says how the answer was
reached. A request naming no loop goes to the backend served beside them, if any.

Keys (`Keys`, `KeyPools`) say who may call which loop, and from which budget; an
`Idempotency-Key` header makes the run id a function of (key, idempotency key), so a retry
returns the record, resumes the interrupted run, or is told the run is live elsewhere (409).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lanefold.config import LoopConfig, parse_config
from lanefold.execution import RunResult, Session, read_state, run_record
from lanefold.primitives import (
    BudgetExhaustedError,
    ConfigError,
    LanefoldError,
    RunInUseError,
    RunNotFoundError,
    RunState,
)
from lanefold.primitives.events import AnyEvent, LaneCompleted, LaneDispatched, LaneFailed
from lanefold.serve._guard import HTTPError, Stopping, read_json, unless_disconnected
from lanefold.serve._keys import GatewayKey, KeyPools, Keys
from lanefold.serve._outcomes import on_error, told
from lanefold.serve._wire import ChatMessageIn, refusal

__all__ = ("create_gateway", "gateway_run_id", "request_digest")

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


class _Options(BaseModel):
    """The fields of a request a loop reads (the rest are refused above or ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str
    n: int = Field(1, ge=1, le=64)
    stream: bool = False
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=5, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    stream_options: dict[str, Any] | None = None


class _Chat(_Options):
    messages: list[ChatMessageIn] = Field(min_length=1)


class _Completion(_Options):
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
class _Ask:
    """One request to a loop, checked."""

    loop: str
    kind: str  # "chat.completion" or "text_completion"
    question: str
    conversation: tuple[tuple[str, str], ...] | None  # a chat's turns before the question
    options: _Options
    digest: str


def _validated(data: Any, model: type[_Options]) -> _Options:
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


def _ask(loop: str, kind: str, body: dict[str, Any]) -> _Ask:
    if kind == "chat.completion":
        chat = _validated(body, _Chat)
        assert isinstance(chat, _Chat)
        turns = [("system" if m.role == "developer" else m.role, m.text()) for m in chat.messages]
        if turns[-1][0] != "user":
            raise HTTPError(400, "messages: the last message must be the user's question", param="messages")
        if not turns[-1][1].strip():
            raise HTTPError(400, "messages: the last user message is empty", param="messages")
        return _Ask(loop, kind, turns[-1][1], tuple(turns[:-1]), chat, request_digest(body))
    completion = _validated(body, _Completion)
    assert isinstance(completion, _Completion)
    prompt = completion.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise HTTPError(400, "prompt: one prompt per request", param="prompt")
        prompt = prompt[0]
    if not prompt.strip():
        raise HTTPError(400, "prompt: empty", param="prompt")
    return _Ask(loop, kind, prompt, None, completion, request_digest(body))


def _config_for(config: LoopConfig, options: _Options) -> LoopConfig:
    """The loop's config with the request's ceiling and the sampling fields it lets a request
    set (`[sampling] from_request`)."""
    ceiling = options.max_completion_tokens or options.max_tokens
    raw = config.model_dump(mode="json")
    sampling = raw["sampling"]
    changed = False
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
        (lane.finish_reason for lane in reversed(result.lanes) if lane.lane == result.winner_lane), "stop"
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


def _body(ask: _Ask, result: RunResult, state: RunState | None, created: int) -> dict[str, Any]:
    choices = []
    for i, (text, finish) in enumerate(_choices(result, state, ask.options.n)):
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
        "lanefold": _lanefold(ask.loop, result),
    }


def _lanefold(loop: str, result: RunResult) -> dict[str, Any]:
    return {
        "run_id": result.run_id,
        "loop": loop,
        "status": result.status,
        "answer": result.answer,
        "votes": result.votes,
        "scores": {str(k): v for k, v in result.scores.items()},
        "agreement": result.agreement,
        "margin": result.margin,
        "lanes": result.lanes_completed,
        "lanes_failed": result.lanes_failed,
        "resumes": result.resumes,
        "bill": {
            "usage": result.usage.model_dump(mode="json"),
            "cost": result.cost.model_dump(mode="json"),
        },
    }


def _out_of_quota(message: str) -> HTTPError:
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


def _refused(exc: LanefoldError) -> HTTPError:
    """A run's failure as the client hears it."""
    if isinstance(exc, BudgetExhaustedError):
        return _out_of_quota(str(exc))
    t = told(exc)
    return HTTPError(t.status, t.message, kind=t.kind, code=t.code, headers=t.headers)


class _Replayed:
    """An ASGI receive that gives a body already read, then waits on the real one."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self.body, self.receive, self.sent = body, receive, False

    async def __call__(self) -> Message:
        if not self.sent:
            self.sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        return await self.receive()


class _Delegated(Response):
    """The request handed, body and all, to the backend app served beside the loops."""

    def __init__(self, app: ASGIApp, body: bytes) -> None:
        super().__init__()
        self.app, self.raw = app, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, _Replayed(self.raw, receive), send)


def create_gateway(
    session: Session,
    loops: Mapping[str, LoopConfig],
    *,
    keys: Keys | None = None,
    pools: KeyPools | None = None,
    backend_app: Starlette | None = None,
    backend_names: frozenset[str] = frozenset(),
    max_body_bytes: int = 1 << 20,
    clock: Callable[[], float] = time.time,
    heartbeat_s: float = 5.0,
) -> Starlette:
    """An ASGI app serving each of `loops` (model name -> config) through `session`, whose
    store records every request as a run. `keys`: who may call (else anyone who reaches the
    port, or holds `serve --api-key-env`'s key: that middleware wraps this app); `pools` keep
    their budgets. `backend_app` answers requests naming `backend_names` (`serve
    --backend-config` beside `--loops`). `heartbeat_s`: a stream's comment line at least this
    often while lanes run, so proxies keep it open."""
    stopping = Stopping()
    store = session.store
    configs: dict[tuple[str, int | None, float | None, float | None], LoopConfig] = {}

    def key_of(request: Request) -> GatewayKey | None:
        if keys is None:
            return None
        sent = request.headers.get("authorization", "")
        scheme, _, token = sent.partition(" ")
        found = keys.find(token.strip()) if scheme.lower() == "bearer" else None
        if found is None:
            raise HTTPError(
                401,
                "missing or unknown API key: send 'Authorization: Bearer <key>'",
                kind="invalid_request_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return found

    def config_for(ask: _Ask) -> LoopConfig:
        o = ask.options
        cache = (ask.loop, o.max_completion_tokens or o.max_tokens, o.temperature, o.top_p)
        if cache not in configs:
            configs[cache] = _config_for(loops[ask.loop], o)
        return configs[cache]

    async def models(request: Request) -> JSONResponse:
        key = key_of(request)
        names = [n for n in loops if key is None or key.may_call(n)]
        entries = [{"id": n, "object": "model", "created": 0, "owned_by": "lanefold-loop"} for n in names]
        entries += [
            {"id": n, "object": "model", "created": 0, "owned_by": "lanefold"} for n in sorted(backend_names)
        ]
        return JSONResponse({"object": "list", "data": entries})

    async def runs(request: Request) -> JSONResponse:
        key = key_of(request)
        run_id = request.path_params["run_id"]
        missing = HTTPError(404, f"no run {run_id!r}", param="run_id", code="run_not_found")
        try:
            if not store.exists(store.check_id(run_id)):
                raise missing
            state = read_state(store, run_id)
        except (ConfigError, OSError):
            raise missing from None
        if key is not None and (state.started is None or state.started.caller != key.name):
            raise missing  # another key's run is none of this key's business
        return JSONResponse(run_record(store, run_id), headers={"x-lanefold-run-id": run_id})

    async def handle(request: Request, kind: str) -> Response:
        key = key_of(request)
        raw = await _body_bytes(request, max_body_bytes)
        try:
            data = json.loads(raw)
        except ValueError:
            raise HTTPError(400, "the request body is not valid JSON") from None
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, str) or model not in loops:
            if backend_app is not None and model in backend_names:
                return _Delegated(backend_app, raw)
            raise HTTPError(404, f"model {model!r} not found", param="model", code="model_not_found")
        if key is not None and not key.may_call(model):
            raise HTTPError(404, f"model {model!r} not found", param="model", code="model_not_found")
        ask = _ask(model, kind, data)
        return await answer(request, ask, key)

    async def answer(request: Request, ask: _Ask, key: GatewayKey | None) -> Response:
        caller = key.name if key is not None else None
        idempotency = request.headers.get("idempotency-key")
        run_id = None
        if idempotency is not None:
            if not idempotency.strip() or len(idempotency) > 255:
                raise HTTPError(400, "Idempotency-Key: 1 to 255 characters", param="Idempotency-Key")
            run_id = gateway_run_id(key.sha256 if key is not None else "", idempotency)
            recorded = _recorded(run_id, ask)
            if recorded is not None:
                return recorded
        else:
            run_id = store.new_id()
        limiter = pools.limiters.get(key.name) if (pools is not None and key is not None) else None
        if limiter is not None:
            try:
                limiter.acquire_nowait()
            except anyio.WouldBlock:
                raise HTTPError(
                    429,
                    f"this key runs at most {key.max_concurrency} requests at once",  # type: ignore[union-attr]
                    kind="rate_limit_error",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": "1"},
                ) from None
        try:
            if pools is not None and key is not None:
                limit = await anyio.to_thread.run_sync(pools.exhausted, key)
                if limit is not None:
                    raise _out_of_quota(f"key {key.name!r} has spent its budget ({limit})")
            go = _Go(ask, run_id, caller, key, idempotency is not None)
            if ask.options.stream:
                return _LoopStream(go, run, stopping, clock, heartbeat_s)
            done = await unless_disconnected(request, stopping, lambda: run(go, None))
            if done is None:  # the client hung up: its run was interrupted (resumable)
                return Response(status_code=499)
            result, state = done
            return JSONResponse(
                _body(ask, result, state, int(clock())), headers={"x-lanefold-run-id": result.run_id}
            )
        finally:
            if limiter is not None and not ask.options.stream:
                limiter.release()
            elif limiter is not None:
                pass  # the stream releases it when it ends

    def _recorded(run_id: str, ask: _Ask) -> Response | None:
        """What an idempotent retry is answered from the record: the recorded response, a 422
        for another body; None where the run is to be started or resumed."""
        if not store.exists(run_id):
            return None
        try:
            state = read_state(store, run_id)
        except RunNotFoundError:
            return None
        started = state.started
        if started is not None and started.request_sha256 not in (None, ask.digest):
            raise HTTPError(
                422,
                "Idempotency-Key: already used for a request with another body",
                param="Idempotency-Key",
                code="idempotency_key_reused",
            )
        if state.result is not None:
            result = RunResult.model_validate(state.result)
            body = _body(ask, result, state, int(clock()))
            if ask.options.stream:
                return _Replay(body)
            return JSONResponse(body, headers={"x-lanefold-run-id": run_id})
        if state.failure is not None:  # told as it was when it failed
            if state.failure.error == BudgetExhaustedError.__name__:
                raise _out_of_quota(state.failure.message)
            raise HTTPError(500, f"the run failed: {state.failure.message}", kind="server_error")
        return None

    async def run(go: _Go, observer: Callable[[AnyEvent], None] | None) -> tuple[RunResult, RunState | None]:
        """The run of one request (or its resumption), spending from its key's budget."""
        ask = go.ask
        pool = await pools.open(go.key, go.run_id) if (pools is not None and go.key is not None) else None
        try:
            result = await session.run(
                ask.question,
                run_id=go.run_id,
                resume=go.idempotent,
                config=config_for(ask),
                conversation=ask.conversation,
                caller=go.caller,
                request_sha256=ask.digest,
                shared=pool,
                observer=observer,
                stop_reason=lambda: "client gone",
            )
        except RunInUseError:
            raise HTTPError(
                409,
                "the run of this Idempotency-Key is live elsewhere; retry when it ends",
                code="idempotency_key_in_use",
                headers={"Retry-After": "1"},
            ) from None
        except LanefoldError as exc:
            raise _refused(exc) from None
        finally:
            if pools is not None:
                with anyio.CancelScope(shield=True):
                    await pools.close(pool)
            if go.key is not None and pools is not None:
                limiter = pools.limiters.get(go.key.name)
                if limiter is not None and ask.options.stream:
                    limiter.release()
        if (
            result.status == "no_answer"
            and result.lanes_completed == 0
            and result.reason
            and "budget" in result.reason
        ):
            raise _out_of_quota(result.reason)
        state = None
        if ask.options.n > 1:
            state = await anyio.to_thread.run_sync(read_state, store, result.run_id)
        return result, state

    async def chat(request: Request) -> Response:
        return await handle(request, "chat.completion")

    async def completions(request: Request) -> Response:
        return await handle(request, "text_completion")

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPError)
        return exc.response()

    app = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/runs/{run_id}", runs, methods=["GET"]),
        ],
        exception_handlers={HTTPError: on_http_error, LanefoldError: on_error, Exception: on_error},
    )
    app.state.stopping, app.state.session = stopping, session
    return app


@dataclass(frozen=True, slots=True)
class _Go:
    ask: _Ask
    run_id: str
    caller: str | None
    key: GatewayKey | None
    idempotent: bool


async def _body_bytes(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        await read_json(request, max_bytes)  # raises its 413
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise HTTPError(
                413, f"the request body is larger than {max_bytes} bytes", code="request_too_large"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _chunk(body: dict[str, Any], choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
    kind = "chat.completion.chunk" if body["object"] == "chat.completion" else "text_completion"
    chunk: dict[str, Any] = {
        "id": body["id"],
        "object": kind,
        "created": body["created"],
        "model": body["model"],
        "choices": choices,
    }
    if usage is not None:
        chunk["usage"] = usage
        chunk["lanefold"] = body["lanefold"]
    return f"data: {json.dumps(chunk)}\n\n".encode()


def _closing_frames(body: dict[str, Any]) -> list[bytes]:
    """The content, each choice's finish, the usage chunk and `[DONE]`."""
    frames = []
    chat = body["object"] == "chat.completion"
    for choice in body["choices"]:
        i = choice["index"]
        if chat:
            text = choice["message"]["content"]
            frames.append(_chunk(body, [{"index": i, "delta": {"content": text}, "finish_reason": None}]))
            frames.append(_chunk(body, [{"index": i, "delta": {}, "finish_reason": choice["finish_reason"]}]))
        else:
            frames.append(_chunk(body, [{"index": i, "text": choice["text"], "finish_reason": None}]))
            frames.append(_chunk(body, [{"index": i, "text": "", "finish_reason": choice["finish_reason"]}]))
    frames.append(_chunk(body, [], body["usage"]))
    frames.append(b"data: [DONE]\n\n")
    return frames


def _opening(ask: _Ask, run_id: str, created: int) -> bytes:
    kind = "chat.completion.chunk" if ask.kind == "chat.completion" else "text_completion"
    prefix = "chatcmpl" if ask.kind == "chat.completion" else "cmpl"
    choices = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        if ask.kind == "chat.completion"
        else {"index": i, "text": "", "finish_reason": None}
        for i in range(ask.options.n)
    ]
    chunk = {
        "id": f"{prefix}-{run_id}",
        "object": kind,
        "created": created,
        "model": ask.loop,
        "choices": choices,
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class _Replay(Response):
    """A recorded response, streamed as a live one would have ended."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__()
        self.recorded = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [*_SSE_HEADERS, (b"x-lanefold-run-id", self.recorded["lanefold"]["run_id"].encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        frames = [
            _chunk(self.recorded, [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
        ]
        if self.recorded["object"] != "chat.completion":
            frames = []
        for frame in [*frames, *_closing_frames(self.recorded)]:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _LoopStream(Response):
    """A loop's run as server-sent events: the role chunk as soon as the first lane is
    dispatched (its wave funded: a run refused before that, by a key's budget or anything else,
    is an ordinary error response with its own status), a comment line as each lane lands (and
    a heartbeat between), then the answer, the usage chunk and `[DONE]`. The client hanging up
    cancels the run, which records its interrupt (resumable); a server stop too."""

    def __init__(
        self,
        go: _Go,
        run: Callable[[_Go, Callable[[AnyEvent], None] | None], Awaitable[tuple[RunResult, RunState | None]]],
        stopping: Stopping,
        clock: Callable[[], float],
        heartbeat_s: float,
    ) -> None:
        super().__init__()
        self.go, self.run, self.stopping, self.clock, self.heartbeat_s = go, run, stopping, clock, heartbeat_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        go = self.go
        created = int(self.clock())
        landed_send, landed = anyio.create_memory_object_stream[str](math.inf)
        going = anyio.Event()  # the first lane is dispatched, or the run is over

        def observe(event: AnyEvent) -> None:
            if isinstance(event, LaneDispatched):
                going.set()
            elif isinstance(event, LaneCompleted | LaneFailed):
                state = "landed" if isinstance(event, LaneCompleted) else "failed"
                landed_send.send_nowait(f": lane {event.wave}.{event.lane} {state}\n\n")

        headers = [*_SSE_HEADERS, (b"x-lanefold-run-id", go.run_id.encode())]
        outcome: list[tuple[RunResult, RunState | None] | HTTPError] = []

        async def work() -> None:
            try:
                outcome.append(await self.run(go, observe))
            except HTTPError as exc:
                outcome.append(exc)
            except LanefoldError as exc:
                outcome.append(_refused(exc))
            finally:
                landed_send.close()
                going.set()

        async def watch(scope_: anyio.CancelScope) -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    scope_.cancel()
                    return

        async with anyio.create_task_group() as tg:
            with self.stopping.watching(tg.cancel_scope):
                tg.start_soon(watch, tg.cancel_scope)
                tg.start_soon(work)
                await going.wait()
                if outcome and isinstance(outcome[0], HTTPError):  # refused before any lane went
                    landed.close()
                    await outcome[0].response()(scope, receive, send)
                    tg.cancel_scope.cancel()
                    return
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                opening = _opening(go.ask, go.run_id, created)
                await send({"type": "http.response.body", "body": opening, "more_body": True})
                async with landed:
                    while True:
                        with anyio.move_on_after(self.heartbeat_s) as beat:
                            try:
                                line = await landed.receive()
                            except anyio.EndOfStream:
                                break
                        if beat.cancelled_caught:
                            line = ": running\n\n"
                        await send({"type": "http.response.body", "body": line.encode(), "more_body": True})
                if outcome:
                    got = outcome[0]
                    if isinstance(got, HTTPError):
                        error = {"message": str(got), "type": got.kind, "param": got.param, "code": got.code}
                        frames = [f"data: {json.dumps({'error': error})}\n\n".encode(), b"data: [DONE]\n\n"]
                    else:
                        result, state = got
                        frames = _closing_frames(_body(go.ask, result, state, created))
                    for frame in frames:
                        await send({"type": "http.response.body", "body": frame, "more_body": True})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                tg.cancel_scope.cancel()
