"""Verifiers: score one candidate answer without an LLM. The protocol, the Verdict, and a Python
callable as a verifier; a command as a verifier is `lanefold.coordinators.CommandVerifier`.
Verifiers are a plug-in kind (`VERIFIERS`, `@register_verifier("name")`, the entry-point group
`lanefold.verifiers`): `[judge] verifier` is `NAME` or `NAME:ARG` for a registered one (the
built-in `command:ARGV` runs a command), or `module:attr`.

A verifier is the seam best-of-N uses in place of an LLM judge. Whatever goes wrong inside one
(a raise, a hang, a non-number, a command that crashes or cannot start) comes back as a
`Verdict` with `error` set, an abstention the log can record, never an exception that fails
the run. Only misuse (a `ConfigError` at construction) and cancellation propagate.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import numbers
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar, runtime_checkable

import anyio
import anyio.to_thread

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._logging import get_logger
from lanefold.primitives._registry import _NAME, Registry
from lanefold.primitives._tools import ToolCall

__all__ = (
    "VERIFIERS",
    "CallableVerifier",
    "Verdict",
    "Verifier",
    "VerifierFn",
    "VerifierMaker",
    "check_verifier_limits",
    "import_verifier",
    "one_line",
    "register_verifier",
)

VerifierFn: TypeAlias = Callable[
    [str, str, str | None], float | int | bool | Awaitable[float | int | bool | None] | None
]
"""`fn(question, text, answer)` returning a score (bool, int, float) or None, sync or async."""


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

    @staticmethod
    def timed_out(timeout_s: float | None) -> Verdict:
        """The abstention of a verifier stopped after `timeout_s`."""
        assert timeout_s is not None  # no timeout, no TimeoutError from fail_after
        return Verdict(None, False, f"verifier timed out after {timeout_s:g} s", error="timeout")


@runtime_checkable
class Verifier(Protocol):
    """Scores one candidate without an LLM; `name` is what the log records as the judge."""

    name: str

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        """The verdict on `text` (a lane's full output; `answer` its extracted answer)."""
        ...


class CallableVerifier:
    """A Python callable `fn(question, text, answer)` as a Verifier.

    A function with a parameter named `call` is given the lane's parsed call as well (a
    `ToolCall`, None where the answer is none), one with a parameter named `value` the parsed
    JSON value of a `"json"` or `"tool_call"` answer (None where there is none), as keywords.

    A sync callable runs in a worker thread so it cannot block the event loop; past
    `timeout_s` its thread is abandoned (Python cannot kill a thread, so it runs on until it
    returns) and the verdict is a timeout. An async callable is awaited under the same
    timeout. At most `max_concurrency` calls of one instance run at once.
    """

    def __init__(
        self,
        fn: VerifierFn,
        *,
        name: str | None = None,
        timeout_s: float | None = 30.0,
        max_concurrency: int = 4,
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"judge.verifier: {fn!r} is not callable")
        check_verifier_limits(timeout_s, max_concurrency)
        self.name = name or _callable_name(fn)
        self._fn = fn
        # An instance whose `__call__` is `async def` is async too.
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        self._timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(max_concurrency)
        self._parsed = _parsed_names(fn)

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
                        "verifier_thread_abandoned", verifier=self.name, timeout_s=self._timeout_s
                    )
                return Verdict.timed_out(self._timeout_s)
            except Exception as exc:  # a user's verifier may fail in any way: it abstains
                return _raised(exc)
        return _verdict_of(value)

    async def _call(self, question: str, text: str, answer: str | None) -> object:
        fn: Callable[[str, str, str | None], object] = self._fn
        if self._parsed:
            fn = functools.partial(self._fn, **_parsed(answer, self._parsed))
        if self._is_async:
            value: object = fn(question, text, answer)
        else:
            # Boxed in a tuple: trio refuses a worker whose result is a coroutine, and a lambda
            # or partial may return one for us to await here.
            (value,) = await anyio.to_thread.run_sync(
                _boxed, fn, question, text, answer, abandon_on_cancel=True
            )
        if inspect.isawaitable(value):  # e.g. a lambda or partial that returns a coroutine
            value = await value
        return value


VerifierMaker: TypeAlias = Verifier | VerifierFn | type[Verifier]
"""What `VERIFIERS` holds: a Verifier used as it is, a function (`VerifierFn`) wrapped as a
CallableVerifier, or a Verifier class, made by its `from_spec(ARG, *, timeout_s, max_concurrency)`
where it has one (`NAME:ARG`), else with no argument."""
V = TypeVar("V", bound=VerifierMaker)

