"""`orchestrator serve --workers N`: N processes behind one port, supervised.

The port is bound once, in the supervising process; each worker is forked from it and accepts
on that same listening socket (the kernel hands each connection to one worker), so the backlog
outlives a worker: a connection waiting when a worker dies is taken by another. Forked, not
uvicorn's `workers=` (spawned processes re-reading their arguments through an import string):
the configs, keys file and socket checked before the fork are the workers' own. Each worker
opens its own store connection and builds and loads its own backends (an engine is loaded once
per worker). Keys, budgets, rate limits and idempotency are the store's, so shared.

A worker killed by a signal (SIGKILL, the OOM killer, a crash) is started again on the same
socket; one that exits by itself (a model that cannot load, a store that cannot be reached)
stops the others and the server exits with its code, rather than restarting it forever.
SIGINT or SIGTERM to the supervisor is passed to every worker once (a second one again, which
forces them out); workers sit in their own process group, so a terminal's Ctrl-C reaches them
through the supervisor only.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, ClassVar

from lanefold.primitives import LanefoldError

if TYPE_CHECKING:  # the serve extra's types: this module loads without it (the CLI imports it)
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ("WORKER_HEADER", "WorkerExitError", "WorkerHeader", "run_forked", "supervise")

_log = logging.getLogger("lanefold.serve")

WORKER_HEADER = "x-lanefold-worker"


class WorkerExitError(LanefoldError):
    """A worker exited by itself (not killed): the server stopped, exiting with the worker's
    code (`exited`, a subclass per code, so a worker's bad store URL is exit 2 as one
    process's is)."""

    exit_code: ClassVar[int] = 1

    @classmethod
    def exited(cls, pid: int, code: int) -> WorkerExitError:
        """The error of worker `pid` having exited with `code`."""
        kind: type[WorkerExitError] = type(cls.__name__, (cls,), {"exit_code": code, "__doc__": cls.__doc__})
        return kind(f"worker {pid} exited with code {code}; the server stopped")


class WorkerHeader:
    """ASGI middleware naming the worker that answered (its pid) in `x-lanefold-worker`: which
    process served a request, for a client, a test or a load test to see the spread."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.pid = str(os.getpid()).encode()  # made in the worker, after the fork

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (WORKER_HEADER.encode(), self.pid)],
                }
            await send(message)

        await self.app(scope, receive, named)


def _worker(work: Callable[[], None]) -> int:
    """In the forked child: `work()` (serving until told to stop); the exit code."""
    try:
        os.setpgid(0, 0)  # a terminal's Ctrl-C is the supervisor's to pass on, once
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)  # the supervisor's handlers are not ours
        work()
    except LanefoldError as exc:
        _log.error("worker %d: %s", os.getpid(), exc)
        return exc.exit_code
    except BaseException:
        _log.exception("worker %d failed", os.getpid())
        return 1
    return 0


def _spawn(work: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = _worker(work)
        logging.shutdown()
        os._exit(code)  # never back into the parent's stack (its CLI, its tests)
    return pid


def run_forked(work: Callable[[], None]) -> None:
    """`work()` in a forked process, waited for: what must happen once before the workers
    start (a keys file seeded into the store: N workers seeding it at once would race),
    done without this process opening a store connection its workers would inherit. A failure
    is WorkerExitError with the child's code (its own error logged by it)."""
    pid = _spawn(work)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise WorkerExitError.exited(pid, code)


def supervise(workers: int, sock: socket.socket, work: Callable[[socket.socket], None]) -> None:
    """Run `work(sock)` in `workers` forked processes until SIGINT or SIGTERM, starting a
    worker again when a signal kills it. A worker exiting by itself with a non-zero code ends
    the others and raises WorkerExitError with that code."""
    children: dict[int, int] = {}  # pid -> slot
    stopping: list[int] = []

    def stop(number: int, frame: FrameType | None) -> None:
        stopping.append(number)
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    failure: tuple[int, int] | None = None
    try:
        for slot in range(workers):
            children[_spawn(lambda: work(sock))] = slot
        _log.info("%d workers: %s", workers, ", ".join(str(pid) for pid in children))
        while children:
            pid, status = os.wait()
            place = children.pop(pid, None)
            if place is None or stopping:
                continue
            if os.WIFSIGNALED(status):
                new = _spawn(lambda: work(sock))
                children[new] = place
                _log.warning(
                    "worker %d killed by %s; started worker %d",
                    pid,
                    signal.Signals(os.WTERMSIG(status)).name,
                    new,
                )
                continue
            code = os.waitstatus_to_exitcode(status)
            failure = failure or (pid, code)
            stop(signal.SIGTERM, None)  # one gone by itself: the server goes with it
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        sock.close()
    if failure is not None and failure[1] != 0:
        raise WorkerExitError.exited(*failure)
