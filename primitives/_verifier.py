"""Verifiers: score one candidate answer without an LLM, by a Python callable or a command.

A verifier is the seam best-of-N uses in place of an LLM judge. Whatever goes wrong inside one
(a raise, a hang, a non-number, a command that crashes or cannot start) comes back as a
`Verdict` with `error` set, an abstention the log can record, never an exception that fails
the run. Only misuse (a `ConfigError` at construction) and cancellation propagate.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import shlex
import signal
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeAlias, runtime_checkable

import anyio
import anyio.abc
import anyio.to_thread

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._logging import get_logger
from lanefold.primitives._registry import import_object

__all__ = (
    "CallableVerifier",
    "CommandVerifier",
    "Verdict",
    "Verifier",
    "VerifierFn",
    "as_verifier",
    "import_verifier",
)

VerifierFn: TypeAlias = Callable[
    [str, str, str | None], float | int | bool | Awaitable[float | int | bool | None] | None
]
"""`fn(question, text, answer)` returning a score (bool, int, float) or None, sync or async."""

_POSIX = os.name == "posix"


@dataclass(frozen=True, slots=True)
class Verdict:
    """One verifier's judgement of one candidate.

    `score` None is an abstention (the verifier failed, timed out, or gave none); `error` is
    None when the verifier worked, else its kind: "timeout", "raised", "bad_output", "exit".
    """

    score: float | None
    passed: bool | None
    detail: str = ""
    error: str | None = None


@runtime_checkable
class Verifier(Protocol):
    """Scores one candidate without an LLM; `name` is what the log records as the judge."""

    name: str

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        """The verdict on `text` (a lane's full output; `answer` its extracted answer)."""
        ...


class CallableVerifier:
    """A Python callable `fn(question, text, answer)` as a Verifier.

    A sync callable runs in a worker thread so it cannot block the event loop; past
    `timeout_s` its thread is abandoned (Python cannot kill a thread, so it runs on until it
    returns) and the verdict is a timeout. An async callable is awaited under the same
    timeout. At most `max_concurrency` calls of one instance run at once.
    """

    def __init__(self, fn: VerifierFn, *, name: str | None = None,
                 timeout_s: float | None = 30.0, max_concurrency: int = 4) -> None:
        if not callable(fn):
            raise ConfigError(f"judge.verifier: {fn!r} is not callable")
        _check_limits(timeout_s, max_concurrency)
        self.name = name or _callable_name(fn)
        self._fn = fn
        # An instance whose `__call__` is `async def` is async too.
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        self._timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(max_concurrency)

    def __repr__(self) -> str:
        return f"CallableVerifier({self.name!r}, timeout_s={self._timeout_s})"

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        """Call the function; a raise, a hang or a non-number becomes an abstaining Verdict."""
        async with self._limiter:  # outside the timeout: waiting for a slot is not running
            try:
                with anyio.fail_after(self._timeout_s) as scope:
                    value = await self._call(question, text, answer)
            except anyio.get_cancelled_exc_class():
                raise
            except TimeoutError as exc:
                if not scope.cancelled_caught:  # the function's own TimeoutError, not ours
                    return _raised(exc)
                if not self._is_async:
                    get_logger("lanefold.verifier").warning(
                        "verifier_thread_abandoned", verifier=self.name, timeout_s=self._timeout_s)
                return _timed_out(self._timeout_s)
            except Exception as exc:  # a user's verifier may fail in any way: it abstains
                return _raised(exc)
        return _verdict_of(value)

    async def _call(self, question: str, text: str, answer: str | None) -> object:
        if self._is_async:
            value: object = self._fn(question, text, answer)
        else:
            # Boxed in a tuple: trio refuses a worker whose result is a coroutine, and a lambda
            # or partial may return one for us to await here.
            (value,) = await anyio.to_thread.run_sync(
                _boxed, self._fn, question, text, answer, abandon_on_cancel=True)
        if inspect.isawaitable(value):  # e.g. a lambda or partial that returns a coroutine
            value = await value
        return value


class CommandVerifier:
    """A command as a Verifier: the candidate text on stdin, exit status 0 passes.

    The score is the number on the last non-empty line of stdout, else 1.0 on exit 0 and 0.0
    otherwise. The question and extracted answer arrive as the environment variables
    LANEFOLD_QUESTION and LANEFOLD_ANSWER. Past `timeout_s` the command (and, on POSIX, its
    process group, so a shell's children go too) is killed and reaped.
    """

    def __init__(self, argv: Sequence[str], *, timeout_s: float | None = 30.0,
                 max_concurrency: int = 4, cwd: str | Path | None = None,
                 name: str | None = None) -> None:
        if isinstance(argv, str | bytes):
            raise ConfigError("judge.verifier_command: must be a list of strings, not one string")
        if not argv:
            raise ConfigError("judge.verifier_command: must not be empty")
        if not all(isinstance(arg, str) for arg in argv):
            raise ConfigError("judge.verifier_command: every item must be a string")
        _check_limits(timeout_s, max_concurrency)
        self._argv = tuple(argv)
        self.name = name or "command:" + shlex.join(self._argv)
        self._cwd = cwd
        self._timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(max_concurrency)

    def __repr__(self) -> str:
        return f"CommandVerifier({self.name!r}, timeout_s={self._timeout_s})"

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        """Run the command once on `text`; its exit status and stdout make the Verdict."""
        # Environment variables cannot hold NUL; the rest of the text passes as written.
        env = {**os.environ, "LANEFOLD_QUESTION": question.replace("\0", ""),
               "LANEFOLD_ANSWER": (answer or "").replace("\0", "")}
        async with self._limiter:
            try:
                with anyio.fail_after(self._timeout_s):
                    code, out, err = await self._run(text.encode("utf-8", "replace"), env)
            except TimeoutError:
                return _timed_out(self._timeout_s)
            except OSError as exc:  # the exec failed (TimeoutError, an OSError too, is ours)
                return Verdict(None, False, _shorten(f"cannot start {self._argv[0]!r}: {exc}"),
                               error="exit")
        number = _number_on_last_line(out.decode("utf-8", "replace"))
        if code == 0:
            return Verdict(1.0 if number is None else number, True)
        # The tail of stderr, else of stdout (where many test runners report), for the feedback
        # a loop may show the model next; a stdout that is only the score says nothing more.
        detail = f"exit status {code}"
        said = out.decode("utf-8", "replace")
        if number is not None and len(said.strip().splitlines()) == 1:
            said = ""
        if tail := _shorten(err.decode("utf-8", "replace") or said, 180, keep_end=True):
            detail += f": {tail}"
        return Verdict(0.0 if number is None else number, False, detail)

    async def _run(self, data: bytes, env: dict[str, str]) -> tuple[int, bytes, bytes]:
        process = await anyio.open_process(
            self._argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=self._cwd, env=env, start_new_session=_POSIX)
        out: list[bytes] = []
        err: list[bytes] = []
        finished = False
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, process, data)
                tg.start_soon(_drain, process.stdout, out)
                tg.start_soon(_drain, process.stderr, err)
                code = await process.wait()
            finished = True
            return code, b"".join(out), b"".join(err)
        finally:
            with anyio.CancelScope(shield=True):  # reap even while being cancelled
                if not finished:
                    _kill(process)
                await process.aclose()


