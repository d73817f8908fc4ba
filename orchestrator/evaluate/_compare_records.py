"""What `orchestrator compare` writes: `compare.json`, a line per config, best first."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanefold.evaluate._fit_record import FitRecord
from lanefold.evaluate._fitting import EqualBudget
from lanefold.evaluate._paired import McNemar

__all__ = ("Compared", "Comparison")


class Compared(BaseModel):
    """One config's line: its eval, accuracy and 95% Wilson interval, spend per question
    (tokens by bill line), the eval's wall time, the `[budget]` limits it ran with and
    McNemar's exact test against the best (Holm-adjusted across the table's tests). In `unit`
    (the equal budget's, else tokens): the `budget` a question (None: no equal budget), what a
    question paid (`paid_mean`, `paid_min`, `paid_max`), accuracy per 1,000 tokens, per dollar
    or per lane paid (`per_spend`), whether no other config within the budget is at least as
    accurate for no more paid (`pareto`; never a config over 105%), and `flag` "under" or
    "over" where it paid under 80% or over 105% of the budget. `fitted`: the loop keys its
    `fit` set for the budget; `fit`: what the fit chose and from which pilot figures;
    `capped`: the questions cut at their per-question limit, `refused` those whose run the
    budget refused outright (failed, scored wrong)."""

    model_config = ConfigDict(frozen=True)

    name: str
    config: str
    eval_id: str
    loop: str
    n: int
    correct: int
    accuracy: float
    interval: tuple[float, float]
    abstentions: int
    failed: int
    mean_lanes: float
    mean_tokens: dict[str, float]
    mean_cost: float
    wall_s: float
    limits: dict[str, Any]
    unit: str
    budget: float | None
    paid_mean: float
    paid_min: float
    paid_max: float
    per_spend: float | None
    pareto: bool = False
    flag: Literal["under", "over"] | None = None
    fitted: dict[str, Any] = {}
    fit: FitRecord | None = None
    capped: int = 0
    refused: int = 0
    against_best: McNemar | None  # None: this is the best (or the reference, where none is)


class Comparison(BaseModel):
    """`compare.json`: every config on the same questions, best first: by accuracy, then by
    lower mean cost, then fewer tokens computed, then the order given; a config that paid over
    105% of an equal budget after every one that did not. `best` is the first that did not
    (None where every config paid over); `tests` says how the others were tested against it
    (or against the first, where there is no best)."""

    model_config = ConfigDict(frozen=True)

    compare_id: str
    dataset: str
    scorer: str
    questions: int
    best: str | None
    tests: str = ""
    equal_budget: EqualBudget | None
    configs: list[Compared]
    plot: str | None
