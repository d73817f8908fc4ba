"""SIGINT and SIGTERM in the `orchestrator` command, from its first line to its exit.

One handler for both signals, installed by `main` and kept to the end, answers each by where
the command is:

- starting (nothing recorded yet): the signal raises `Stopped` (a KeyboardInterrupt), which
  `main` turns into exit 130 or 143 with at most one line;
- working (`watch`, around the event loop of a run, an eval, a follower): the signal's number
  reaches a task of the loop through the wake-up socket (`signal.set_wakeup_fd`), and that
  task stops the work, which records the stop; further signals are absorbed;
- decided (the record is complete, or the work ended one way or another): ignored, so the
  command exits with its own code, whatever arrives.

The handler never leaves its place to another's default between these, so no signal finds
the process without an answer (asyncio's own signal handling restores the defaults when it
is done, which is how a signal after a complete record used to kill the process).
Before `main` runs, while the command's modules import (`importing_quietly`), SIGINT is
Python's own KeyboardInterrupt and SIGTERM raises `Stopped`, which `orchestrator.cli._main` turns
into a quiet exit 130 or 143.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

__all__ = (
    "EXIT_CODES",
    "Stopped",
    "Watch",
    "command_signals",
    "decided",
    "importing_quietly",
    "pause_point",
    "watch",
)

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}
Phase = Literal["starting", "working", "decided"]


class Stopped(KeyboardInterrupt):
    """A signal that arrived while the command was starting: nothing is recorded yet."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signal_name, 130)


class _Policy:
    """The handler and the phase it answers by."""

    def __init__(self) -> None:
        self.phase: Phase = "starting"

    def handle(self, signum: int, frame: Any) -> None:
        if self.phase == "starting":
            raise Stopped(signal.Signals(signum).name)
        # working: the number is on the wake-up socket, for `Watch.arrivals`; decided: ignored


_current: _Policy | None = None  # the process's signals are one; so is their policy


@contextlib.contextmanager
def command_signals(*, own_process: bool) -> Iterator[None]:
    """SIGINT and SIGTERM answered by the command's policy within the block (the starting
    phase to begin with). `own_process`: the process is the command's (its own command line),
    so once the block ends both are ignored until it exits; otherwise (a test, a program
    calling `main`) the handlers found are put back."""
    global _current
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may handle signals; elsewhere they stay the caller's
        return
    policy, outer = _Policy(), _current
    found = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, policy.handle)
    _current = policy
    try:
        yield
    finally:
        policy.phase = "decided"
        _current = outer
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN if own_process else (found[sig] or signal.SIG_DFL))


def decided() -> None:
    """The command's end is decided: signals from now on are ignored."""
    if _current is not None:
        _current.phase = "decided"


@contextlib.contextmanager
def importing_quietly() -> Iterator[None]:
    """Within the block (the command's imports, before `main`), SIGTERM raises `Stopped` as
    SIGINT raises KeyboardInterrupt, so the importer can end either quietly; the handler found
    is put back after, so importing the module changes nothing for whoever imports it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    found = signal.signal(signal.SIGTERM, _stop_at_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, found if found is not None else signal.SIG_DFL)


def _stop_at_once(signum: int, frame: Any) -> None:
    raise Stopped(signal.Signals(signum).name)


class Watch:
    """The signals that arrive while a command works, read in its event loop."""

    def __init__(self, reader: socket.socket | None) -> None:
        self._reader = reader

    async def arrivals(self) -> AsyncIterator[str]:
        """The name of each SIGINT or SIGTERM as it arrives (none where signals cannot be
        watched: off the main thread)."""
        import anyio

        if self._reader is None:
            await anyio.sleep_forever()
            return
        while True:
            await anyio.wait_readable(self._reader)
            try:
                numbers = self._reader.recv(64)
            except BlockingIOError:
                continue
            for number in numbers:
                if number in SIGNALS:
                    yield signal.Signals(number).name


@contextlib.contextmanager
def watch() -> Iterator[Watch]:
    """Within the block the command works: signals are told to `Watch.arrivals` instead of
    raising; when it ends, the command's end is decided (later signals are ignored). Outside
    `command_signals` (a caller of `_interruptible` of its own) the block sets up the handler
    for its own length."""
    if threading.current_thread() is not threading.main_thread():
        yield Watch(None)
        return
    with contextlib.ExitStack() as stack:
        if _current is None:
            stack.enter_context(command_signals(own_process=False))
        policy = _current
        assert policy is not None
        reader, writer = socket.socketpair()
        stack.callback(reader.close)
        stack.callback(writer.close)
        reader.setblocking(False)
        writer.setblocking(False)
        # The fd first, then the phase: a signal in between is told both ways, never lost.
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        stack.callback(signal.set_wakeup_fd, previous)
        for sig in SIGNALS:  # a library the command loaded (Ray) may have put in its own
            signal.signal(sig, policy.handle)
        policy.phase = "working"
        try:
            yield Watch(reader)
        finally:
            policy.phase = "decided"


def pause_point(name: str) -> None:
    """A test hook: with `LANEFOLD_TEST_PAUSE=<name>:<path>`, the command, on reaching the
    moment `name`, creates `<path>.reached` and waits until `<path>` exists, so a test can send
    a signal at that moment of its life without timing it. Does nothing otherwise."""
    point, _, path = os.environ.get("LANEFOLD_TEST_PAUSE", "").partition(":")
    if point != name or not path:
        return
    with open(f"{path}.reached", "w"):
        pass
    while not os.path.exists(path):  # a signal's handler runs at each wake-up
        time.sleep(0.005)
