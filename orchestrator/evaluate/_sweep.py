"""Accuracy against paid spend for every loop: each config fitted at each budget.

    sweep = await run_sweep(["greedy.toml", "refine.toml"], items, sweep_id="sw",
                            budgets=[200, 400, 800], unit="tokens")

Every config runs a pilot (`_fitting`), then is fitted by its loop's own `fit` at each budget
(what it chose is kept in each point's `fit`). Each point is an eval of its own,
`<sweep_id>-<name>-<budget>` (resumable), except where the loop declares its lanes a pool
(`pooled_lanes`: a smaller budget's lanes are a subset of a larger one's) and `pool` is on:
then only the largest budget is sampled, and the smaller points are read from its lanes as
`curve` reads them (majority@k over subsets), calling no backend again, and say so. A greedy
config (one lane at temperature 0) is never fitted: it runs once, as configured, and is the
baseline every real run is tested against (McNemar's exact test, Holm-adjusted). The sweep
writes `runs/<sweep_id>/sweep.json` and `sweep.png`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from lanefold.config import LoopConfig, load_config, preflight
from lanefold.evaluate._compare import arm_names, replace_file
from lanefold.evaluate._curve import read_pool
from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._equal_budget import BudgetMode, checked_budget, is_greedy
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import EvalSummary, FittedBudget, QuestionResult, as_json, read_results
from lanefold.evaluate._fitting import (
    UNITS,
    Arm,
    Fitted,
    OnResult,
    OnStart,
    check_floor,
    check_pricing,
    fit_arm,
    run_pilots,
)
from lanefold.evaluate._item import Item
from lanefold.evaluate._pilot import spread
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.evaluate._sweep_plot import draw
from lanefold.evaluate._sweep_points import eval_point, no_point, pool_point, tested
from lanefold.evaluate._sweep_records import Baseline, Sweep, SweepLine, SweepPoint
from lanefold.evaluate._waves import prefill_passes
from lanefold.execution import open_store
from lanefold.primitives import BudgetTooSmallError, ConfigError, validate_run_id
from lanefold.primitives.internal import plugin_folders, pooled_lanes

__all__ = ("Baseline", "Sweep", "SweepLine", "SweepPoint", "parse_budgets", "run_sweep")

SWEEP_UNITS: tuple[BudgetMode, ...] = ("tokens", "cost")


def parse_budgets(text: str, unit: str) -> list[float]:
    """`200,400,800` as budgets in `unit`, each positive (whole for tokens), ascending."""
    if unit not in SWEEP_UNITS:
        raise ConfigError(f"--unit: unknown {unit!r}: tokens or cost")
    values: list[float] = []
    for word in filter(None, (part.strip() for part in text.split(","))):
        try:
            value = float(word)
        except ValueError:
            raise ConfigError(f"--budgets: {word!r} is not a number") from None
        values.append(checked_budget(unit, value))
    if not values:
        raise ConfigError("--budgets: give one or more budgets, as 200,400,800")
    return sorted(set(values))


def _label(budget: float) -> str:
    """A budget in an eval id: `400`, `0p0012` (no `.`: an eval id may not end like a run's)."""
    return re.sub(r"[^A-Za-z0-9_-]", "p", f"{budget:g}")


async def run_sweep(
    configs: Sequence[str | Path],
    items: Sequence[Item],
    *,
    sweep_id: str,
    budgets: Sequence[float],
    unit: str = "tokens",
    runs_dir: str | Path = "runs",
    concurrency: int = 8,
    scorer: str | None = None,
    dataset: DatasetSpec | None = None,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
    plot: bool = True,
    pool: bool = True,
    stop_reason: Callable[[], str] = lambda: "cancelled",
) -> Sweep:
    """Fit every config at every budget and run (or read) each point; write
    `runs_dir/<sweep_id>/sweep.json` (and `sweep.png` unless `plot` is False). `pool=False`
    samples every point (a real run at each budget) where a pool would be read. Bad input is
    refused before anything runs; the same call again runs nothing already recorded."""
    validate_run_id(sweep_id)
    if unit not in SWEEP_UNITS:
        raise ConfigError(f"--unit: unknown {unit!r}: tokens or cost")
    mode: BudgetMode = "cost" if unit == "cost" else "tokens"
    if not budgets:
        raise ConfigError("--budgets: give one or more budgets, as 200,400,800")
    budgets = sorted({checked_budget(mode, b) for b in budgets})
    if not configs:
        raise ConfigError("sweep needs at least one config")
    if concurrency < 1:
        raise ConfigError(f"--concurrency: must be at least 1, got {concurrency}")
    arms: list[Arm] = [
        (name, str(path), load_config(path)) for name, path in zip(arm_names(configs), configs, strict=True)
    ]
    greedy = [arm for arm in arms if is_greedy(arm[2])]
    if len(greedy) > 1:
        raise ConfigError(
            f"{greedy[1][1]}: greedy (one lane at temperature 0) as {greedy[0][1]} is; a sweep "
            "takes one greedy config, its baseline"
        )
    with plugin_folders(*(config.folder for _, _, config in arms)):
        given = resolve_scorer(scorer, items).verifier(items) is not None
    for name, source, config in arms:
        preflight(config, source, verifier_given=given)
        for budget in budgets:
            validate_run_id(f"{sweep_id}-{name}-{_label(budget)}")
    questions = [item.question for item in items]
    check_pricing(arms, mode)
    check_floor(arms, mode, budgets[0], questions)
    folder = Path(runs_dir) / sweep_id
    if (folder / "eval.json").exists() or (folder / "events.jsonl").exists():
        raise ConfigError(
            f"{folder}: is an eval's or a run's folder, not a sweep's: choose another --sweep-id"
        )

    async def evaluate(config: LoopConfig, eval_id: str, budget: float | None = None) -> EvalSummary:
        return await run_eval(
            config,
            items,
            eval_id=eval_id,
            fitted_to=FittedBudget(unit=mode, budget=budget) if budget is not None else None,
            runs_dir=runs_dir,
            concurrency=concurrency,
            scorer=scorer,
            dataset=dataset,
            on_start=functools.partial(on_start, eval_id) if on_start else None,
            on_result=functools.partial(on_result, eval_id) if on_result else None,
            stop_reason=stop_reason,
        )

    pilots = await run_pilots(
        arms,
        items,
        mode,
        prefix=sweep_id,
        runs_dir=str(runs_dir),
        concurrency=concurrency,
        scorer=scorer,
        on_start=on_start,
        on_result=on_result,
        stop_reason=stop_reason,
    )
    lines: list[SweepLine] = []
    marks: dict[str, dict[int, bool]] = {}
    baseline: Baseline | None = None
    greedy_marks: dict[int, bool] = {}
    chosen_scorer = ""
    for arm in arms:
        name, source, config = arm
        if is_greedy(config):  # never fitted: one run as configured, drawn at what it paid
            eval_id = f"{sweep_id}-{name}-greedy"
            summary = await evaluate(config, eval_id)
            chosen_scorer = summary.scorer
            answered = _rows(config, runs_dir, eval_id, items)
            greedy_marks = {row.index: row.correct for row in answered}
            mean, least, most = spread(answered, mode)
            baseline = Baseline(
                name=name,
                config=source,
                eval_id=eval_id,
                accuracy=summary.accuracy,
                interval=summary.interval,
                paid_mean=mean,
                paid_min=least,
                paid_max=most,
            )
            continue
        fitted: dict[int, Fitted] = {}
        points: dict[int, SweepPoint] = {}
        for i, budget in enumerate(budgets):
            try:
                fitted[i] = fit_arm(arm, mode, budget, questions, pilots)
            except BudgetTooSmallError as exc:
                points[i] = no_point(budget, f"{sweep_id}-{name}-{_label(budget)}", str(exc))
        pools = {i: pooled_lanes(f.config.loop_class(), f.config.loop_params) for i, f in fitted.items()}
        pooled = pool and bool(fitted) and None not in pools.values()
        top = max(fitted, default=None)
        rows: list[QuestionResult] = []  # the last run's: the pool's, where one is read
        for i in sorted(fitted):
            if pooled and i != top:
                continue  # read from the largest budget's lanes below
            eval_id = f"{sweep_id}-{name}-{_label(budgets[i])}"
            summary = await evaluate(fitted[i].config, eval_id, budgets[i])
            chosen_scorer = summary.scorer
            rows = _rows(fitted[i].config, runs_dir, eval_id, items)
            marks[eval_id] = {row.index: row.correct for row in rows}
            points[i] = eval_point(budgets[i], eval_id, fitted[i], pools[i], summary, rows, mode)
        if pooled and top is not None:
            top_id = f"{sweep_id}-{name}-{_label(budgets[top])}"
            read = read_pool(runs_dir, top_id)
            for i in sorted(fitted):
                if i != top and read is not None:
                    point_id = f"{sweep_id}-{name}-{_label(budgets[i])}"
                    passes = (prefill_passes(fitted[i].config), prefill_passes(fitted[top].config))
                    points[i] = pool_point(
                        budgets[i], point_id, top_id, fitted[i], pools[i] or 1, read, rows, mode, passes
                    )
        lines.append(
            SweepLine(
                name=name,
                config=source,
                loop=config.loop.coordinator,
                pilot=pilots.means[name],
                points=[points[i] for i in range(len(budgets))],
            )
        )
    statement = ""
    if baseline is not None:
        lines, statement = tested(lines, greedy_marks, marks)
    sweep = Sweep(
        sweep_id=sweep_id,
        dataset=dataset.spec if dataset else "<items>",
        scorer=chosen_scorer,
        questions=len(items),
        unit=UNITS[mode],
        budgets=list(budgets),
        pilot_questions=pilots.questions,
        baseline=baseline,
        configs=lines,
        plot=None,
        tests=statement,
    )
    folder.mkdir(parents=True, exist_ok=True)
    if plot:
        sweep = sweep.model_copy(update={"plot": draw(sweep, folder / "sweep.png")})
    replace_file(folder / "sweep.json", as_json(sweep))
    return sweep


def _rows(
    config: LoopConfig, runs_dir: str | Path, eval_id: str, items: Sequence[Item]
) -> list[QuestionResult]:
    store = open_store(config.store.url, runs_dir, config.store.password_env)
    wanted = {item.index for item in items}
    return [row for i, row in sorted(read_results(store.eval_record(eval_id)).items()) if i in wanted]
