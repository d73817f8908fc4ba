"""Scaling curves from one pool of lanes: pass@k and majority@k for every k, sampling nothing.

An eval samples n lanes per question once; any k <= n is then a matter of counting. pass@k is
the unbiased estimator of Chen et al. (2021), `1 - C(n-c, k)/C(n, k)`; majority@k is the chance
that a majority vote over k of the question's lanes, drawn without replacement, elects a correct
answer. The vote is `vote_fold`'s: answers normalised, a lane without one abstains, ties go to
the tied answer whose first lane in the subset comes first (`first_lane`). It is counted
exactly where that is cheap, else estimated from seeded random subsets with its standard
error. Both average over questions, with the standard error across questions.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import itertools
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanefold.config import VOTE_REDUCER
from lanefold.evaluate._eval_records import EvalPaths, pass_at_k, read_manifest, read_results
from lanefold.primitives import ConfigError, RunNotFoundError, normalize_answer

__all__ = (
    "EXACT_LIMIT",
    "REDUCERS",
    "SUBSAMPLES",
    "Curve",
    "Estimate",
    "Point",
    "Pool",
    "PoolQuestion",
    "curve_seed",
    "majority_at_k",
    "pass_at_k",
    "read_pool",
    "scaling_curve",
)

EXACT_LIMIT = 20_000  # vote-count patterns counted before majority@k is subsampled instead
SUBSAMPLES = 2_000  # random k-subsets per question when it is
REDUCERS = (VOTE_REDUCER, "pass")
_MAX_CLASSES = 200  # distinct answers beyond which the exact count (one level each) is not tried


@dataclass(frozen=True, slots=True)
class Estimate:
    """A probability, its standard error (0.0 when exact) and whether it was counted exactly."""

    value: float
    se: float
    exact: bool


def majority_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    k: int,
    *,
    rng: random.Random | None = None,
    limit: int = EXACT_LIMIT,
    samples: int = SUBSAMPLES,
) -> Estimate:
    """The chance that a majority vote over k lanes drawn without replacement elects a right
    answer. `answers` holds each lane's answer in lane order (None abstains; answers are
    normalised), `correct` each lane's verdict; the vote is right when its winner's first lane
    in the subset is. Exact while counting takes at most `limit` steps; else the share of
    `samples` random k-subsets, drawn with `rng` (default seed 0), whose vote is right."""
    n = len(answers)
    if len(correct) != n:
        raise ConfigError(f"majority@k: {n} answers but {len(correct)} verdicts")
    if not 1 <= k <= n:
        raise ConfigError(f"majority@k needs 1 <= k <= n, got n={n} k={k}")
    votes = [_norm(answer) for answer in answers]
    lanes: dict[str, list[int]] = {}
    for position, answer in enumerate(votes):
        if answer is not None:
            lanes.setdefault(answer, []).append(position)
    if all(len({correct[i] for i in same}) == 1 for same in lanes.values()):
        # Each answer right or wrong as a whole: count vote patterns, right answers first
        # (the wrong ones' counts are then bounded by the right ones' best).
        classes = sorted(lanes.values(), key=lambda same: (not correct[same[0]], same[0]))
        n_right = sum(1 for same in classes if correct[same[0]])
        if n_right == 0:
            return Estimate(0.0, 0.0, True)
        if len(classes) <= _MAX_CLASSES:
            wins = _exact_wins(classes, n_right, n - sum(map(len, classes)), k, limit)
            if wins is not None:
                return Estimate(min(1.0, wins / math.comb(n, k)), 0.0, True)
    if math.comb(n, k) <= limit:  # a verdict per lane (tests of code, say): every subset
        subsets = itertools.combinations(range(n), k)
        return Estimate(sum(_elects(votes, correct, s) for s in subsets) / math.comb(n, k), 0.0, True)
    rng = rng or random.Random(0)
    hits = sum(_elects(votes, correct, sorted(rng.sample(range(n), k))) for _ in range(samples))
    p = hits / samples
    return Estimate(p, math.sqrt(p * (1 - p) / samples), False)


def _elects(votes: list[str | None], correct: Sequence[bool], subset: Iterable[int]) -> bool:
    """Whether the vote of the lanes `subset` (ascending) is right: the most votes win, the
    tied answer whose first lane comes first among equals (insertion order, kept by max)."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for position in subset:
        answer = votes[position]
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
            first.setdefault(answer, position)
    return bool(counts) and correct[first[max(counts, key=counts.__getitem__)]]


def _norm(answer: str | None) -> str | None:
    return (normalize_answer(answer) or None) if answer is not None else None


