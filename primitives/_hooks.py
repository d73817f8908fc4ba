"""Hooks: plug-ins that watch a run and can never break it.

A hook has `on_event(event)` (every event as it is recorded, one of `AnyEvent`) and
`on_run_end(result)` (the run's `RunResult`), each optional, each sync or async: `Hook` is
either protocol (`EventHook`, `EndHook`), so a type checker holds a hook to the signatures the
runner calls. The `HookRunner` gives each hook its own
bounded queue, drained by its own task, so the dispatch path only ever puts an event in a queue:

- a slow or hanging (async) hook never stalls the run; past `QUEUE_LIMIT` events waiting for one hook,
  later ones are dropped for it, counted (`HookRunner.dropped`) and logged once;
- a hook that raises (anything: `SystemExit` and `KeyboardInterrupt` too) is logged once per
  hook and run (logger `lanefold.hooks`) and keeps getting later events; the run's answer,
  votes and log are the same as without it;
- at the run's end each hook gets at most `END_TIMEOUT_S` seconds to finish its queue and its
  `on_run_end`; what is left then is abandoned (and logged);
- `on_run_end` gets its own deep copy of the result, so no hook can change what the caller
  (or `run --json`) is given, nor what another hook sees.

A sync hook is called in a daemon thread of its own, the events that waited for it handed over
in one batch, so one that blocks (a slow terminal, a network call, a `time.sleep`) holds up only
itself, and a call still blocked when the end's bound passes is abandoned with its thread: the
process exits without waiting for it. Calls to one hook object never overlap, even from runs side
by side. Hooks are built by `HOOKS` (`@register_hook("name")`, entry points in group
`lanefold.hooks`, or `module:attr`).
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Protocol, TypeAlias, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import BaseModel

from lanefold.primitives._logging import get_logger
from lanefold.primitives._registry import NotOfKindError, Registry, _qualified
from lanefold.primitives._result import RunResult
from lanefold.primitives.events import AnyEvent

__all__ = (
    "CUT_SHORT_S",
    "END_TIMEOUT_S",
    "HOOKS",
    "QUEUE_LIMIT",
    "EndHook",
    "EventHook",
    "Hook",
    "HookMaker",
    "HookRunner",
    "build_hook",
    "hook_params",
    "register_hook",
)

QUEUE_LIMIT = 10_000
"""Events waiting for one hook before later ones are dropped for it (a slow hook never stalls a run)."""
END_TIMEOUT_S = 5.0
"""Seconds each hook gets, at the run's end, to drain its events and run `on_run_end`."""
CUT_SHORT_S = 1.0  # seconds each hook gets to drain when the run is cancelled or fails

_log = get_logger("lanefold.hooks")
_LOCKS: dict[int, threading.Lock] = {}  # one per sync hook object: its calls never overlap
_LOCKS_LOCK = threading.Lock()


def _lock_of(hook: object) -> threading.Lock:
    with _LOCKS_LOCK:
        return _LOCKS.setdefault(id(hook), threading.Lock())


class EventHook(Protocol):
    """A hook that watches each event as it is recorded: `on_event(event)`, sync or async."""

    def on_event(self, event: AnyEvent) -> Awaitable[None] | None: ...


class EndHook(Protocol):
    """A hook that is handed each run's result: `on_run_end(result)`, sync or async."""

    def on_run_end(self, result: RunResult) -> Awaitable[None] | None: ...


Hook: TypeAlias = EventHook | EndHook
"""Watches runs: `on_event(event)` for each recorded event, `on_run_end(result)` once per run
that returns a result. Either may be left out (a hook is either protocol, or both); either may
be sync or async. What a hook raises is logged, never raised into the run."""

HookMaker: TypeAlias = Hook | type[EventHook] | type[EndHook]
"""What `HOOKS` holds: a hook class (built with its `Params` from a `[[hooks]]` table's keys,
`build_hook`), or a hook object used as it is."""
H = TypeVar("H", bound=HookMaker)
A = TypeVar("A")  # what a hook's method is called with: an event, or the result


def _check_hook(obj: object, key: str) -> None:
    if not (hasattr(obj, "on_event") or hasattr(obj, "on_run_end")):
        raise NotOfKindError(
            f"{key}: {_qualified(obj)} is not a Hook (it has neither 'on_event' nor 'on_run_end')"
        )


HOOKS: Registry[HookMaker] = Registry("hook", key="hooks.kind", check=_check_hook, name_of=lambda obj: None)
"""The hooks by name (`[[hooks]] kind`): `@register_hook("name")` or the `lanefold.hooks` entry points."""


