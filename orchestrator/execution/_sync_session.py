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
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import anyio.from_thread

from lanefold.config import LoopConfig
from lanefold.execution._executor import Executor
from lanefold.execution._session import Session, VerifierLike
from lanefold.execution._store import Store
from lanefold.primitives import Backend, Hook, RunResult

__all__ = ("SyncSession",)

T = TypeVar("T")
P = ParamSpec("P")
_DONE = object()  # run_many's end, after its last result


def _blocking(
    method: Callable[Concatenate[Session, P], Awaitable[T]],
) -> Callable[Concatenate[SyncSession, P], T]:
    """`Session`'s coroutine method as a blocking one with the very same parameters: one place
    says them, so a type checker holds a SyncSession call to what the Session takes."""

    @functools.wraps(method)
    def blocking(self: SyncSession, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(functools.partial(method, self.session, *args, **kwargs))

    return blocking


def _iterating(
    method: Callable[Concatenate[Session, P], AsyncGenerator[RunResult, None]],
) -> Callable[Concatenate[SyncSession, P], Iterator[RunResult]]:
    """`Session.run_many` as an iterator over its results, with its very parameters."""

    @functools.wraps(method)
    def iterating(self: SyncSession, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[RunResult]:
        return self._results(functools.partial(method, self.session, *args, **kwargs))

    return iterating


class SyncSession:
    """`Session` for synchronous callers: the same arguments, the same methods, blocking.

    The config is checked when the SyncSession is made; its backends are built (the model
    loaded) on entering `with` or at the first call, and closed by `close()` or leaving the
    `with` block.
    """

    def __init__(
        self,
        config: LoopConfig | str | Path | None = None,
        *,
        backend: Backend | None = None,
        judge_backend: Backend | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        runs_dir: str | Path = "runs",
        verifier: VerifierLike | None = None,
        executor: Executor | str | None = None,
        store: str | Store | None = None,
        hooks: Sequence[Hook] = (),
        standing_pools: bool = False,
    ) -> None:
        self.session = Session(
            config,
            backend=backend,
            judge_backend=judge_backend,
            limiter=limiter,
            runs_dir=runs_dir,
            verifier=verifier,
            executor=executor,
            store=store,
            hooks=hooks,
            standing_pools=standing_pools,
        )
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

    def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` on the session's loop, until it ends; Ctrl-C here cancels it there (the run
        records its interrupt) and then re-raises."""
        portal = self._portal if self._portal is not None else self._open()
        return _Task(portal, call).wait()

    # `Session`'s methods, blocking, each with the Session method's own signature and docstring.
    run = _blocking(Session.run)
    resume = _blocking(Session.resume)
    reduce = _blocking(Session.reduce)
    run_many = _iterating(Session.run_many)

    def _results(self, many_of: Callable[[], AsyncGenerator[RunResult, None]]) -> Iterator[RunResult]:
        """`run_many`'s results as they finish. Stopping early interrupts the runs in flight."""
        portal = self._portal if self._portal is not None else self._open()
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()

        async def drive() -> None:
            try:
                async with contextlib.aclosing(many_of()) as many:
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
