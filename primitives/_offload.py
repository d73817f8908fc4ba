"""Blocking calls from async code (a store's file or database change, a log's forced write):
in a worker thread, or on the event loop itself where a server that owns the loop serves
nothing else.

A worker thread keeps the event loop free for other work while the disk or the database
answers, and costs two wake-ups (the thread's, then the loop's): on the 2-core machine of
docs/gateway.md 0.1 to 0.6 ms each, six trips a gateway request. With nothing else to
serve, the freed loop serves nobody and a lone request waits those wake-ups in turn. So a
server that owns its event loop (`orchestrator serve`: `run_server`) marks each request it
serves (`serving`); while exactly one such request is in flight in the process, `offload`
makes that request's calls inline. Anything else (a library caller's own event loop, a
request among others, the server's background reads) keeps the thread: its loop may have
work this process cannot see.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar, TypeVarTuple

import anyio
import anyio.lowlevel
import anyio.to_thread

__all__ = ("offload", "serving")

T = TypeVar("T")
Args = TypeVarTuple("Args")

_SERVED: ContextVar[bool] = ContextVar("lanefold_served", default=False)
_lock = threading.Lock()  # servers on loops in several threads of one process (tests) count together
_in_flight = 0


@contextlib.contextmanager
def serving() -> Iterator[None]:
    """One request served by a server that owns this event loop, for the block; a block
    inside another counts once. Only such a server may mark its requests: the calls of a
    request alone in flight are then made on the loop (`offload`)."""
    global _in_flight
    if _SERVED.get():
        yield
        return
    token = _SERVED.set(True)
    with _lock:
        _in_flight += 1
    try:
        yield
    finally:
        with _lock:
            _in_flight -= 1
        _SERVED.reset(token)


def alone() -> bool:
    """Whether the caller is a served request (`serving`) and the only one in flight."""
    return _SERVED.get() and _in_flight == 1


async def offload(func: Callable[[*Args], T], *args: *Args) -> T:
    """`func(*args)`, a blocking call that neither waits for this event loop nor can be
    abandoned half-way: in a worker thread (`anyio.to_thread.run_sync`), or inline where
    the caller is the only request a server that owns the loop serves (`serving`). Either
    way a caller already cancelled is cancelled before the call, and the call, once made,
    runs to its end."""
    if alone():
        await anyio.lowlevel.checkpoint_if_cancelled()
        return func(*args)
    return await anyio.to_thread.run_sync(func, *args)