def register_hook(name: str) -> Callable[[H], H]:
    """Class decorator: make a hook available as `kind = "<name>"` in a `[[hooks]]` table.
    Its own keys are validated by its `Params` (a pydantic model) when it has one, and it
    is built as `cls(params)` (`cls()` without one)."""

    def named(found: H) -> H:
        HOOKS.add(name, found)
        return found

    return named


def hook_params(found: HookMaker) -> type[BaseModel] | None:
    """The pydantic model a hook class validates its `[[hooks]]` keys with, or None (a hook
    that takes no keys: a class without `Params`, or an object used as it is)."""
    params: type[BaseModel] | None = getattr(found, "Params", None) if isinstance(found, type) else None
    return params


def build_hook(found: HookMaker, keys: Mapping[str, object]) -> Hook:
    """The hook `found` (what a `kind` resolved to) makes with its table's `keys`: a class with
    `Params` is built as `cls(Params(**keys))`, one without as `cls()`; anything else is the
    hook itself."""
    if not isinstance(found, type):
        return found
    params = hook_params(found)
    maker: Callable[..., Hook] = found
    return maker(params.model_validate(dict(keys))) if params is not None else maker()


class _Slot:
    """One hook's queue, its drain task's state and what it dropped."""

    __slots__ = ("done", "dropped", "failed", "hook", "name", "receive", "scope", "send", "warned")

    def __init__(self, hook: Hook, limit: int) -> None:
        self.hook = hook
        self.name = _qualified(type(hook)) if not inspect.isfunction(hook) else _qualified(hook)
        self.send: MemoryObjectSendStream[AnyEvent]
        self.receive: MemoryObjectReceiveStream[AnyEvent]
        self.send, self.receive = anyio.create_memory_object_stream[AnyEvent](limit)
        self.done: anyio.Event | None = None  # set when its drain task has emptied the queue
        # Its drain's own scope, shielded: a run cut short (cancelled, failed) still hands its
        # last events (run.interrupted, run.failed) over, within CUT_SHORT_S; then it is cancelled.
        self.scope = anyio.CancelScope(shield=True)
        self.dropped = 0
        self.failed = False
        self.warned = False


