"""The view's starlette app: pages over a store, server-sent events fed by its follow.

Read-only: nothing here writes to the store. With an API key, every request carries it (a
`Authorization: Bearer` header, or the cookie the login form sets), else the login form (401).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lanefold.evaluate import read_manifest, read_results, read_summary
from lanefold.execution import read_run
from lanefold.primitives import (
    AnyEvent,
    BudgetStore,
    ConfigError,
    LanefoldError,
    RunNotFoundError,
    RunState,
    Store,
)
from lanefold.primitives.events import RunStarted
from lanefold.primitives.internal import apply
from lanefold.serve import twice_sent
from lanefold.view._pages import (
    budgets_page,
    error_page,
    eval_page,
    evals_page,
    live_parts,
    login_page,
    run_page,
    runs_page,
    runs_rows,
)

__all__ = ("create_app",)

PAGE_SIZE = 50
_COOKIE = "lanefold_view_key"
_STATIC = Path(__file__).with_name("static")
_BUDGET_RUNS = 200  # the recent runs the budgets page reads for the budgets they name
_POLL_S = 1.0  # how often the runs list's live feed looks for new runs and statuses
_BURST_S = 0.1  # a live run page's updates: at most one per this long while lanes land
_QUIET_S = 15.0  # a comment line this often keeps an idle feed's connection open


def create_app(
    store: Store, *, api_key: str | None = None, resume_flags: list[str] | None = None
) -> Starlette:
    """The view of `store`; `resume_flags` are what `orchestrator resume` needs to find it."""
    flags = resume_flags or []

    async def runs(request: Request) -> Response:
        filters = {
            k: v for k in ("status", "loop", "eval", "since") if (v := request.query_params.get(k, ""))
        }
        try:
            page = max(int(request.query_params.get("page", "0")), 0)
            since = datetime.fromisoformat(filters["since"]) if "since" in filters else None
            if since is not None and since.tzinfo is None:
                since = since.replace(tzinfo=UTC)  # a time without a zone: UTC, as the log's times are
        except ValueError as exc:
            return HTMLResponse(error_page("runs", f"bad filter: {exc}"), status_code=400)
        found = await anyio.to_thread.run_sync(
            lambda: store.list_runs(
                status=filters.get("status"),
                loop=filters.get("loop"),
                eval_id=filters.get("eval"),
                since=since,
                limit=(page + 1) * PAGE_SIZE + 1,
            )
        )
        shown = found[page * PAGE_SIZE : (page + 1) * PAGE_SIZE]
        evals = await anyio.to_thread.run_sync(store.list_evals) if page == 0 else []
        more = len(found) > (page + 1) * PAGE_SIZE
        return HTMLResponse(runs_page(shown, filters, page=page, more=more, evals=evals[:20]))

    def malformed(raw: str) -> str | None:
        """Why `raw` can be no run's or eval's id (the store's own rule), or None."""
        try:
            store.check_id(raw)
        except ConfigError as exc:
            return str(exc)
        return None

    async def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if (why := malformed(run_id)) is not None:
            return HTMLResponse(error_page("no such run", why), status_code=400)
        try:
            events, state, _ = await anyio.to_thread.run_sync(lambda: read_run(store, run_id))
            ended = state.result is not None or state.failure is not None or state.interrupted is not None
            cut_off = not ended and not await anyio.to_thread.run_sync(store.writing, run_id)
        except RunNotFoundError as exc:
            return HTMLResponse(error_page("no such run", str(exc)), status_code=404)
        except LanefoldError as exc:  # a corrupt or spliced log: the CLI's refusal, one line
            return HTMLResponse(error_page(f"run {run_id}", f"orchestrator show: {exc}"), status_code=422)
        return HTMLResponse(run_page(run_id, events, state, flags, cut_off=cut_off))

    async def live_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if (why := malformed(run_id)) is not None:
            return Response(f"{why}\n", status_code=400)
        if not store.exists(run_id):
            return Response("no such run\n", status_code=404)
        try:
            after = int(request.query_params.get("after", "0"))
        except ValueError:
            after = 0
        return _RunFeed(store, run_id, after)  # type: ignore[return-value]  # an ASGI app answers

    async def live_runs(request: Request) -> Response:
        filters = {k: v for k in ("status", "loop", "eval") if (v := request.query_params.get(k, ""))}
        return StreamingResponse(_watch_runs(store, filters), media_type="text/event-stream")

    async def eval_view(request: Request) -> Response:
        eval_id = request.path_params["eval_id"]
        if (why := malformed(eval_id)) is not None:
            return HTMLResponse(error_page("no such eval", why), status_code=400)
        record = store.eval_record(eval_id)
        if not record.exists():
            return HTMLResponse(error_page("no such eval", f"no eval {eval_id!r} in {store.describe}"), 404)
        try:
            summary = read_summary(record)
            rows = read_results(record)
        except LanefoldError as exc:
            return HTMLResponse(error_page(f"eval {eval_id}", f"orchestrator show: {exc}"), status_code=422)
        data = [
            {
                "id": r.index,
                "correct": r.correct,
                "agreement": _agreement(r.answer, r.lane_answers),
                "cost_usd": f"{r.cost:.6f}",
                "run_id": r.run_id,
            }
            for _, r in sorted(rows.items())
        ]
        shown = summary.model_dump(mode="json") if summary is not None else None
        return HTMLResponse(eval_page(eval_id, shown, data))

    async def evals(request: Request) -> Response:
        prefix = request.query_params.get("prefix", "")

        def read() -> list[tuple[str, float, float, float, float, bool]]:
            points = []
            for eval_id in store.list_evals():
                if not eval_id.startswith(prefix):
                    continue
                summary = read_summary(store.eval_record(eval_id))
                if summary is not None:
                    low, high = summary.interval
                    fitted = read_manifest(store, eval_id).fitted_to  # the equal budget it had
                    over = fitted is not None and fitted.over(summary)
                    points.append((eval_id, summary.accuracy, low, high, summary.mean_cost, over))
            return points

        return HTMLResponse(evals_page(await anyio.to_thread.run_sync(read), prefix))

    async def budgets(request: Request) -> Response:
        if not isinstance(store, BudgetStore):
            return HTMLResponse(
                budgets_page(
                    [], f"{store.describe} keeps no named budgets (the files and PostgreSQL stores do)"
                )
            )
        spending = await anyio.to_thread.run_sync(lambda: _budget_runs(store))
        names = [n for n in request.query_params.getlist("name") if n] or list(spending)
        found = [v for n in names if (v := await anyio.to_thread.run_sync(store.read_budget, n)) is not None]
        return HTMLResponse(budgets_page(found, None, spending))

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return HTMLResponse(login_page(False), status_code=401)
        body = await request.body()  # a urlencoded form of one field (no multipart parser needed)
        given = parse_qs(body[:4096].decode("utf-8", "replace")).get("key", [""])[0]
        if api_key is None or not hmac.compare_digest(given.encode(), api_key.encode()):
            return HTMLResponse(login_page(True), status_code=401)
        done = RedirectResponse("/", status_code=303)
        done.set_cookie(_COOKIE, given, httponly=True, samesite="strict")
        return done

    async def refused(request: Request, exc: Exception) -> Response:
        # What was asked cannot be (a ConfigError: a filter no store takes) is the asker's, 400;
        # a store that cannot be read (StoreError, a log that will not open) is the server's, 503.
        status = 400 if type(exc) is ConfigError else 503
        return HTMLResponse(error_page("refused", f"orchestrator view: {exc}"), status_code=status)

    guard = [] if api_key is None else [Middleware(BaseHTTPMiddleware, dispatch=_guard(api_key))]
    return Starlette(
        middleware=guard,
        exception_handlers={LanefoldError: refused},
        routes=[
            Route("/", runs),
            Route("/runs/{run_id}", run),
            Route("/live/runs/{run_id}", live_run),
            Route("/live/runs", live_runs),
            Route("/evals", evals),
            Route("/evals/{eval_id}", eval_view),
            Route("/budgets", budgets),
            Route("/login", login, methods=["GET", "POST"]),
            Mount("/static", StaticFiles(directory=_STATIC), name="static"),
        ],
    )


def _guard(key: str) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path == "/login" or request.url.path.startswith("/static/"):
            return await call_next(request)
        sent = request.headers.getlist("authorization")
        if (twice := twice_sent(sent)) is not None:
            return HTMLResponse(error_page("refused", twice), status_code=400)
        bearer = sent[0] if sent else ""
        given = bearer[7:] if bearer.lower().startswith("bearer ") else request.cookies.get(_COOKIE, "")
        if hmac.compare_digest(given.encode(), key.encode()):
            return await call_next(request)
        return HTMLResponse(login_page(False), status_code=401)

    return check


def _agreement(answer: str | None, lanes: list[str | None]) -> str:
    return f"{sum(a == answer for a in lanes) / len(lanes):.2f}" if lanes and answer is not None else ""


def _budget_runs(store: Store) -> dict[str, list[str]]:
    """The named budgets the store's recent runs spend from (their `run.started` `pools`; a log
    from before pools were recorded: its `[budget] shared`), each with its runs."""
    spending: dict[str, list[str]] = {}
    for summary in store.list_runs(limit=_BUDGET_RUNS):
        first = next(iter(store.reader(summary.run_id).read()), None)
        if not isinstance(first, RunStarted):
            continue
        pools = first.data.pools
        if pools is None:
            shared = (first.data.config.get("budget") or {}).get("shared")
            pools = [shared] if isinstance(shared, str) else []
        for name in pools:
            spending.setdefault(name, []).append(summary.run_id)
    return spending


def _sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class _RunFeed:
    """A run's page parts as server-sent events, from the store's follow, until the run ends.

    The follow runs in a task of its own, handing events over a memory stream, so that
    waiting with a deadline (a burst's end, a keep-alive) never cancels the follow itself.
    Events that arrive within `_BURST_S` of a burst's first go out as one update: a wave of a
    thousand lanes is a few updates, not a thousand pages. The timeline gets the events after
    sequence `after` (what the page already shows)."""

    def __init__(self, store: Store, run_id: str, after: int) -> None:
        self.store, self.run_id, self.after = store, run_id, after
        self.refused: LanefoldError | None = None  # what the follow refused (a line not the run's)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")],
            }
        )
        sender, events = anyio.create_memory_object_stream[AnyEvent](1024)
        async with events, anyio.create_task_group() as tg:

            async def follow() -> None:
                log = self.store.reader(self.run_id).follow()
                async with sender:
                    try:
                        async for event in log:
                            await sender.send(event)
                    except LanefoldError as exc:  # told on the page, one line; the view stays up
                        self.refused = exc
                    finally:
                        aclose = getattr(log, "aclose", None)
                        if aclose is not None:
                            await aclose()

            async def gone() -> None:  # the page closed: stop following
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(follow)
            tg.start_soon(gone)
            async for chunk in self._chunks(events):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()

    async def _chunks(self, events: MemoryObjectReceiveStream[AnyEvent]) -> AsyncIterator[bytes]:
        state = RunState(source=self.store.location(self.run_id), expected_run_id=self.run_id)
        ended = False
        while not ended:
            new: list[AnyEvent] = []
            with anyio.move_on_after(_QUIET_S):
                try:
                    new.append(await events.receive())
                except anyio.EndOfStream:
                    ended = True
            if new:
                with anyio.move_on_after(_BURST_S):
                    try:
                        while True:
                            new.append(await events.receive())
                    except anyio.EndOfStream:
                        ended = True
                try:
                    for event in new:
                        apply(state, event)  # refuses a line that is not this run's own
                except LanefoldError as exc:
                    yield _sse("refused", {"line": f"orchestrator show: {exc}"})
                    return
                yield _sse("parts", live_parts(state, [e for e in new if e.sequence > self.after]))
            elif not ended:
                yield b": still here\n\n"
        yield _sse("end", {})


async def _watch_runs(store: Store, filters: dict[str, str]) -> AsyncIterator[bytes]:
    """The first page of the runs list again whenever a run appears or changes status."""
    seen: list[tuple[str, str]] = []
    while True:
        found = await anyio.to_thread.run_sync(
            lambda: store.list_runs(
                status=filters.get("status"),
                loop=filters.get("loop"),
                eval_id=filters.get("eval"),
                limit=PAGE_SIZE,
            )
        )
        now: list[tuple[str, str]] = [(s.run_id, s.status) for s in found]
        if now != seen:
            seen = now
            yield _sse("rows", {"html": runs_rows(found)})
        else:
            yield b": still here\n\n"
        await anyio.sleep(_POLL_S)
