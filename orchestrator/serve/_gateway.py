"""The loop gateway: loops served over the OpenAI API, a model name per loop config.

`POST /v1/chat/completions` (or `/v1/completions`) naming a served loop is one governed run in
the store: the conversation's last user turn is the run's question, the turns before it go
ahead of every sampled lane's prompt through the backend's chat template, and the answer is the
winning lane's text. `usage` is what the whole run paid (every lane, every judge call), so a
client's own accounting sees the true cost; `lanefold` in the body says how the answer was
reached. A request naming no loop goes to the backend served beside them, if any.

Keys (`Keys`, `KeyPools`) say who may call which loop, from which budget (`key:<name>` in the
store) and how many requests at once; an
`Idempotency-Key` header makes the run id a function of (key, idempotency key), so a retry
returns the record, resumes the interrupted run, or is told the run is live elsewhere (409).
What a request may say is `_gateway_wire`'s (its tools, `response_format` and a chat's calls
`_gateway_tools`'), the response it gets `_gateway_reply`'s; streams are `_gateway_stream`'s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lanefold.config import LoopConfig
from lanefold.execution import RunResult, Session, Store, read_state, run_record
from lanefold.primitives import (
    BudgetExhaustedError,
    BudgetStore,
    ConfigError,
    LanefoldError,
    LogCorruptError,
    RunInUseError,
    RunNotFoundError,
    RunState,
    fold,
    offload,
)
from lanefold.primitives.events import AnyEvent
from lanefold.primitives.internal import stopped_for_budget
from lanefold.serve._gateway_reply import response_body
from lanefold.serve._gateway_stream import LoopStream, Replay
from lanefold.serve._gateway_wire import (
    Ask,
    Go,
    config_for_request,
    gateway_run_id,
    out_of_quota,
    parse_ask,
    refused,
)
from lanefold.serve._guard import (
    HTTPError,
    Stopping,
    one_authorization,
    parse_json,
    read_body,
    unless_disconnected,
)
from lanefold.serve._keyring import StoreKeys
from lanefold.serve._keys import GatewayKey, KeyPools, Keys
from lanefold.serve._limits import Admitted, KeyRates, answer_headers, request_hold, request_id_of
from lanefold.serve._outcomes import on_error
from lanefold.serve._routes import model_not_found, served_models
from lanefold.telemetry import trace_context_of

__all__ = ("create_gateway",)

_log = logging.getLogger("lanefold.serve")


def _caller(store: Store, run_id: str) -> str | None:
    """Who started a run, as its first line (checked alone) says; None where it cannot say."""
    try:
        head = next(iter(store.reader(run_id).read()), None)
        started = fold([head], run_id=run_id).started if head is not None else None
    except (LanefoldError, OSError):
        return None
    return started.caller if started is not None else None


def _checked(store: Store, run_id: str) -> RunState:
    """The run as the fold of its log gives it, every line checked, as `show` reads it. A
    record that does not check is a 500 the client cannot retry past (it names no server
    path: the operator's log does)."""
    try:
        return read_state(store, run_id)
    except LogCorruptError as exc:
        _log.error("the record of run %s does not check: %s", run_id, exc)
        raise HTTPError(
            500,
            f"the record of run {run_id} does not check against its own events; "
            f"an operator can see why with: orchestrator show {run_id}",
            kind="server_error",
            code="run_record_corrupt",
            headers={"x-should-retry": "false"},
        ) from None


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
    keys: Keys | StoreKeys | None = None,
    pools: KeyPools | None = None,
    backend_app: Starlette | None = None,
    backend_names: frozenset[str] = frozenset(),
    max_body_bytes: int = 1 << 20,
    clock: Callable[[], float] = time.time,
    heartbeat_s: float = 5.0,
) -> Starlette:
    """An ASGI app serving each of `loops` (model name -> config; and `LOOP/MODEL` for each
    model a loop's `[serve] models` lists) through `session`, whose store records every
    request as a run. `keys`: who may call (else anyone who reaches the
    port, or holds `serve --api-key-env`'s key: that middleware wraps this app); `pools` keep
    their budgets; keys kept in the store (`StoreKeys`) have their tokens and requests a minute
    kept there too (in `clock`'s seconds) and `GET /v1/usage` answers a key its own figures.
    `backend_app` answers requests naming `backend_names` (`serve
    --backend-config` beside `--loops`). `heartbeat_s`: a stream's comment line at least this
    often while lanes run, so proxies keep it open."""
    stopping = Stopping()
    loops = served_models(loops)  # LOOP/MODEL too, where a loop's `[serve] models` lists them
    store = session.store
    budgets = store if isinstance(store, BudgetStore) else None
    rates = KeyRates(keys.store, clock, budgets) if isinstance(keys, StoreKeys) else None
    configs: dict[tuple[str, str, int | None, float | None, float | None, str | None], LoopConfig] = {}

    async def key_of(request: Request) -> GatewayKey | None:
        if keys is None:
            return None
        if isinstance(keys, StoreKeys):
            await keys.fresh()
        sent = one_authorization(request.headers.getlist("authorization"), "")
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

    def config_for(ask: Ask) -> LoopConfig:
        o, how = ask.options, ask.answering.extract
        answers = None if how is None else json.dumps(how, sort_keys=True)
        cache = (ask.loop, ask.kind, o.max_completion_tokens or o.max_tokens, o.temperature, o.top_p, answers)
        if cache not in configs:
            if len(configs) >= 256:  # requests' ceilings and temperatures are many: keep it bounded
                configs.clear()
            configs[cache] = config_for_request(loops[ask.loop], o, ask.answering)
        return configs[cache]

    async def models(request: Request) -> JSONResponse:
        key = await key_of(request)
        names = [n for n in loops if key is None or key.may_call(n)]
        entries = [{"id": n, "object": "model", "created": 0, "owned_by": "lanefold-loop"} for n in names]
        entries += [
            {"id": n, "object": "model", "created": 0, "owned_by": "lanefold"} for n in sorted(backend_names)
        ]
        return JSONResponse({"object": "list", "data": entries})

    async def runs(request: Request) -> JSONResponse:
        key = await key_of(request)
        run_id = request.path_params["run_id"]
        missing = HTTPError(404, f"no run {run_id!r}", param="run_id", code="run_not_found")
        try:
            if not store.exists(store.check_id(run_id)):
                raise missing
            state = _checked(store, run_id)
        except (ConfigError, OSError):
            raise missing from None
        except HTTPError:  # a record that does not check: told only to the key that made it
            if key is not None and _caller(store, run_id) != key.name:
                raise missing from None
            raise
        if key is not None and (state.started is None or state.started.caller != key.name):
            raise missing  # another key's run is none of this key's business
        return JSONResponse(run_record(store, run_id, state), headers={"x-lanefold-run-id": run_id})

    async def handle(request: Request, kind: str) -> Response:
        key = await key_of(request)
        raw = await read_body(request, max_body_bytes)
        data = parse_json(raw)
        model = data.get("model") if isinstance(data, dict) else None
        if not isinstance(model, str) or model not in loops:
            if backend_app is not None and model in backend_names:
                return _Delegated(backend_app, raw)
            raise HTTPError(404, model_not_found(model, loops, key), param="model", code="model_not_found")
        if key is not None and not key.may_call(model):
            raise HTTPError(404, model_not_found(model, loops, key), param="model", code="model_not_found")
        ask = parse_ask(model, kind, data)
        return await answer(request, ask, key)

    async def answer(request: Request, ask: Ask, key: GatewayKey | None) -> Response:
        caller = key.name if key is not None else None
        idempotency = request.headers.get("idempotency-key")
        request_id = request_id_of(request)
        run_id = None
        if idempotency is not None:
            if not idempotency.strip() or len(idempotency) > 255:
                raise HTTPError(400, "Idempotency-Key: 1 to 255 characters", param="Idempotency-Key")
            run_id = gateway_run_id(key.sha256 if key is not None else "", idempotency)
            recorded = _recorded(run_id, ask, request_id)
            if recorded is not None:
                return recorded
        else:
            run_id = store.new_id()
        go = Go(
            ask, run_id, caller, key, idempotency is not None, request_id, trace_context_of(request.headers)
        )
        admitted = (
            Admitted(None)
            if rates is None
            else await rates.admit(key, lambda: request_hold(config_for(ask), ask))
        )
        governed = admitted.around(run)
        headers = answer_headers(run_id, request_id, admitted)  # a stream's the same, sent first
        if ask.options.stream:
            return LoopStream(go, governed, stopping, clock, heartbeat_s, headers)
        done = await unless_disconnected(request, stopping, lambda: governed(go, None))
        if done is None:  # the client hung up: its run was interrupted (resumable)
            return Response(status_code=499)
        result, state = done
        return JSONResponse(response_body(ask, result, state, int(clock())), headers=headers)

    async def usage(request: Request) -> JSONResponse:
        """The calling key's own limits, spend, refusals and last use (`keys show`'s figures)."""
        key = await key_of(request)
        if key is None or rates is None:
            raise HTTPError(404, "usage is kept for keys kept in the store (serve --store-keys)")
        return JSONResponse(await rates.usage(key, store))

    def _recorded(run_id: str, ask: Ask, request_id: str) -> Response | None:
        """What an idempotent retry is answered from the record, as the fold of its log gives
        it (never a copy the fold did not check): the recorded response, a 422 for another
        body; None where the run is to be started or resumed. It computes nothing, so no
        bucket admitted it: its headers name the run and this request only."""
        if not store.exists(run_id):
            return None
        try:
            state = _checked(store, run_id)
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
            body = response_body(ask, result, state, int(clock()))
            headers = answer_headers(run_id, request_id, Admitted(None))
            if ask.options.stream:
                return Replay(body, headers)
            return JSONResponse(body, headers=headers)
        if state.failure is not None:  # told as it was when it failed
            if state.failure.error == BudgetExhaustedError.__name__:
                raise out_of_quota(state.failure.message)
            raise HTTPError(500, f"the run failed: {state.failure.message}", kind="server_error")
        return None

    @contextlib.contextmanager
    def slot(key: GatewayKey | None) -> Iterator[None]:
        """One of the key's `max_concurrency` slots for the block, given back however it ends
        (a refusal, an error, a stream that never started); none free: 429."""
        limiter = pools.limiter(key) if (pools is not None and key is not None) else None
        if limiter is None:
            yield
            return
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
            yield
        finally:
            limiter.release()

    async def run(go: Go, observer: Callable[[AnyEvent], None] | None) -> tuple[RunResult, RunState | None]:
        """The run of one request (or its resumption), holding one of its key's slots and
        spending from its key's budget (which the run records: whoever continues it, spends
        from it too)."""
        ask = go.ask
        with slot(go.key):
            result = await _governed(go, observer)
        if (
            result.status == "no_answer"
            and result.lanes_completed == 0
            and stopped_for_budget(result.outcome)
        ):
            # The key's budget could not fund the loop's first step: what the loop declares
            # (`budget_stop`, as an eval reads it), never a word of its reason.
            raise out_of_quota(result.reason or "the key's budget cannot fund the loop")
        state = None
        if ask.options.n > 1 or result.status == "no_answer":  # more choices, or a lane to serve
            state = await offload(read_state, store, result.run_id)
        return result, state

    async def _governed(go: Go, observer: Callable[[AnyEvent], None] | None) -> RunResult:
        ask = go.ask
        try:
            return await session.run(
                ask.question,
                run_id=go.run_id,
                resume=go.idempotent,
                config=config_for(ask),
                conversation=ask.conversation,
                turns_after=ask.turns_after,
                tools=ask.answering.tools or None,
                tool_choice=ask.answering.tool_choice,
                caller=go.caller,
                request_sha256=ask.digest,
                model=ask.loop,
                request_id=go.request_id,
                pools=pools.pools(go.key) if pools is not None else (),
                observer=observer,
                stop_reason=lambda: "client gone",
                trace_context=go.trace_context,
            )
        except RunInUseError:
            raise HTTPError(
                409,
                "the run of this Idempotency-Key is live elsewhere; retry when it ends",
                code="idempotency_key_in_use",
                headers={"Retry-After": "1"},
            ) from None
        except LanefoldError as exc:
            raise refused(exc) from None

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
            Route("/v1/usage", usage, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/runs/{run_id}", runs, methods=["GET"]),
        ],
        exception_handlers={HTTPError: on_http_error, LanefoldError: on_error, Exception: on_error},
    )
    app.state.stopping, app.state.session = stopping, session
    # What the server runs beside itself while it serves (`run_server`): the keys' reads.
    app.state.background = (keys.keep_fresh,) if isinstance(keys, StoreKeys) else ()
    return app
