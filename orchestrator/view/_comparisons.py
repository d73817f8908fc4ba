"""What the compare and sweep pages are drawn from, read from `compare.json` and `sweep.json`.

Only the compared configs are points: each labelled with its config's name and the keys its fit
set (`vote k=23`), placed by what a question paid in the comparison's own unit (tokens for a
token budget, dollars only for a dollar one). Pilots are listed apart and never drawn. Whether a
point is over its budget is the record's `flag` (the evaluate code's 105% rule) and the frontier
is the evaluate code's own (`pareto_frontier`, in `_spots`) over the points within budget: an
over-budget point is marked and never on it. Greedy, where it ran, is the baseline line.
Nothing here is markup.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lanefold.evaluate import Comparison, Sweep, pilot_id, readable
from lanefold.primitives import ConfigError
from lanefold.view._spots import Spot, chart, framed, label

__all__ = (
    "Pilot",
    "Unused",
    "compare_context",
    "list_comparisons",
    "read_record",
    "record_context",
    "sweep_context",
)

KINDS: dict[str, type[Comparison] | type[Sweep]] = {
    "compare": Comparison,
    "sweep": Sweep,
}  # a record's kind: its file is `<kind>.json`


@dataclass(frozen=True, slots=True)
class Pilot:
    """A config's pilot: listed apart, never a point (it ran as configured, not fitted)."""

    name: str
    eval_id: str
    questions: int
    paid: float


@dataclass(frozen=True, slots=True)
class Unused:
    """A budget a sweep's config cannot use (its fit refused it, or the budget refused every
    run): listed, never drawn."""

    name: str
    budget: float
    status: str
    note: str


def read_record(runs_dir: Path, kind: str, record_id: str) -> Comparison | Sweep | None:
    """The `kind` record (`compare.json` or `sweep.json`) of `record_id` under `runs_dir`; None
    where there is none; a ConfigError naming the file where it cannot be read."""
    path = runs_dir / record_id / f"{kind}.json"
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}") from None
    try:
        return KINDS[kind].model_validate_json(body)
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not a {kind} record: {first}") from None


def list_comparisons(runs_dir: Path) -> list[tuple[str, str]]:
    """Every (kind, id) with a record under `runs_dir`, by id."""
    try:
        folders = sorted(p for p in runs_dir.iterdir() if p.is_dir())
    except OSError:
        return []
    return [(kind, p.name) for p in folders for kind in KINDS if (p / f"{kind}.json").is_file()]


def _command(words: list[str], where: Sequence[str]) -> str:
    return shlex.join([*words, *where])


def compare_context(comparison: Comparison, where: Sequence[str]) -> dict[str, object]:
    """What compare.html is drawn from: every config a point, pilots apart, the command."""
    unit = comparison.configs[0].unit if comparison.configs else "tokens"
    spots = framed(
        [
            Spot(
                name=c.name,
                label=label(c.name, c.fitted),
                accuracy=c.accuracy,
                low=c.interval[0],
                high=c.interval[1],
                paid=c.paid_mean,
                over=c.flag == "over",
                eval_id=c.eval_id,
                budget=c.budget,
                greedy=c.fit is not None and c.fit.greedy,
            )
            for c in comparison.configs
        ]
    )
    pilots = [
        Pilot(c.name, c.fit.pilot.eval_id, c.fit.pilot.questions, c.fit.pilot.mean_paid)
        for c in comparison.configs
        if c.fit is not None and c.fit.pilot is not None
    ]
    budget = comparison.equal_budget
    words = ["orchestrator", "compare", *(c.config for c in comparison.configs)]
    words += ["--dataset", comparison.dataset, "--limit", str(comparison.questions)]
    if comparison.scorer:
        words += ["--scorer", comparison.scorer]
    if budget is not None:
        words += ["--equal-budget", budget.mode]
        if budget.source == "--budget":
            words += ["--budget", f"{budget.limit:g}"]
    words += ["--compare-id", comparison.compare_id]
    return {
        "title": f"compare {comparison.compare_id}",
        "live": None,
        "record": comparison,
        "unit": unit,
        "budget": readable(budget.limit, unit) if budget is not None else None,
        "spots": spots,
        "chart": chart(spots, unit, budget.limit if budget is not None else None),
        "pilots": pilots,
        "unused": [],
        "command": _command(words, where),
    }


def sweep_context(sweep: Sweep, where: Sequence[str]) -> dict[str, object]:
    """What sweep.html is drawn from: every config at every budget it ran a point, greedy the
    baseline, budgets a config cannot use listed, pilots apart, the command."""
    spots: list[Spot] = []
    unused: list[Unused] = []
    pilots: list[Pilot] = []
    for line in sweep.configs:
        for p in line.points:
            if p.status != "ran" or p.accuracy is None:
                unused.append(Unused(line.name, p.budget, p.status, p.note or ""))
                continue
            low, high = p.interval or (p.accuracy, p.accuracy)
            spots.append(
                Spot(
                    name=line.name,
                    label=label(line.name, p.fitted),
                    accuracy=p.accuracy,
                    low=low,
                    high=high,
                    paid=p.paid_mean,
                    over=p.flag == "over",
                    eval_id=p.eval_id,
                    budget=p.budget,
                    pool=p.source == "pool",
                )
            )
        recorded = next((p.fit.pilot.eval_id for p in line.points if p.fit and p.fit.pilot), None)
        pilots.append(
            Pilot(
                line.name,
                recorded or pilot_id(sweep.sweep_id, line.name),
                sweep.pilot_questions,
                line.pilot,
            )
        )
    base = sweep.baseline
    if base is not None:
        low, high = base.interval
        spots.append(
            Spot(
                base.name,
                label(base.name, {}),
                base.accuracy,
                low,
                high,
                base.paid_mean,
                False,
                base.eval_id,
                greedy=True,
            )
        )
    spots = framed(spots)
    mode = "cost" if sweep.unit == "USD" else "tokens"
    words = ["orchestrator", "sweep", *(line.config for line in sweep.configs)]
    if base is not None and base.config:
        words.append(base.config)
    words += ["--dataset", sweep.dataset, "--limit", str(sweep.questions)]
    words += ["--budgets", ",".join(f"{b:g}" for b in sweep.budgets), "--unit", mode]
    if sweep.scorer:
        words += ["--scorer", sweep.scorer]
    words += ["--sweep-id", sweep.sweep_id]
    return {
        "title": f"sweep {sweep.sweep_id}",
        "live": None,
        "record": sweep,
        "unit": sweep.unit,
        "budget": None,
        "spots": spots,
        "chart": chart(spots, sweep.unit, None),
        "pilots": pilots,
        "unused": unused,
        "command": _command(words, where),
    }


def record_context(record: Comparison | Sweep, where: Sequence[str]) -> dict[str, object]:
    """What the record's page (compare.html or sweep.html) is drawn from."""
    if isinstance(record, Comparison):
        return compare_context(record, where)
    return sweep_context(record, where)
