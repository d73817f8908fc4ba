"""Accuracy against paid spend for every loop: each config fitted at each budget.

    sweep = await run_sweep(["greedy.toml", "refine.toml"], items, sweep_id="sw",
                            budgets=[200, 400, 800], unit="tokens")

Every config runs a pilot (`_fitting`), then is fitted by its loop's own `fit` at each budget.
Each point is an eval of its own, `<sweep_id>-<name>-<budget>` (resumable), except where the
loop declares its lanes a pool (`pooled_lanes`: a smaller budget's lanes are a subset of a
larger one's): then only the largest budget is sampled, and the smaller points are read from
its lanes as `curve` reads them (majority@k over subsets), calling no backend again. The
sweep writes `runs/<sweep_id>/sweep.json` and `sweep.png`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from lanefold.config import LoopConfig, load_config, preflight
from lanefold.evaluate._compare import OVER, UNDER, arm_names, replace_file
from lanefold.evaluate._curve import Pool, read_pool, scaling_curve
from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._equal_budget import BudgetMode, checked_budget
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import Z95, QuestionResult, as_json, read_results
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
from lanefold.evaluate._pilot import paid, spread
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.evaluate._sweep_plot import draw
from lanefold.evaluate._sweep_records import Baseline, Sweep, SweepLine, SweepPoint
from lanefold.execution import open_store
from lanefold.primitives import ConfigError, cost_shape, plugin_folders, pooled_lanes, validate_run_id

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
    stop_reason: Callable[[], str] = lambda: "cancelled",
) -> Sweep:
    """Fit every config at every budget and run (or read) each point; write
    `runs_dir/<sweep_id>/sweep.json` (and `sweep.png` unless `plot` is False). Bad input is
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
    fits = {arm[0]: [fit_arm(arm, mode, b, questions, pilots) for b in budgets] for arm in arms}
    lines: list[SweepLine] = []
    baseline: Baseline | None = None
    chosen_scorer = ""
    for name, source, config in arms:
        fitted = fits[name]
        pools = [pooled_lanes(f.config.loop_class(), f.config.loop_params) for f in fitted]
        pooled = None not in pools
        points: dict[int, SweepPoint] = {}
        rows: list[QuestionResult] = []
        for i, budget in enumerate(budgets):
            if pooled and i < len(budgets) - 1:
                continue  # read from the largest budget's lanes below
            eval_id = f"{sweep_id}-{name}-{_label(budget)}"
            summary = await run_eval(
                fitted[i].config,
                items,
                eval_id=eval_id,
                runs_dir=runs_dir,
                concurrency=concurrency,
                scorer=scorer,
                dataset=dataset,
                on_start=functools.partial(on_start, eval_id) if on_start else None,
                on_result=functools.partial(on_result, eval_id) if on_result else None,
                stop_reason=stop_reason,
            )
            chosen_scorer = summary.scorer
            rows = _rows(fitted[i].config, runs_dir, eval_id, items)
            mean, least, most = spread(rows, mode)
            points[i] = SweepPoint(
                budget=budget,
                point_id=eval_id,
                eval_id=eval_id,
                source="eval",
                fitted=fitted[i].keys,
                lanes=pools[i],
                n=summary.n,
                accuracy=summary.accuracy,
                interval=summary.interval,
                paid_mean=mean,
                paid_min=least,
                paid_max=most,
                flag=_flag(mean, budget),
            )
        top = f"{sweep_id}-{name}-{_label(budgets[-1])}"
        pool = read_pool(runs_dir, top) if pooled else None
        if pool is not None:
            for i, budget in enumerate(budgets[:-1]):
                points[i] = _from_pool(
                    budget,
                    f"{sweep_id}-{name}-{_label(budget)}",
                    top,
                    fitted[i],
                    pools[i] or 1,
                    pool,
                    rows,
                    mode,
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
        if baseline is None and _greedy(config):
            if pool is not None:  # one lane of the pool: the greedy answer, sampling nothing
                one = scaling_curve(pool, [1]).points[0]
                baseline = Baseline(
                    name=name, accuracy=one.pass_at_k, interval=_around(one.pass_at_k, one.pass_at_k_se)
                )
            else:
                summary = await run_eval(
                    config,
                    items,
                    eval_id=f"{sweep_id}-{name}-greedy",
                    runs_dir=runs_dir,
                    concurrency=concurrency,
                    scorer=scorer,
                    dataset=dataset,
                    stop_reason=stop_reason,
                )
                baseline = Baseline(name=name, accuracy=summary.accuracy, interval=summary.interval)
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


def _flag(paid_mean: float, budget: float) -> Literal["under", "over"] | None:
    if paid_mean < UNDER * budget:
        return "under"
    if paid_mean > OVER * budget:
        return "over"
    return None


def _around(mean: float, se: float) -> tuple[float, float]:
    return max(0.0, mean - Z95 * se), min(1.0, mean + Z95 * se)


def _greedy(config: LoopConfig) -> bool:
    """One lane at temperature 0, as configured: the greedy answer."""
    shape = cost_shape(config.loop_class(), config.loop_params, prompt_tokens=0, max_tokens=1)
    return shape is not None and shape.lanes == 1 and config.sampling.temperature == 0


def _scaled(row: QuestionResult, k: int, mode: BudgetMode) -> float:
    """What `row`'s question would have paid with k of its lanes: the prefix once, the
    per-lane lines (decode, cut-off, KV residency, the cached prefix of every lane but the
    first) scaled to k, the judge's as they were."""
    n = max(1, row.lanes)
    if n <= k:
        return paid(row, mode)
    share, rest = k / n, (k - 1) / (n - 1) if n > 1 else 1.0
    if mode == "tokens":
        tokens = row.tokens
        return (
            tokens.get("prefill", 0)
            + tokens.get("verifier", 0)
            + share * (tokens.get("decode", 0) + tokens.get("cut_off", 0))
        )
    usd = row.cost_by_line
    lanes = sum(usd.get(line, 0.0) for line in ("decode", "cut_off", "kv_residency"))
    return (
        usd.get("prefill", 0.0)
        + usd.get("verifier", 0.0)
        + rest * usd.get("cached_prefill", 0.0)
        + share * lanes
    )


def _from_pool(
    budget: float,
    point_id: str,
    eval_id: str,
    fitted: Fitted,
    k: int,
    pool: Pool,
    rows: Sequence[QuestionResult],
    mode: BudgetMode,
) -> SweepPoint:
    """A point read from a pool's lanes: majority@k over its subsets, and the pool's bill with
    its lanes scaled to k."""
    point = scaling_curve(pool, [k]).points[0]
    accuracy = point.majority_at_k if point.majority_at_k is not None else point.pass_at_k
    se = point.majority_at_k_se if point.majority_at_k_se is not None else point.pass_at_k_se
    spent = [_scaled(row, k, mode) for row in rows]
    mean = math.fsum(spent) / len(spent) if spent else 0.0
    return SweepPoint(
        budget=budget,
        point_id=point_id,
        eval_id=eval_id,
        source="pool",
        fitted=fitted.keys,
        lanes=k,
        n=len(pool.questions),
        accuracy=accuracy,
        interval=_around(accuracy, se),
        paid_mean=mean,
        paid_min=min(spent, default=0.0),
        paid_max=max(spent, default=0.0),
        flag=_flag(mean, budget),
    )
