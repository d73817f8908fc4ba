"""The vote fold: self-consistency's reduce step, a pure function from ballots to a winner.

Each completed lane casts one ballot (its extracted answer, optionally weighted); failed lanes
and lanes with nothing extracted abstain. Answers are normalised before counting, and the
result depends on the ballots' lane indices, never on the order they arrive in, so a resumed
run that re-joins lanes in another order reduces to the same winner.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from lanefold.primitives._answers import normalize_answer
from lanefold.primitives._errors import ConfigError

__all__ = ("Ballot", "VoteResult", "VoteTieBreak", "logprob_weight", "vote_fold")

VoteTieBreak = Literal["first_lane", "lexicographic", "random"]
"""How a vote picks among answers with the top count or weight (the loop's `tie_break`)."""

# Totals within this relative distance are a tie: weights summed in a different grouping
# (0.1 + 0.2 against 0.3) must not decide a vote by rounding noise.
_TIE_REL_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Ballot:
    """One lane's vote. `answer` None is an abstention (the lane failed or had no answer)."""

    lane: int
    answer: str | None
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.weight) and self.weight >= 0.0):
            raise ConfigError(f"ballot weight must be finite and >= 0, got {self.weight!r}")


@dataclass(frozen=True, slots=True)
class VoteResult:
    """The outcome of a vote, with what is needed to audit it.

    `votes` and `counts` map each normalised answer to its total weight and ballot count, in
    the order of each answer's first lane. `tie_break` is the rule that decided, or `"none"`
    when the top total was not tied; `tied` lists the tied answers in first-lane order.
    """

    winner: str | None
    winner_lane: int | None
    votes: dict[str, float]
    counts: dict[str, int]
    tie_break: str
    tied: tuple[str, ...]
    abstentions: int


def vote_fold(
    ballots: Iterable[Ballot],
    *,
    tie_break: VoteTieBreak = "first_lane",
    seed: int = 0,
    normalize: Callable[[str], str] = normalize_answer,
) -> VoteResult:
    """Reduce ballots to the answer with the most total weight.

    Ties go by `tie_break`: `"first_lane"` takes the tied answer whose lowest lane index is
    lowest (lane index, not list position, so the fold is permutation invariant);
    `"lexicographic"` the smallest normalised answer; `"random"` a `random.Random(seed)` choice
    among the sorted tied answers. An answer that normalises to the empty string abstains.
    A lane may cast one ballot only. No votes at all gives winner None. `normalize` maps each
    answer to what is counted (`normalize_answer`; a field of a JSON object, already canonical,
    is counted as it is).
    """
    ordered = sorted(ballots, key=lambda ballot: ballot.lane)
    for before, after in itertools.pairwise(ordered):
        if before.lane == after.lane:
            raise ConfigError(f"lane {after.lane} cast more than one ballot")

    votes: dict[str, float] = {}
    counts: dict[str, int] = {}
    first_lane: dict[str, int] = {}
    abstentions = 0
    for ballot in ordered:
        answer = None if ballot.answer is None else normalize(ballot.answer)
        if not answer:
            abstentions += 1
            continue
        if answer not in votes:
            votes[answer] = 0.0
            counts[answer] = 0
            first_lane[answer] = ballot.lane
        votes[answer] += ballot.weight
        counts[answer] += 1

    if not votes:
        return VoteResult(None, None, votes, counts, "none", (), abstentions)

    best = max(votes.values())
    tied = tuple(
        answer
        for answer, total in votes.items()
        if total == best or math.isclose(total, best, rel_tol=_TIE_REL_TOL)
    )
    if len(tied) == 1:
        winner, rule, tied = tied[0], "none", ()
    else:
        winner, rule = _break_tie(tied, tie_break, seed), tie_break
    return VoteResult(winner, first_lane[winner], votes, counts, rule, tied, abstentions)


def _break_tie(tied: tuple[str, ...], rule: VoteTieBreak, seed: int) -> str:
    # `tied` is in first-lane order, so its head is the first_lane winner.
    if rule == "first_lane":
        return tied[0]
    if rule == "lexicographic":
        return min(tied)
    if rule == "random":
        return random.Random(seed).choice(sorted(tied))
    raise ConfigError(f"unknown tie_break {rule!r}: use first_lane, lexicographic or random")


def logprob_weight(logprobs: Sequence[float] | None) -> float:
    """A lane's vote weight from its token logprobs: exp(mean logprob), the per-token
    geometric-mean probability, so long and short answers weigh alike.

    1.0 when the backend gave no logprobs (None, empty, or any NaN), so unweighted lanes count
    as plain votes; the result lies in [0, 1].
    """
    if not logprobs:
        return 1.0
    values = [float(value) for value in logprobs]
    if any(math.isnan(value) for value in values):
        return 1.0
    # A logprob above 0 is a backend bug; capping it keeps the weight a probability.
    mean = math.fsum(min(value, 0.0) for value in values) / len(values)
    return math.exp(mean)
