"""What `orchestrator sweep` writes: `sweep.json`, a line per config and a point per budget."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ("Baseline", "Sweep", "SweepLine", "SweepPoint")


class SweepPoint(BaseModel):
    """One config at one budget: the keys its fit set, the eval it ran (`source` "eval") or
    whose lanes it was read from (`source` "pool": majority@k over subsets of them, its
    interval from the standard error across questions; else the 95% Wilson interval), and
    what a question paid (for a pool point, the pool's bill with its lanes scaled to k)."""

    model_config = ConfigDict(frozen=True)

    budget: float
    point_id: str
    eval_id: str
    source: Literal["eval", "pool"]
    fitted: dict[str, object]
    lanes: int | None
    n: int
    accuracy: float
    interval: tuple[float, float]
    paid_mean: float
    paid_min: float
    paid_max: float
    flag: Literal["under", "over"] | None = None


class SweepLine(BaseModel):
    """One config across the budgets, and its pilot's mean paid."""

    model_config = ConfigDict(frozen=True)

    name: str
    config: str
    loop: str
    pilot: float
    points: list[SweepPoint]


class Baseline(BaseModel):
    """The greedy line: a config of one lane at temperature 0, as configured."""

    model_config = ConfigDict(frozen=True)

    name: str
    accuracy: float
    interval: tuple[float, float]


class Sweep(BaseModel):
    """`sweep.json`."""

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
