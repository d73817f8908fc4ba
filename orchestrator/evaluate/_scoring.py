"""Scorers: is a run's answer right? Exact match, numeric tolerance, a user's function, tests.

Scorers are a plug-in kind (`SCORERS`): `--scorer NAME[:ARG]` picks a registered one, given
`ARG` (or none) when it is made:

    exact            the answer equals a gold answer once both are normalised as the vote
                     normalises them (`normalize_answer`: case, spaces, `1,000` = `1000`)
    numeric[:TOL]    both are numbers and `math.isclose(answer, gold, rel_tol=TOL,
                     abs_tol=TOL)` (default TOL 1e-6)
    humaneval[:S]    the code in the winning lane's text passes the problem's tests, run in a
                     subprocess killed after S seconds (default 10)
    bfcl             the answer is a call BFCL's AST check accepts (`_bfcl_check.py`)
    module:attr      a Scorer class (made with no argument) or instance, or a function
                     `function(gold, answer, item)` returning a bool, or a float in [0, 1]

A scorer of your own is a class with `name`, `needs_text`, `check`, `score` and `verifier`
(the `Scorer` protocol) and a constructor taking the spec's argument (a string, or None),
registered with `@register_scorer("name")` or the entry-point group `lanefold.scorers`.

Without a spec: the scorer every item names as its dataset's (`meta["scorer"]`: `bfcl` for
`--dataset bfcl:<category>`), else `humaneval` where every item carries tests (`meta` has
`test` and `entry_point`), else `exact`. A scorer never raises for a bad answer: it returns a `Score`
whose `error` says what went wrong (a user's function that raised, a test that timed out), and
the eval records it. Everything that can be checked up front (the function imports, every gold
is a number for `numeric`) is checked before anything runs.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, cast

import anyio

from lanefold.coordinators import CommandVerifier
from lanefold.evaluate._item import Item
from lanefold.evaluate._scorer import SCORERS, Score, Scorer, ScorerFn, is_scorer, register_scorer
from lanefold.primitives import ConfigError, Verdict, Verifier, normalize_answer
from lanefold.primitives.internal import import_object

__all__ = (
    "CustomScorer",
    "ExactMatch",
    "HumanEvalTests",
    "NumericMatch",
    "humaneval_program",
    "resolve_scorer",
)


def _golds(item: Item) -> list[str]:
    answers = item.meta.get("answers")
    if isinstance(answers, list) and answers:
        return [str(answer) for answer in answers]
    return [item.answer] if item.answer is not None else []


def _need_golds(items: Sequence[Item], name: str) -> None:
    for item in items:
        if not _golds(item):
            raise ConfigError(f"{item.source or f'item {item.index}'}: no gold answer for the {name} scorer")


@register_scorer("exact")
class ExactMatch:
    """Right when the answer equals any gold answer, both normalised as the vote does."""

    name = "exact"
    needs_text = False

    def check(self, items: Sequence[Item]) -> None:
        _need_golds(items, self.name)

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        if answer is None:
            return Score(0.0)
        mine = normalize_answer(answer)
        return Score(1.0 if any(normalize_answer(g) == mine for g in _golds(item)) else 0.0)

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        return None


def _number(text: str) -> float | None:
    try:
        value = float(Decimal(normalize_answer(text).replace(",", "")))
    except (InvalidOperation, ValueError):
        return None
    return value if math.isfinite(value) else None


@register_scorer("numeric")
class NumericMatch:
    """Right when the answer and a gold are numbers within `tolerance` (relative or
    absolute, whichever is looser: `math.isclose(..., rel_tol=t, abs_tol=t)`)."""

    needs_text = False

    def __init__(self, tolerance: float = 1e-6) -> None:
        if not (tolerance >= 0 and math.isfinite(tolerance)):
            raise ConfigError(f"--scorer: numeric tolerance must be a number >= 0, got {tolerance}")
        self.tolerance = tolerance
        self.name = f"numeric:{tolerance:g}"

    @classmethod
    def from_spec(cls, argument: str | None) -> NumericMatch:
        return cls(_number_argument(argument, 1e-6, f"numeric:{argument}"))

    def check(self, items: Sequence[Item]) -> None:
        _need_golds(items, "numeric")
        for item in items:
            if all(_number(gold) is None for gold in _golds(item)):
                raise ConfigError(
                    f"{item.source or f'item {item.index}'}: the gold answer "
                    f"{_golds(item)[0]!r} is not a number (--scorer numeric)"
                )

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        mine = _number(answer) if answer is not None else None
        if mine is None:
            return Score(0.0)
        t = self.tolerance
        right = any(
            gold is not None and math.isclose(mine, gold, rel_tol=t, abs_tol=t)
            for gold in map(_number, _golds(item))
        )
        return Score(1.0 if right else 0.0)

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        return None


class CustomScorer:
    """`function(gold, answer, item)` from `module:function`: a bool, or a float in [0, 1]
    (a partial score; correct from 0.5 up). Sync or async; what it raises is recorded."""

    needs_text = False

    def __init__(self, spec: str, fn: ScorerFn | None = None) -> None:
        self.name = spec
        self._fn = fn if fn is not None else _import(spec)

    def check(self, items: Sequence[Item]) -> None:
        pass  # the function decides what a gold may be

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        try:
            value = self._fn(item.answer, answer, item)
            if inspect.isawaitable(value):
                value = await value
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # a user's function may fail in any way: recorded, not fatal
            return Score(0.0, f"scorer {self.name} raised {type(exc).__name__}: {exc}")
        if isinstance(value, bool):
            return Score(1.0 if value else 0.0)
        if isinstance(value, numbers.Real) and 0.0 <= float(value) <= 1.0:
            return Score(float(value))
        return Score(0.0, f"scorer {self.name} returned {value!r}: want a bool or a float in [0, 1]")

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        return None


def _import(spec: str) -> Callable[..., object]:
    target = import_object(spec, key="--scorer")
    if not callable(target):
        raise ConfigError(f"--scorer: {spec!r} is not callable")
    return target


# Runs the program read from stdin with its prints kept off stdout (where the verdict goes);
# an exit of the program's own is a failure, not a pass.
_HARNESS = """\
import contextlib, io, sys
source = sys.stdin.read()
try:
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<humaneval>", "exec"), {"__name__": "__humaneval__"})
except SystemExit:
    sys.exit(1)
