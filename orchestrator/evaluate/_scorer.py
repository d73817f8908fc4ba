"""The scorer kind: what a scorer is (`Scorer`, `Score`), and the registry that names them.

A scorer says how right a run's answer is against an item's gold. Scorers are a plug-in kind
(`SCORERS`, `@register_scorer("name")`, the entry-point group `lanefold.scorers`); the built-ins
(`exact`, `numeric`, `humaneval`) are in `_scoring.py` and `bfcl` in `_bfcl_check.py`, each
registered as its module is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, TypeGuard, TypeVar

from lanefold.evaluate._item import Item
from lanefold.primitives import NotOfKindError, Registry, Verifier

__all__ = (
    "PASS_MARK",
    "SCORERS",
    "Score",
    "Scorer",
    "ScorerFn",
    "ScorerMaker",
    "is_scorer",
    "register_scorer",
)

PASS_MARK = 0.5  # a float score counts as correct from here up


@dataclass(frozen=True, slots=True)
class Score:
    """How right one answer is: `value` in [0, 1] (1 right, 0 wrong); `error` when scoring
    itself failed (then `value` is 0)."""

    value: float
    error: str | None = None

    @property
    def correct(self) -> bool:
        return self.value >= PASS_MARK


class Scorer(Protocol):
    """Scores answers against an item's gold. `name` is the spec the eval records;
    `needs_text` means it reads a lane's whole text (code), not only its extracted answer."""

    name: str
    needs_text: bool

    def check(self, items: Sequence[Item]) -> None:
        """Refuse (ConfigError naming the item's source) what can never be scored."""
        ...

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        """The score of `answer` (extracted) or `text` (the lane's whole output)."""
        ...

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        """A Verifier for the runs' own reducers (any_pass, weighting by verifier), or None."""
        ...


_SCORER_PARTS = ("check", "score", "verifier")


def is_scorer(found: object) -> TypeGuard[Scorer]:
    """A Scorer instance (`module:instance`), as `_check_scorer` tells one from a function."""
    return all(hasattr(found, part) for part in _SCORER_PARTS)


def _check_scorer(obj: Any, key: str) -> None:
    """A registered scorer is a class making a Scorer from the spec's argument; `module:attr`
    may also name a Scorer instance or a plain function (wrapped by `resolve_scorer`)."""
    if isinstance(obj, type):
        missing = [part for part in _SCORER_PARTS if not hasattr(obj, part)]
        if missing:
            raise NotOfKindError(
                f"{key}: {obj.__module__}:{obj.__qualname__} is not a Scorer (it has no {missing[0]!r})"
            )
    elif not callable(obj) and not is_scorer(obj):
        raise NotOfKindError(f"{key}: {obj!r} is not a Scorer, a Scorer class or a function")


ScorerFn: TypeAlias = Callable[[str | None, str | None, Item], object]
"""`function(gold, answer, item)`: a bool, or a float in [0, 1], sync or async (`CustomScorer`)."""
ScorerMaker: TypeAlias = type[Scorer] | Scorer | ScorerFn
"""What `SCORERS` holds: a Scorer class (made by its `from_spec(ARG)` where it has one, else with no
argument), a Scorer, or a function (`module:function` only)."""
S = TypeVar("S", bound=ScorerMaker)

SCORERS: Registry[ScorerMaker] = Registry("scorer", key="--scorer", check=_check_scorer)
"""The scorers by name (`--scorer NAME[:ARG]`): `@register_scorer("name")` or the `lanefold.scorers`
entry points; the built-ins are `exact`, `numeric`, `humaneval` and `bfcl`."""


def register_scorer(name: str) -> Callable[[S], S]:
    """Class decorator: make a Scorer class available to `--scorer name` (`eval`, `compare`, `sweep`,
    `reduce --eval`), made from `name:ARG` by its `from_spec(ARG)` where it has one."""

    def named(found: S) -> S:
        SCORERS.add(name, found)
        return found

    return named
