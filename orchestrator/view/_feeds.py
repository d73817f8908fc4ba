"""The view's live feeds: server-sent events fed by the store's follow (a run's page parts as
its lanes land) and by polling its list (the runs list's rows as runs appear or change)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from lanefold.primitives import AnyEvent, LanefoldError, RunState, Store
from lanefold.primitives.internal import apply
from lanefold.view._search import RunSearch
from lanefold.view._templates import live_parts, runs_rows

__all__ = ("PAGE_SIZE", "RunFeed", "watch_runs")

PAGE_SIZE = 50
_POLL_S = 1.0  # how often the runs list's live feed looks for new runs and statuses
_BURST_S = 0.1  # a live run page's updates: at most one per this long while lanes land
_QUIET_S = 15.0  # a comment line this often keeps an idle feed's connection open


def _sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


class RunFeed:
    """A run's page parts as server-sent events, from the store's follow, until the run ends.

    The follow runs in a task of its own, handing events over a memory stream, so that
    waiting with a deadline (a burst's end, a keep-alive) never cancels the follow itself.
    Events that arrive within `_BURST_S` of a burst's first go out as one update: a wave of a
    thousand lanes is a few updates, not a thousand pages. The timeline gets the events after
    sequence `after` (what the page already shows)."""

    def __init__(self, store: Store, run_id: str, after: int, where: Sequence[str]) -> None:
        self.store, self.run_id, self.after, self.where = store, run_id, after, where
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
        every: list[AnyEvent] = []  # the run's events so far: what its waterfall is drawn from
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
                        every.append(event)
                except LanefoldError as exc:
                    yield _sse("refused", {"line": f"orchestrator show: {exc}"})
                    return
                shown = [e for e in new if e.sequence > self.after]
                yield _sse("parts", live_parts(state, every, shown, self.where))
            elif not ended:
                yield b": still here\n\n"
        yield _sse("end", {})


async def watch_runs(store: Store, search: RunSearch) -> AsyncIterator[bytes]:
    """The first page of the runs `search` finds again whenever a run appears or changes status."""
    seen: list[tuple[str, str]] = []
    while True:
        found = await anyio.to_thread.run_sync(lambda: search.runs(store, PAGE_SIZE))
        now: list[tuple[str, str]] = [(s.run_id, s.status) for s in found]
        if now != seen:
            seen = now
            yield _sse("rows", {"html": runs_rows(found)})
        else:
            yield b": still here\n\n"
        await anyio.sleep(_POLL_S)