# What is found is checked where a config names it (`_made`: a Verifier, a class, or callable).
VERIFIERS: Registry[VerifierMaker] = Registry("verifier", key="judge.verifier")
"""The verifiers by name (`[judge] verifier`): `@register_verifier("name")` or the `lanefold.verifiers`
entry points; the built-in `command` is `lanefold.coordinators.CommandVerifier`."""


def register_verifier(name: str) -> Callable[[V], V]:
    """Decorator: make a Verifier, a Verifier class or a `VerifierFn` available as
    `[judge] verifier = "<name>"` (and `"<name>:ARG"` for a class with `from_spec`)."""

    def named(found: V) -> V:
        VERIFIERS.add(name, found)
        return found

    return named


def import_verifier(spec: str, *, timeout_s: float | None = 30.0, max_concurrency: int = 4) -> Verifier:
    """What a config's `verifier` names: `NAME` or `NAME:ARG` for a registered verifier (an
    entry point's too), else `module:attr`. A Verifier is used as it is; a class is made by its
    `from_spec(ARG, timeout_s=, max_concurrency=)` where it has one, else with no argument (an
    ARG is refused then); a function is wrapped as a CallableVerifier named `spec`."""
    name, colon, argument = spec.partition(":")
    registered = VERIFIERS.get(name) if _NAME.fullmatch(name) else None
    if registered is not None:
        return _made(registered, argument if colon else None, spec, timeout_s, max_concurrency)
    if not colon:
        raise ConfigError(
            f"judge.verifier: {spec!r} must look like 'module:function' (or name "
            f"a registered verifier: {', '.join(VERIFIERS.names()) or 'none'})"
        )
    if not (name and argument):
        raise ConfigError(f"judge.verifier: {spec!r} must look like 'module:function'")
    found = VERIFIERS.resolve(spec)  # `module:Class.method` reaches further
    return _made(found, None, spec, timeout_s, max_concurrency)


def _made(
    found: object, argument: str | None, spec: str, timeout_s: float | None, max_concurrency: int
) -> Verifier:
    if isinstance(found, type) and hasattr(found, "verify"):
        make = getattr(found, "from_spec", None)
        if make is not None:
            made: Verifier = make(argument, timeout_s=timeout_s, max_concurrency=max_concurrency)
            return made
        if argument is None:
            made = found()
            return made
    elif isinstance(found, Verifier) and argument is None:
        return found
    if argument is not None:
        raise ConfigError(
            f"judge.verifier: {spec!r}: the {spec.partition(':')[0]} verifier takes no argument"
        )
    if not callable(found):
        raise ConfigError(f"judge.verifier: {spec!r} is not callable")
    # callable; its signature is the user's to keep
    return CallableVerifier(found, name=spec, timeout_s=timeout_s, max_concurrency=max_concurrency)


def _boxed(
    fn: Callable[[str, str, str | None], object], question: str, text: str, answer: str | None
) -> tuple[object]:
    return (fn(question, text, answer),)


def _parsed_names(fn: object) -> frozenset[str]:
    """Which of `call` and `value` `fn` takes as parameters (keywords it is then given)."""
    try:
        parameters = inspect.signature(fn).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin without a signature takes neither
        return frozenset()
    return frozenset(name for name in ("call", "value") if name in parameters)


def _parsed(answer: str | None, names: frozenset[str]) -> dict[str, object]:
    """The parsed forms of a structured answer a verifier asked for (`call`, `value`)."""
    value: object = None
    if answer is not None and answer[:1] in '{["-0123456789tfn':
        try:
            value = json.loads(answer)
        except ValueError:
            value = None
    given: dict[str, object] = {}
    if "call" in names:
        given["call"] = ToolCall.from_answer(answer)
    if "value" in names:
        given["value"] = value
    return given


def check_verifier_limits(timeout_s: float | None, max_concurrency: int) -> None:
    """Refuse a verifier's timeout (not > 0) or concurrency (< 1), naming the key."""
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
    return Verdict(
        None, False, f"verifier returned {one_line(repr(value), 120)}, not a number", error="bad_output"
    )


def _raised(exc: Exception) -> Verdict:
    return Verdict(None, False, one_line(f"verifier raised {type(exc).__name__}: {exc}"), error="raised")


def one_line(text: str, limit: int = 200, *, keep_end: bool = False) -> str:
    """One line of at most `limit` characters; for a stderr, the end (where the error is)."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    return "…" + line[-(limit - 1) :] if keep_end else line[: limit - 1] + "…"