print(1)
"""
_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def humaneval_program(item: Item, completion: str) -> str:
    """The program HumanEval runs: the prompt, the completion (the code of its first fenced
    block, if it has one; a whole function redefines the prompt's), the tests, the check."""
    fenced = _FENCE.search(completion)
    code = fenced.group(1) if fenced else completion
    meta = item.meta
    return f"{meta['prompt']}{code}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\n"


@register_scorer("humaneval")
class HumanEvalTests:
    """HumanEval's tests as the scorer and as the runs' verifier: the program runs in a fresh
    `python -I` in a temporary folder, killed (with its children) after `timeout_s`.

    It runs code a model wrote, on this machine, as this user: run such evals in a sandbox.
    """

    needs_text = True

    def __init__(self, timeout_s: float = 10.0, *, max_concurrency: int = 8) -> None:
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise ConfigError(f"--scorer: humaneval timeout must be > 0 seconds, got {timeout_s}")
        self.timeout_s = timeout_s
        self.name = f"humaneval:{timeout_s:g}"
        self._limiter = anyio.CapacityLimiter(max_concurrency)

    @classmethod
    def from_spec(cls, argument: str | None) -> HumanEvalTests:
        return cls(_number_argument(argument, 10.0, f"humaneval:{argument}"))

    def check(self, items: Sequence[Item]) -> None:
        for item in items:
            missing = [key for key in ("prompt", "test", "entry_point") if key not in item.meta]
            if missing:
                raise ConfigError(
                    f"{item.source or f'item {item.index}'}: no {missing[0]!r} "
                    f"field: the humaneval scorer runs a problem's tests"
                )

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        completion = text if text is not None else answer
        if completion is None:
            return Score(0.0)
        verdict = await self.run_tests(item, completion)
        return Score(1.0 if verdict.passed else 0.0, verdict.detail if verdict.error == "timeout" else None)

    async def run_tests(self, item: Item, completion: str) -> Verdict:
        """The verdict of the problem's tests on `completion`."""
        async with self._limiter:
            with tempfile.TemporaryDirectory(prefix="lanefold-humaneval-") as folder:
                command = CommandVerifier(
                    [sys.executable, "-I", "-c", _HARNESS],
                    timeout_s=self.timeout_s,
                    cwd=folder,
                    name=self.name,
                )
                return await command.verify(item.question, humaneval_program(item, completion), None)

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        return _TestsVerifier(self, {item.question: item for item in items})


class _TestsVerifier:
    """The tests of the question asked, as the Verifier a run's reducer calls."""

    def __init__(self, tests: HumanEvalTests, items: dict[str, Item]) -> None:
        self.name = tests.name
        self._tests, self._items = tests, items

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        item = self._items.get(question)
        if item is None:
            return Verdict(None, False, "not a question of this eval", error="raised")
        return await self._tests.run_tests(item, text)


def resolve_scorer(spec: str | None, items: Sequence[Item] = ()) -> Scorer:
    """The scorer a `--scorer` spec names (see the module's docstring); None picks by the
    items. Checks it against `items` (ConfigError, before anything runs)."""
    scorer = _scorer(spec, items)
    scorer.check(items)
    return scorer


def _scorer(spec: str | None, items: Sequence[Item]) -> Scorer:
    if spec is None:
        named = {item.meta.get("scorer") for item in items}
        own = named.pop() if len(named) == 1 else None
        if isinstance(own, str):  # the dataset's own scorer
            return _scorer(own, ())
        tests = bool(items) and all("test" in i.meta and "entry_point" in i.meta for i in items)
        return HumanEvalTests() if tests else ExactMatch()
    name, colon, argument = spec.partition(":")
    registered = SCORERS.get(name) if name else None
    if registered is not None:
        return _made(registered, argument if colon else None, spec)
    if colon and name and argument:
        found = SCORERS.resolve(spec)  # module:attr, imported beside the config first
        if isinstance(found, type):
            return _made(found, None, spec)
        if is_scorer(found):
            return found
        return CustomScorer(spec, cast(ScorerFn, found))  # `_check_scorer` let through a function
    raise ConfigError(f"--scorer: unknown scorer {spec!r}: {', '.join(_forms())} or module:function")


def _forms() -> list[str]:
    shown = {"numeric": "numeric[:TOL]", "humaneval": "humaneval[:SECONDS]"}
    return [shown.get(name, name) for name in SCORERS.names()]


def _made(cls: Any, argument: str | None, spec: str) -> Scorer:
    """A scorer class made from a spec's argument: its `from_spec(argument)` where it has one,
    else `cls()` (an argument given to a scorer taking none is refused)."""
    make = getattr(cls, "from_spec", None)
    if make is not None:
        made: Scorer = make(argument)
        return made
    if argument is not None:
        raise ConfigError(f"--scorer: {spec!r}: the {spec.partition(':')[0]} scorer takes no argument")
    made = cls()
    return made


def _number_argument(argument: str | None, default: float, spec: str) -> float:
    if argument is None:
        return default
    try:
        return float(argument)
    except ValueError:
        raise ConfigError(f"--scorer: {spec!r}: {argument!r} is not a number") from None