def import_verifier(spec: str, *, timeout_s: float | None = 30.0) -> CallableVerifier:
    """The `module:function` a config names, wrapped as a CallableVerifier named `spec`."""
    return CallableVerifier(_import_callable(spec), name=spec, timeout_s=timeout_s)


def as_verifier(obj: Verifier | VerifierFn | str | Sequence[str], *,
                timeout_s: float | None = 30.0, max_concurrency: int = 4) -> Verifier:
    """Any accepted verifier form as a Verifier: a Verifier as is, a callable wrapped,
    a `module:function` string imported, a list of strings run as a command."""
    if isinstance(obj, Verifier):
        return obj
    if isinstance(obj, str):
        return CallableVerifier(_import_callable(obj), name=obj, timeout_s=timeout_s,
                                max_concurrency=max_concurrency)
    if callable(obj):
        return CallableVerifier(obj, timeout_s=timeout_s, max_concurrency=max_concurrency)
    if isinstance(obj, Sequence) and not isinstance(obj, bytes):
        return CommandVerifier(obj, timeout_s=timeout_s, max_concurrency=max_concurrency)
    raise ConfigError(f"judge.verifier: expected a Verifier, a callable, 'module:function' or "
                      f"a command list, got {type(obj).__name__}")


def _import_callable(spec: str) -> VerifierFn:
    module_name, colon, attr = spec.partition(":")
    if not (module_name and colon and attr):
        raise ConfigError(f"judge.verifier: {spec!r} must look like 'module:function'")
    target = import_object(spec, key="judge.verifier")  # `module:Class.method` reaches further
    if not callable(target):
        raise ConfigError(f"judge.verifier: {spec!r} is not callable")
    return target  # type: ignore[no-any-return]  # callable; its signature is the user's to keep


