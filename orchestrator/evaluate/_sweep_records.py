"""What `orchestrator sweep` writes: `sweep.json`, a line per config and a point per budget."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from lanefold.evaluate._fit_record import FitRecord
from lanefold.evaluate._paired import McNemar

__all__ = ("Baseline", "Sweep", "SweepLine", "SweepPoint")


class SweepPoint(BaseModel):
    """One config at one budget: the keys its fit set (`fitted`) and the whole record of the
    fit (`fit`); the eval it ran (`source` "eval": a real run at the fitted params) or whose
    lanes it was read from (`source` "pool": majority@k over subsets of them, its interval from
    the standard error across questions; else the 95% Wilson interval), and what a question
    paid (for a pool point, the pool's bill with its lanes scaled to k).

    `status` "ran" is a point. A loop that cannot use the budget is shown as such, never as a
    point (no accuracy, nothing drawn): "below_least", its fit refused the budget (below what
    it must spend to run as itself, `note` says what: its least lanes, a debate's first
    rebuttal round); "refused", the budget refused every question's run. `capped`: questions
    cut at their per-question limit; `refused`: questions whose run it refused (failed, scored
    wrong). `against_greedy`: McNemar's exact test against the greedy baseline on the same
    questions (an eval point only; Holm-adjusted across every point the sweep tests)."""

    model_config = ConfigDict(frozen=True)

    budget: float
    point_id: str
    eval_id: str | None
    source: Literal["eval", "pool", "none"]
    status: Literal["ran", "below_least", "refused"] = "ran"
    note: str | None = None
    fitted: dict[str, object]
    fit: FitRecord | None = None
    lanes: int | None
    n: int
    accuracy: float | None
    interval: tuple[float, float] | None
    paid_mean: float
    paid_min: float
    paid_max: float
    flag: Literal["under", "over"] | None = None
    capped: int = 0
    refused: int = 0
    against_greedy: McNemar | None = None


class SweepLine(BaseModel):
    """One config across the budgets, and its pilot's mean paid."""

    model_config = ConfigDict(frozen=True)

    name: str
    config: str
    loop: str
    pilot: float
    points: list[SweepPoint]


class Baseline(BaseModel):
    """The greedy config (one lane at temperature 0, as configured): never fitted to a budget,
    run once (`eval_id`) and drawn at what it really paid a question."""

    model_config = ConfigDict(frozen=True)

    name: str
    accuracy: float
    interval: tuple[float, float]
    config: str = ""
    eval_id: str | None = None
    paid_mean: float = 0.0
    paid_min: float = 0.0
    paid_max: float = 0.0


class Sweep(BaseModel):
    """`sweep.json`. `tests` says how the points were tested against greedy (McNemar's exact
    test, Holm's correction and over how many points), empty without a greedy config."""

    model_config = ConfigDict(frozen=True)

    sweep_id: str
    dataset: str
    scorer: str
    questions: int
    unit: str
    budgets: list[float]
    pilot_questions: int
    baseline: Baseline | None
    configs: list[SweepLine]
    plot: str | None
    tests: str = ""
