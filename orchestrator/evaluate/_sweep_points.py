"""A sweep's points: a real run at the fitted params, a point read from a pool, a budget a loop
cannot use, and each real run tested against greedy.

A point read from a pool (majority@k over subsets of a larger budget's lanes) is an average
over subsets, not a run: it says so (`source` "pool"), is drawn hollow, and is never tested
against greedy. A loop that cannot use a budget (its fit refuses it, or the budget refuses
every question's run) is shown as such, not as a point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from lanefold.evaluate._compare import OVER, UNDER
from lanefold.evaluate._curve import Pool, scaling_curve
from lanefold.evaluate._equal_budget import BudgetMode
from lanefold.evaluate._eval_records import Z95, EvalSummary, QuestionResult
from lanefold.evaluate._fit_record import FitRecord
from lanefold.evaluate._fitting import Fitted
from lanefold.evaluate._paired import CORRECTION, holm, mcnemar
from lanefold.evaluate._pilot import paid, spread
from lanefold.evaluate._sweep_records import SweepLine, SweepPoint

__all__ = ("eval_point", "flag", "no_point", "pool_point", "tested")


def flag(paid_mean: float, budget: float) -> Literal["under", "over"] | None:
    """ "under" or "over" where a point paid under 80% or over 105% of its budget."""
    if paid_mean < UNDER * budget:
        return "under"
    if paid_mean > OVER * budget:
        return "over"
    return None


def eval_point(
    budget: float,
    eval_id: str,
    fitted: Fitted,
    lanes: int | None,
    summary: EvalSummary,
    rows: Sequence[QuestionResult],
    mode: BudgetMode,
) -> SweepPoint:
    """A real run at the fitted params: a point, unless the budget refused every question."""
    mean, least, most = spread(rows, mode)
    refused = sum(row.capped and row.status == "failed" for row in rows)
    every = bool(rows) and refused == len(rows)
    return SweepPoint(
        budget=budget,
        point_id=eval_id,
        eval_id=eval_id,
        source="eval",
        status="refused" if every else "ran",
        note="the budget refused every question's run" if every else None,
        fitted=fitted.keys,
        fit=fitted.record,
        lanes=lanes,
        n=summary.n,
        accuracy=None if every else summary.accuracy,
        interval=None if every else summary.interval,
        paid_mean=mean,
        paid_min=least,
        paid_max=most,
        flag=None if every else flag(mean, budget),
        capped=sum(row.capped for row in rows),
        refused=refused,
    )


def no_point(budget: float, point_id: str, note: str, record: FitRecord | None = None) -> SweepPoint:
    """A budget the loop cannot use (its fit refused it): shown as such, nothing run."""
    return SweepPoint(
        budget=budget,
        point_id=point_id,
        eval_id=None,
        source="none",
        status="below_least",
        note=note,
        fitted={},
        fit=record,
        lanes=None,
        n=0,
        accuracy=None,
        interval=None,
        paid_mean=0.0,
        paid_min=0.0,
        paid_max=0.0,
    )


def _around(mean: float, se: float) -> tuple[float, float]:
    return max(0.0, mean - Z95 * se), min(1.0, mean + Z95 * se)


def _scaled(row: QuestionResult, k: int, passes: tuple[int, int], mode: BudgetMode) -> float:
    """What `row`'s question would have paid with k of its lanes, its prompt prefilled
    `passes[0]` times where the pool's prefilled it `passes[1]` times (requests of at most
    `max_concurrency` lanes): the computed prompt scaled by passes, the cached prompt by the
    lanes that did not prefill it, the per-lane lines (decode, cut-off, KV residency) by lanes,
    the judge's as they were."""
    n = max(1, row.lanes)
    if n <= k:
        return paid(row, mode)
    share = k / n
    prefilled = passes[0] / passes[1] if passes[1] else 1.0
    cached = (k - passes[0]) / (n - passes[1]) if n > passes[1] else 0.0
    if mode == "tokens":
        tokens = row.tokens
        return (
            prefilled * tokens.get("prefill", 0)
            + tokens.get("verifier", 0)
            + share * (tokens.get("decode", 0) + tokens.get("cut_off", 0))
        )
    usd = row.cost_by_line
    lanes = sum(usd.get(line, 0.0) for line in ("decode", "cut_off", "kv_residency"))
    return (
        prefilled * usd.get("prefill", 0.0)
        + usd.get("verifier", 0.0)
        + cached * usd.get("cached_prefill", 0.0)
        + share * lanes
    )


def pool_point(
    budget: float,
    point_id: str,
    eval_id: str,
    fitted: Fitted,
    k: int,
    pool: Pool,
    rows: Sequence[QuestionResult],
    mode: BudgetMode,
    passes: tuple[int, int] = (1, 1),
) -> SweepPoint:
    """A point read from a pool's lanes: majority@k over its subsets, and the pool's bill with
    its lanes scaled to k (and its prompt's prefill passes, `passes`: k's and the pool's)."""
    point = scaling_curve(pool, [k]).points[0]
    accuracy = point.majority_at_k if point.majority_at_k is not None else point.pass_at_k
    se = point.majority_at_k_se if point.majority_at_k_se is not None else point.pass_at_k_se
    spent = [_scaled(row, k, passes, mode) for row in rows]
    mean = math.fsum(spent) / len(spent) if spent else 0.0
    return SweepPoint(
        budget=budget,
        point_id=point_id,
        eval_id=eval_id,
        source="pool",
        fitted=fitted.keys,
        fit=fitted.record,
        lanes=k,
        n=len(pool.questions),
        accuracy=accuracy,
        interval=_around(accuracy, se),
        paid_mean=mean,
        paid_min=min(spent, default=0.0),
        paid_max=max(spent, default=0.0),
        flag=flag(mean, budget),
    )


def tested(
    lines: Sequence[SweepLine], greedy: Mapping[int, bool], marks: Mapping[str, Mapping[int, bool]]
) -> tuple[list[SweepLine], str]:
    """Every real run (`marks`: its questions' correctness, by eval id) tested against greedy's
    with McNemar's exact test, Holm-adjusted across all of them; and the statement of it."""
    keys = [
        (li, pi)
        for li, line in enumerate(lines)
        for pi, point in enumerate(line.points)
        if point.status == "ran" and point.source == "eval" and point.eval_id in marks
    ]
    tests = [mcnemar(marks[str(lines[li].points[pi].eval_id)], greedy) for li, pi in keys]
    adjusted = holm([test.p_value for test in tests])
    m = sum(p is not None for p in adjusted)
    found = {
        key: test.model_copy(update={"p_adjusted": p, "adjusted_over": m if p is not None else None})
        for key, test, p in zip(keys, tests, adjusted, strict=True)
    }
    out = [
        line.model_copy(
            update={
                "points": [
                    point.model_copy(update={"against_greedy": found.get((li, pi))})
                    for pi, point in enumerate(line.points)
                ]
            }
        )
        for li, line in enumerate(lines)
    ]
    statement = (
        f"McNemar's exact test of each real run against greedy on the same questions, "
        f"Holm-adjusted across {m} test{'s' * (m != 1)} ({CORRECTION}); points read from a pool "
        "are not tested"
    )
    return out, statement
