"""A Session for synchronous code: one loaded model across calls, from a script, a sync agent
or a notebook whose event loop is already running.

    with orchestrator.SyncSession("loop.toml") as session:
        for question in questions:                  # one model load for all of them
            result = session.run(question)
        for result in session.run_many(questions, run_ids=ids, resume=True, errors="return"):
            ...

The Session lives on an event loop of its own in a worker thread (an anyio blocking portal),
so calls work the same whether or not the calling thread runs a loop. Ctrl-C in a call
cancels its runs, which record their interrupt (resumable) before KeyboardInterrupt is
re-raised; leaving a `run_many` loop early interrupts the runs still in flight.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import anyio.from_thread

from lanefold.config import LoopConfig
from lanefold.execution._result import RunResult
from lanefold.execution._session import Session

__all__ = ("SyncSession",)

T = TypeVar("T")
_DONE = object()  # run_many's end, after its last result


class SyncSession:
    """`Session` for synchronous callers: the same arguments, the same methods, blocking.

    The config is checked when the SyncSession is made; its backends are built (the model
    loaded) on entering `with` or at the first call, and closed by `close()` or leaving the
    `with` block.
    """

    def __init__(self, config: LoopConfig | str | Path | None = None, **kwargs: Any) -> None:
        self.session = Session(config, **kwargs)
        self._portal_cm: contextlib.AbstractContextManager[anyio.from_thread.BlockingPortal] | None
        self._portal_cm = None
        self._portal: anyio.from_thread.BlockingPortal | None = None

    def __enter__(self) -> SyncSession:
        self._open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def config(self) -> LoopConfig:
        return self.session.config

    def _open(self) -> anyio.from_thread.BlockingPortal:
        if self._portal is None:
            self._portal_cm = anyio.from_thread.start_blocking_portal()
            self._portal = self._portal_cm.__enter__()
            try:
                self._call(self.session.__aenter__)
            except BaseException:
                self.close()
                raise
        return self._portal

    def close(self) -> None:
        """Close the backends the session built and stop its event loop thread."""
        portal_cm, portal = self._portal_cm, self._portal
        self._portal_cm = self._portal = None
        if portal_cm is None or portal is None:
            return
        try:
            portal.call(self.session.aclose)
        finally:
            portal_cm.__exit__(None, None, None)

    def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the session's loop, until it ends; Ctrl-C here cancels
        it there (the run records its interrupt) and then re-raises."""
        portal = self._portal if self._portal is not None else self._open()
        return _Task(portal, functools.partial(fn, *args, **kwargs)).wait()

    def run(self, question: str, **kwargs: Any) -> RunResult:
        """`Session.run`: one question (`run_id`, `resume`, `errors`, `observer` as there)."""
        return self._call(self.session.run, question, **kwargs)

    def resume(self, run_id: str, **kwargs: Any) -> RunResult:
        """`Session.resume`: continue a run from its log (a finished one: its record)."""
        return self._call(self.session.resume, run_id, **kwargs)

    def reduce(self, run_id: str, *, reducer: str, **kwargs: Any) -> RunResult:
        """`Session.reduce`: reduce a finished run's lanes again, without sampling."""
        return self._call(self.session.reduce, run_id, reducer=reducer, **kwargs)

    def run_many(self, questions: Iterable[str], **kwargs: Any) -> Iterator[RunResult]:
        """`Session.run_many`, its results as they finish (`concurrency`, `run_ids`,
        `resume`, `errors` as there). Stopping early interrupts the runs in flight."""
        portal = self._portal if self._portal is not None else self._open()
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def drive() -> None:
            try:
                async with contextlib.aclosing(self.session.run_many(questions, **kwargs)) as many:
                    async for result in many:
                        results.put(result)
            finally:
                results.put(_DONE)

        task = _Task(portal, drive)
        ended = False
        try:
            while (item := results.get()) is not _DONE:
                yield item
            ended = True
        finally:
            if not ended:  # the caller stopped early (or Ctrl-C): so do the runs in flight
                task.stop()
        task.wait()  # the batch's own error, if it ended with one


class _Task(Generic[T]):
    """A call running on the portal's loop, which a blocked caller can stop and outwait."""

    def __init__(self, portal: anyio.from_thread.BlockingPortal, call: Callable[[], Awaitable[T]]) -> None:
        self.ended = threading.Event()

        async def guarded() -> T:
            try:
                return await call()
            finally:
                self.ended.set()

        self.future: concurrent.futures.Future[T] = portal.start_task_soon(guarded)

    def wait(self) -> T:
        """The call's result; Ctrl-C meanwhile stops it (its runs record the interrupt)."""
        try:
            return self.future.result()
        except KeyboardInterrupt:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel the call unless it ended, and wait until it has (interrupts recorded)."""
        self.future.cancel()
        self.ended.wait()