def _boxed(fn: VerifierFn, question: str, text: str, answer: str | None) -> tuple[object]:
    return (fn(question, text, answer),)


def _check_limits(timeout_s: float | None, max_concurrency: int) -> None:
    if timeout_s is not None and not timeout_s > 0:  # `not >` also rejects NaN
        raise ConfigError(f"judge.verifier_timeout_s: must be > 0, got {timeout_s!r}")
    if max_concurrency < 1:
        raise ConfigError(f"max_concurrency (of the verifier): must be >= 1, got {max_concurrency!r}")


def _callable_name(fn: object) -> str:
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}:{qualname}"


def _verdict_of(value: object) -> Verdict:
    if value is None:
        return Verdict(None, None, "verifier gave no score")
    if isinstance(value, bool):
        return Verdict(1.0 if value else 0.0, value)
    if isinstance(value, numbers.Real):
        try:
            score = float(value)
        except OverflowError:  # an int too large for a float
            score = math.inf
        if math.isfinite(score):
            return Verdict(score, score > 0)
    return Verdict(None, False, f"verifier returned {_shorten(repr(value), 120)}, not a number",
                   error="bad_output")


def _raised(exc: Exception) -> Verdict:
    return Verdict(None, False, _shorten(f"verifier raised {type(exc).__name__}: {exc}"),
                   error="raised")


def _timed_out(timeout_s: float | None) -> Verdict:
    assert timeout_s is not None  # no timeout, no TimeoutError from fail_after
    return Verdict(None, False, f"verifier timed out after {timeout_s:g} s", error="timeout")


def _number_on_last_line(stdout: str) -> float | None:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        number = float(lines[-1])
    except ValueError:
        return None
    return number if math.isfinite(number) else None  # "nan" or "inf" is no score


def _shorten(text: str, limit: int = 200, *, keep_end: bool = False) -> str:
    """One line of at most `limit` characters; for a stderr, the end (where the error is)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return "…" + line[-(limit - 1):] if keep_end else line[: limit - 1] + "…"


async def _feed(process: anyio.abc.Process, data: bytes) -> None:
    assert process.stdin is not None
    try:
        if data:
            await process.stdin.send(data)
        await process.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # a command may exit without reading its input; its exit status still counts


async def _drain(stream: anyio.abc.ByteReceiveStream | None, into: list[bytes]) -> None:
    assert stream is not None
    async for chunk in stream:
        into.append(chunk)


def _kill(process: anyio.abc.Process) -> None:
    try:
        if _POSIX:
            os.killpg(process.pid, signal.SIGKILL)  # the session leader's pid is the group id
        else:
            process.kill()
    except OSError:
        pass  # already gone (ProcessLookupError), or no longer ours to signal