class HookRunner:
    """Feeds a run's events to its hooks, each through a bounded queue and its own task.

    `async with HookRunner(hooks, run_id) as runner:` starts the drains; `runner.emit` (sync,
    never blocks, never raises) is the recorder's observer; `await runner.end(result)` lets
    each hook drain and see the result, bounded by `end_timeout_s`. Leaving the block early
    (an error, a cancellation) cancels the drains.
    """

    def __init__(
        self,
        hooks: Sequence[Hook],
        run_id: str = "",
        *,
        limit: int = QUEUE_LIMIT,
        end_timeout_s: float = END_TIMEOUT_S,
    ) -> None:
        self.run_id = run_id
        self._slots = [_Slot(hook, limit) for hook in hooks]
        self._end_timeout_s = end_timeout_s
        self._tg: TaskGroup | None = None

    @property
    def dropped(self) -> dict[str, int]:
        """Events dropped per hook (by its qualified name) because its queue was full."""
        return {slot.name: slot.dropped for slot in self._slots if slot.dropped}

    def __bool__(self) -> bool:
        return bool(self._slots)

    async def __aenter__(self) -> HookRunner:
        if self._slots:
            self._tg = anyio.create_task_group()
            await self._tg.__aenter__()
            for slot in self._slots:
                slot.done = anyio.Event()
                self._tg.start_soon(self._drain, slot)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._tg is None:
            return
        for slot in self._slots:
            slot.send.close()
        if exc_type is not None:  # cut short: what was recorded up to the stop still goes over
            with anyio.CancelScope(shield=True), anyio.move_on_after(min(CUT_SHORT_S, self._end_timeout_s)):
                for slot in self._slots:
                    if slot.done is not None:
                        await slot.done.wait()
        for slot in self._slots:
            slot.scope.cancel()  # end() let them finish; whatever is left is abandoned
        self._tg.cancel_scope.cancel()
        tg, self._tg = self._tg, None
        await tg.__aexit__(exc_type, exc, tb)
        return None  # the run's own exception, if any, goes on as it was

    def tapping(self, observer: Callable[[AnyEvent], None] | None) -> Callable[[AnyEvent], None] | None:
        """What a recorder calls with each event: `observer` (inline, as ever), then `emit`."""
        if not self._slots:
            return observer
        if observer is None:
            return self.emit
        emit = self.emit

        def both(event: AnyEvent) -> None:
            observer(event)
            emit(event)

        return both

    def emit(self, event: AnyEvent) -> None:
        """Queue `event` for every hook; a full queue drops it for that hook (counted)."""
        for slot in self._slots:
            try:
                slot.send.send_nowait(event)
            except anyio.WouldBlock:
                slot.dropped += 1
                if not slot.warned:
                    slot.warned = True
                    _log.warning(
                        "hook.events_dropped",
                        run_id=self.run_id,
                        hook=slot.name,
                        limit=slot.send.statistics().max_buffer_size,
                    )
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # the run has ended for this hook

    async def end(self, result: RunResult) -> None:
        """Close the queues; each hook drains what it has, then gets `on_run_end(result)`,
        all of it within `end_timeout_s` (hooks run side by side, so the wait is one bound)."""
        if self._tg is None:
            return
        for slot in self._slots:
            slot.send.close()
        with anyio.move_on_after(self._end_timeout_s) as scope:
            async with anyio.create_task_group() as tg:
                for slot in self._slots:
                    tg.start_soon(self._finish, slot, result)
        if scope.cancelled_caught:
            _log.warning("hook.end_timed_out", run_id=self.run_id, timeout_s=self._end_timeout_s)
        for slot in self._slots:
            if slot.dropped:
                _log.warning(
                    "hook.events_dropped_total", run_id=self.run_id, hook=slot.name, dropped=slot.dropped
                )

    async def _drain(self, slot: _Slot) -> None:
        with slot.scope:
            await self._drain_queue(slot)
        if slot.done is not None:
            slot.done.set()

    async def _drain_queue(self, slot: _Slot) -> None:
        on_event = getattr(slot.hook, "on_event", None)
        threaded = on_event is not None and not _is_async(on_event)
        async with slot.receive:
            async for event in slot.receive:
                if on_event is None:
                    continue
                if not threaded:
                    await self._call(slot, on_event, event)
                    continue
                batch = [event]  # what waited meanwhile goes over in the same thread hop
                while True:
                    try:
                        batch.append(slot.receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await self._call_in_thread(slot, on_event, batch)

    async def _finish(self, slot: _Slot, result: RunResult) -> None:
        if slot.done is not None:
            await slot.done.wait()  # its queue, closed, is drained first
        on_run_end = getattr(slot.hook, "on_run_end", None)
        if on_run_end is not None:
            await self._call(slot, on_run_end, _copy_of(result))

    async def _call(self, slot: _Slot, method: Callable[[A], object], arg: A) -> None:
        if not _is_async(method):
            await self._call_in_thread(slot, method, [arg])
            return
        cancelled = anyio.get_cancelled_exc_class()
        try:
            found = method(arg)
            if inspect.isawaitable(found):
                await found
        except cancelled:
            raise  # the end's bound, or the run's own cancellation: never swallowed
        except BaseException as exc:  # a hook's error (SystemExit too) is the hook's, never the run's
            self._failed(slot, exc)

    async def _call_in_thread(self, slot: _Slot, method: Callable[[A], object], args: list[A]) -> None:
        """A sync hook's calls, one after another, in a daemon thread holding the hook's lock.

        The thread is the hook's own, not one of anyio's workers (which the interpreter joins at
        exit): a call that never returns is abandoned when the run's end stops waiting for it,
        and the process still exits on time. The wait itself is an anyio worker blocked on an
        event the hook's thread sets when done, or this task sets when it stops waiting.
        """
        lock = _lock_of(slot.hook)
        finished = threading.Event()
        failure: list[BaseException] = []

        def calls() -> None:
            try:
                with lock:
                    for arg in args:
                        try:
                            method(arg)
                        except BaseException as exc:  # the hook's own (SystemExit too): never raised
                            if not failure:
                                failure.append(exc)
            finally:
                finished.set()

        threading.Thread(target=calls, name=f"lanefold hook {slot.name}", daemon=True).start()
        try:
            await anyio.to_thread.run_sync(finished.wait, abandon_on_cancel=True)
        finally:
            finished.set()  # stopped waiting (the end's bound): the waiting worker returns now
        if failure:
            self._failed(slot, failure[0])

    def _failed(self, slot: _Slot, exc: BaseException) -> None:
        if not slot.failed:
            slot.failed = True
            _log.warning(
                "hook.failed", run_id=self.run_id, hook=slot.name, error=f"{type(exc).__name__}: {exc}"
            )


def _copy_of(result: RunResult) -> RunResult:
    """A deep copy of `result` for one hook, so what it does to it stays its own; a result
    that cannot be copied is handed over as it is (it is the caller's own object then)."""
    try:
        return copy.deepcopy(result)
    except Exception:  # an object that refuses deepcopy: nothing else to give
        return result


def _is_async(method: Callable[..., object]) -> bool:
    """Whether calling `method` gives an awaitable to await (an `async def`, or an object whose
    `__call__` is one); anything else is called in a worker thread."""
    call = type(method).__dict__.get("__call__")  # an instance's own `async def __call__`
    return inspect.iscoroutinefunction(method) or inspect.iscoroutinefunction(call)