class _TooMany(Exception):
    pass


def _exact_wins(classes: list[list[int]], n_right: int, abstain: int, k: int, limit: int) -> int | None:
    """How many k-subsets elect one of the first `n_right` classes (lane positions, sorted),
    or None past `limit` steps. A step places one class's count; a full pattern (a count per
    class) holds prod C(size, count) subsets, of which the tie rule's share is counted lane by
    lane (`_tie_ways`). A wrong class never counts more than the best right one."""
    sizes = [len(c) for c in classes]
    m, steps, total, picks = len(classes), 0, 0, [0] * len(classes)
    loose = [0] * (m + 1)  # what the classes from p on (and the abstainers) can take
    loose[m] = abstain
    for p in range(m - 1, -1, -1):
        loose[p] = loose[p + 1] + sizes[p]
    bounded = loose[:]  # the same once the wrong classes are bounded by the right ones' best

    def place(p: int, left: int) -> None:
        nonlocal steps, total
        steps += 1
        if steps > limit:
            raise _TooMany
        if p == n_right:  # the right answers are placed: bound the wrong ones by their best
            top = max(picks[:n_right])
            if top == 0:
                return
            for q in range(m - 1, n_right - 1, -1):
                bounded[q] = bounded[q + 1] + min(sizes[q], top)
        if p == m:
            if left <= abstain:
                total += _ways(classes, picks, n_right, abstain, left)
            return
        if p < n_right:
            cap, room = sizes[p], loose[p + 1]
        else:
            cap, room = min(sizes[p], max(picks[:n_right])), bounded[p + 1]
        for j in range(max(0, left - room), min(cap, left) + 1):
            picks[p] = j
            place(p + 1, left - j)
        picks[p] = 0

    try:
        place(0, k)
    except _TooMany:
        return None
    return total


def _ways(classes: list[list[int]], picks: list[int], n_right: int, abstain: int, left: int) -> int:
    top = max(picks)
    tied = [i for i, j in enumerate(picks) if j == top]
    rest = math.comb(abstain, left)
    for i, j in enumerate(picks):
        if j != top:
            rest *= math.comb(len(classes[i]), j)
    if len(tied) == 1:
        return rest * math.comb(len(classes[tied[0]]), top)
    return rest * sum(_tie_ways(classes, tied, c, top) for c in tied if c < n_right)


def _tie_ways(classes: list[list[int]], tied: list[int], c: int, t: int) -> int:
    """Of the ways to pick t lanes from each tied class, those where class c holds the lowest
    picked lane: c picks some x and t-1 lanes after it; every other tied class t after x."""
    total = 0
    for x in classes[c]:
        ways = math.comb(_after(classes[c], x), t - 1)
        for d in tied:
            if d != c and ways:
                ways *= math.comb(_after(classes[d], x), t)
        total += ways
    return total


def _after(lanes: list[int], x: int) -> int:
    return len(lanes) - bisect.bisect_right(lanes, x)


# -- the pool -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolQuestion:
    """One question of an eval: its completed lanes' answers (None: nothing extracted) and
    the eval scorer's verdict on each, in lane order."""

    index: int
    run_id: str
    answers: tuple[str | None, ...]
    correct: tuple[bool, ...]

    @property
    def n(self) -> int:
        return len(self.answers)

    @property
    def c(self) -> int:
        return sum(self.correct)


@dataclass(frozen=True, slots=True)
class Pool:
    """An eval's pool: the questions whose runs finished, and how many failed (left out)."""

    eval_id: str
    questions: tuple[PoolQuestion, ...]
    failed: int = 0
    scorer: str | None = None


def read_pool(runs_dir: str | Path, eval_id: str) -> Pool:
    """An eval's pool from `runs_dir/<eval_id>/results.jsonl`: each finished question's
    completed lanes with the verdict the eval's own scorer gave each (`lane_answers`,
    `lane_correct`), so a curve scores as the eval did. Questions whose run failed are left
    out, as the eval's summary leaves them out of its pass@k. Reads files only."""
    paths = EvalPaths(runs_dir, eval_id)
    if not paths.results.is_file():
        raise RunNotFoundError(f"{paths.results}: no eval {eval_id!r} in {runs_dir}")
    rows = read_results(paths.results)
    questions, failed = [], 0
    for index, row in sorted(rows.items()):
        if row.status == "failed":
            failed += 1
            continue
        if len(row.lane_answers) != len(row.lane_correct):
            raise ConfigError(
                f"{paths.results}: question {index} has {len(row.lane_answers)} "
                f"lane answers but {len(row.lane_correct)} verdicts"
            )
        questions.append(PoolQuestion(index, row.run_id, tuple(row.lane_answers), tuple(row.lane_correct)))
    if not questions:
        raise ConfigError(f"{paths.results}: no finished question to draw a curve from")
    scorer = None
    with contextlib.suppress(ConfigError):
        scorer = read_manifest(runs_dir, eval_id).scorer
    return Pool(eval_id, tuple(questions), failed, scorer)


