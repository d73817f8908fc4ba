"""The view's starlette app: pages over a store drawn from templates, live feeds fed by its
follow, a Content-Security-Policy on every answer.

Read-only: nothing here writes to the store. With an API key, every request carries it (a
`Authorization: Bearer` header, or the cookie the login form sets), else the login form (401).
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from lanefold.execution import read_run
from lanefold.primitives import (
    BudgetStore,
    ConfigError,
    LanefoldError,
    RunNotFoundError,
    Store,
    check_key_name,
)
from lanefold.primitives.events import RunStarted
from lanefold.view._charts import pareto
from lanefold.view._comparisons import list_comparisons, read_record, record_context
from lanefold.view._evals import SCORES, eval_context, eval_points, watch_eval
from lanefold.view._feeds import PAGE_SIZE, RunFeed, watch_runs
from lanefold.view._keys import key_context, keys_context
from lanefold.view._policy import COOKIE, CSP, Policy, guard, login_form
from lanefold.view._search import FIELDS, RunSearch
from lanefold.view._templates import pages, run_context

__all__ = ("CSP", "create_app")

_STATIC = Path(__file__).with_name("static")
_BUDGET_RUNS = 200  # the recent runs the budgets page reads for the budgets they name


def create_app(
    store: Store,
    *,
    api_key: str | None = None,
    resume_flags: Sequence[str] | None = None,
    runs_dir: str | Path = "runs",
) -> Starlette:
    """The view of `store`; `resume_flags` are what `orchestrator resume` needs to find it;
    `runs_dir` is where `compare` and `sweep` wrote their records (`--runs-dir`, whatever the
    store)."""
    where = list(resume_flags or ())
    records = Path(runs_dir)

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        return pages.TemplateResponse(request, name, context, status_code=status_code)

    def refusal(request: Request, title: str, line: str, status_code: int) -> Response:
        return page(request, "error.html", status_code, title=title, line=line, live=None)

    async def runs(request: Request) -> Response:
        try:
            number = max(int(request.query_params.get("page", "0") or "0"), 0)
            search = RunSearch.read(request.query_params)
        except ValueError as exc:
            return refusal(request, "runs", f"bad filter: {exc}", 400)
        found = await anyio.to_thread.run_sync(lambda: search.runs(store, (number + 1) * PAGE_SIZE + 1))
        evals = await anyio.to_thread.run_sync(store.list_evals) if number == 0 else []
        filters = search.shown()
        live = f"/live/runs?{urlencode(filters)}" if number == 0 else None
        return page(
            request,
            "runs.html",
            title="runs",
            live=live,
            found=found[number * PAGE_SIZE : (number + 1) * PAGE_SIZE],
            fields=FIELDS,
            filters=filters,
            page=number,
            more=len(found) > (number + 1) * PAGE_SIZE,
            evals=evals[:20],
        )

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
            return refusal(request, "no such run", why, 400)
        try:
            events, state, _ = await anyio.to_thread.run_sync(lambda: read_run(store, run_id))
            ended = state.finished or state.interrupted is not None
            cut_off = not ended and not await anyio.to_thread.run_sync(store.writing, run_id)
        except RunNotFoundError as exc:
            return refusal(request, "no such run", str(exc), 404)
        except LanefoldError as exc:  # a corrupt or spliced log: the CLI's refusal, one line
            return refusal(request, f"run {run_id}", f"orchestrator show: {exc}", 422)
        return pages.TemplateResponse(
            request, "run.html", run_context(run_id, events, state, where, cut_off=cut_off)
        )

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
        return RunFeed(store, run_id, after, where)  # type: ignore[return-value]  # an ASGI app answers

    async def live_runs(request: Request) -> Response:
        try:
            search = RunSearch.read(request.query_params)
        except ValueError as exc:
            return Response(f"bad filter: {exc}\n", status_code=400)
        return StreamingResponse(watch_runs(store, search), media_type="text/event-stream")

    async def eval_view(request: Request) -> Response:
        eval_id = request.path_params["eval_id"]
        if (why := malformed(eval_id)) is not None:
            return refusal(request, "no such eval", why, 400)
        score = request.query_params.get("score", "")
        if score and score not in SCORES:
            return refusal(request, f"eval {eval_id}", f"score: {score!r} is not right or wrong", 400)
        record = store.eval_record(eval_id)
        if not record.exists():
            return refusal(request, "no such eval", f"no eval {eval_id!r} in {store.describe}", 404)
        try:
            context = await anyio.to_thread.run_sync(lambda: eval_context(store, eval_id, score, where))
        except LanefoldError as exc:
            return refusal(request, f"eval {eval_id}", f"orchestrator show: {exc}", 422)
        return pages.TemplateResponse(request, "eval.html", context)

    async def live_eval(request: Request) -> Response:
        eval_id = request.path_params["eval_id"]
        if (why := malformed(eval_id)) is not None:
            return Response(f"{why}\n", status_code=400)
        score = request.query_params.get("score", "")
        if (score and score not in SCORES) or not store.eval_record(eval_id).exists():
            return Response("no such eval\n", status_code=404)
        return StreamingResponse(watch_eval(store, eval_id, score), media_type="text/event-stream")

    async def evals(request: Request) -> Response:
        prefix = request.query_params.get("prefix", "")
        points, pilots = await anyio.to_thread.run_sync(lambda: eval_points(store, prefix))
        found = await anyio.to_thread.run_sync(lambda: list_comparisons(records))
        return page(
            request,
            "evals.html",
            title="evals",
            live=None,
            prefix=prefix,
            points=points,
            pilots=pilots,
            plot=pareto(points),
            comparisons=[(kind, i) for kind, i in found if i.startswith(prefix)],
        )

    def comparison(kind: str) -> Callable[[Request], Awaitable[Response]]:
        async def shown(request: Request) -> Response:
            record_id = request.path_params["record_id"]
            if (why := malformed(record_id)) is not None:
                return refusal(request, f"no such {kind}", why, 400)
            try:
                found = await anyio.to_thread.run_sync(lambda: read_record(records, kind, record_id))
            except ConfigError as exc:  # a record that is not one: the file named, one line
                return refusal(request, f"{kind} {record_id}", f"orchestrator view: {exc}", 422)
            if found is None:
                return refusal(request, f"no such {kind}", f"no {kind} {record_id!r} in {records}", 404)
            return pages.TemplateResponse(request, f"{kind}.html", record_context(found, where))

        return shown

    async def budgets(request: Request) -> Response:
        if not isinstance(store, BudgetStore):
            note = f"{store.describe} keeps no named budgets (the files and PostgreSQL stores do)"
            return page(
                request, "budgets.html", title="budgets", live=None, note=note, budgets=[], spending={}
            )
        spending = await anyio.to_thread.run_sync(lambda: _budget_runs(store))
        names = [n for n in request.query_params.getlist("name") if n] or list(spending)
        found = [v for n in names if (v := await anyio.to_thread.run_sync(store.read_budget, n)) is not None]
        return page(
            request, "budgets.html", title="budgets", live=None, note=None, budgets=found, spending=spending
        )

    async def keys(request: Request) -> Response:
        found = await anyio.to_thread.run_sync(lambda: keys_context(store))
        return page(request, "keys.html", title="keys", live=None, **found)

    async def key(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            check_key_name(name)
        except ConfigError as exc:
            return refusal(request, "no such key", str(exc), 400)
        found = await anyio.to_thread.run_sync(lambda: key_context(store, name))
        if found is None:
            return refusal(request, "no such key", f"no key {name!r} in {store.describe}", 404)
        return page(request, "key.html", title=f"key {name}", live=None, **found)

    async def login(request: Request) -> Response:
        if request.method == "GET":
            return login_form(request, False)
        body = await request.body()  # a urlencoded form of one field (no multipart parser needed)
        given = parse_qs(body[:4096].decode("utf-8", "replace")).get("key", [""])[0]
        if api_key is None or not hmac.compare_digest(given.encode(), api_key.encode()):
            return login_form(request, True)
        done = RedirectResponse("/", status_code=303)
        done.set_cookie(COOKIE, given, httponly=True, samesite="strict")
        return done

    async def refused(request: Request, exc: Exception) -> Response:
        # What was asked cannot be (a ConfigError: a filter no store takes) is the asker's, 400;
        # a store that cannot be read (StoreError, a log that will not open) is the server's, 503.
        status = 400 if type(exc) is ConfigError else 503
        return refusal(request, "refused", f"orchestrator view: {exc}", status)

    asked = [] if api_key is None else [Middleware(BaseHTTPMiddleware, dispatch=guard(api_key))]
    return Starlette(
        middleware=[Middleware(Policy), *asked],
        exception_handlers={LanefoldError: refused},
        routes=[
            Route("/", runs),
            Route("/runs/{run_id}", run),
            Route("/live/runs/{run_id}", live_run),
            Route("/live/runs", live_runs),
            Route("/evals", evals),
            Route("/evals/{eval_id}", eval_view),
            Route("/live/evals/{eval_id}", live_eval),
            Route("/compares/{record_id}", comparison("compare")),
            Route("/sweeps/{record_id}", comparison("sweep")),
            Route("/budgets", budgets),
            Route("/keys", keys),
            Route("/keys/{name}", key),
            Route("/login", login, methods=["GET", "POST"]),
            Mount("/static", StaticFiles(directory=_STATIC), name="static"),
        ],
    )


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