# -- the curve ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    """One k: pass@k and majority@k, averaged over questions, each with the standard error
    across questions (which holds the subsampling's); `majority_at_k_mc_se` is the
    subsampling's part alone and `exact` the number of questions counted exactly. The
    majority fields are None with reducer "pass"."""

    k: int
    pass_at_k: float
    pass_at_k_se: float
    majority_at_k: float | None = None
    majority_at_k_se: float | None = None
    majority_at_k_mc_se: float | None = None
    exact: int | None = None


@dataclass(frozen=True, slots=True)
class Curve:
    """The curve of one eval: what `curve.json` holds."""

    eval_id: str
    reducer: str
    seed: int
    questions: int
    failed: int  # questions left out: their runs failed
    lanes: tuple[int, int]  # fewest and most lanes of a question
    points: tuple[Point, ...]
    scorer: str | None = None
    exact_limit: int = EXACT_LIMIT
    subsamples: int = SUBSAMPLES
    tie_break: str = "first_lane"

    def as_json(self) -> dict[str, Any]:
        return {
            "eval_id": self.eval_id,
            "reducer": self.reducer,
            "tie_break": self.tie_break,
            "scorer": self.scorer,
            "seed": self.seed,
            "exact_limit": self.exact_limit,
            "subsamples": self.subsamples,
            "questions": self.questions,
            "failed": self.failed,
            "lanes_min": self.lanes[0],
            "lanes_max": self.lanes[1],
            "points": [{name: getattr(p, name) for name in Point.__slots__} for p in self.points],
        }


def curve_seed(eval_id: str) -> int:
    """The subsampling seed of an eval's curve unless one is given: a hash of its id."""
    return int.from_bytes(hashlib.blake2b(eval_id.encode(), digest_size=8).digest(), "big") >> 1


def scaling_curve(
    pool: Pool,
    ks: Iterable[int],
    *,
    reducer: str = VOTE_REDUCER,
    seed: int | None = None,
    limit: int = EXACT_LIMIT,
    samples: int = SUBSAMPLES,
) -> Curve:
    """pass@k, and with the vote (`VOTE_REDUCER`, the default) majority@k, for each k over the pool's
    questions (`limit` and `samples` as `majority_at_k` takes them). Random subsets, where a
    question needs them, are seeded by (seed, question, k): the same pool and seed give the
    same curve; the seed defaults to a hash of the eval id."""
    if reducer not in REDUCERS:
        raise ConfigError(f"unknown reducer {reducer!r}: use {' or '.join(REDUCERS)}")
    questions = pool.questions
    if not questions:
        raise ConfigError(f"eval {pool.eval_id}: no questions to draw a curve from")
    ks = sorted(set(ks))
    if not ks:
        raise ConfigError("no k values")
    fewest = min(questions, key=lambda q: q.n)
    for k in ks:
        if k < 1:
            raise ConfigError(f"k={k}: must be at least 1")
        if k > fewest.n:
            raise ConfigError(
                f"k={k} is more than the {fewest.n} completed lanes of question "
                f"{fewest.index} (run {fewest.run_id})"
            )
    seed = curve_seed(pool.eval_id) if seed is None else seed
    points = []
    for k in ks:
        mean, se = _mean_se([pass_at_k(q.n, q.c, k) for q in questions])
        if reducer != VOTE_REDUCER:
            points.append(Point(k, mean, se))
            continue
        votes = [
            majority_at_k(
                q.answers,
                q.correct,
                k,
                rng=random.Random(f"{seed}:{q.index}:{k}"),
                limit=limit,
                samples=samples,
            )
            for q in questions
        ]
        vote_mean, vote_se = _mean_se([v.value for v in votes])
        mc_se = math.sqrt(math.fsum(v.se**2 for v in votes)) / len(votes)
        points.append(Point(k, mean, se, vote_mean, max(vote_se, mc_se), mc_se, sum(v.exact for v in votes)))
    return Curve(
        pool.eval_id,
        reducer,
        seed,
        len(questions),
        pool.failed,
        (fewest.n, max(q.n for q in questions)),
        tuple(points),
        pool.scorer,
        limit,
        samples,
    )


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, statistics.stdev(values) / math.sqrt(len(values))
