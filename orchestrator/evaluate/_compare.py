"""Comparing loop configs on one dataset: paired accuracy, spend, and equal budgets.

    comparison = await run_compare(["greedy.toml", "vote8.toml"], items, compare_id="cmp",
                                   equal_budget="tokens")

Each config runs as its own eval (`<compare_id>-<name>`, resumable) on the same questions,
one config after another; the comparison reads the evals back, pairs them by question
(McNemar's exact test against the best, Holm-adjusted across the table's tests) and writes
`runs/<compare_id>/compare.json` and `compare.png`. With an equal budget every config is
fitted by its loop's own `fit` to one budget of what a question pays, priced from a pilot
(`_fitting`), so a loop cannot look better by spending more: each line says what it actually
paid and what the fit chose, and a config that paid over 105% of the budget is never the best
and never on the Pareto frontier of paid spend and accuracy.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from lanefold.config import LoopConfig, config_hash, load_config, preflight
from lanefold.evaluate._compare_plot import draw
from lanefold.evaluate._compare_records import Compared, Comparison
from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._eval import questions_hash, read_manifest, run_eval
from lanefold.evaluate._eval_records import (
    OVER_BUDGET,
    RUN_IDS,
    FittedBudget,
    QuestionResult,
    as_json,
    check_eval_id,
    read_results,
)
from lanefold.evaluate._fit_record import FitRecord
from lanefold.evaluate._fitting import UNITS, EqualBudget, check_pricing, check_unit, settle_budget
from lanefold.evaluate._item import Item
from lanefold.evaluate._paired import CORRECTION, McNemar, holm, mcnemar, mcnemar_p
from lanefold.evaluate._pilot import PILOT_QUESTIONS, frontier, pilot_id, spread
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.execution import open_store
from lanefold.primitives import ConfigError, LogWriteError, validate_run_id
from lanefold.primitives.internal import plugin_folders

__all__ = (
    "Compared",
    "Comparison",
    "EqualBudget",
    "McNemar",
    "arm_names",
    "mcnemar",
    "mcnemar_p",
    "ranked",
    "run_compare",
)

ConfigLike = LoopConfig | str | Path
OnStart = Callable[[str, int, Sequence[QuestionResult]], None]
OnResult = Callable[[str, QuestionResult], None]


# -- the comparison ---------------------------------------------------------------------------


def arm_names(paths: Sequence[str | Path]) -> list[str]:
    """A plain, unique name per config: its file's stem (`_2`, `_3` after a repeat; not `-2`,
    which is how a question's run is named)."""
    names: list[str] = []
    for path in paths:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(path).stem).strip("-.") or "config"
        name, n = stem, 1
        while name in names:
            n += 1
            name = f"{stem}_{n}"
        names.append(name)
    return names


def _arms(
    configs: Sequence[str | Path] | Mapping[str, ConfigLike],
) -> list[tuple[str, str, LoopConfig]]:
    """(name, source, config) per config, each loaded and checked."""
    if isinstance(configs, Mapping):
        pairs = list(configs.items())
        for name, _ in pairs:
            validate_run_id(name)
    else:
        pairs = list(zip(arm_names(configs), configs, strict=True))
    if len(pairs) < 2:
        raise ConfigError(f"compare needs at least two configs, got {len(pairs)}")
    for name, _ in pairs:  # eval `<id>-a` keeps its runs in `<id>-a-<i>`: no config may be one
        for other, _ in pairs:
            if re.fullmatch(rf"{re.escape(other)}-\d+", name):
                raise ConfigError(
                    f"{name}: a config named like a question of {other!r} ({other}-<index>); rename one"
                )
    arms = []
    for name, config in pairs:
        if isinstance(config, LoopConfig):
            arms.append((name, f"<{name}>", config))
        else:
            arms.append((name, str(config), load_config(config)))
    return arms


async def run_compare(
    configs: Sequence[str | Path] | Mapping[str, ConfigLike],
    items: Sequence[Item],
    *,
    compare_id: str,
    runs_dir: str | Path = "runs",
    concurrency: int = 8,
    scorer: str | None = None,
    dataset: DatasetSpec | None = None,
    equal_budget: str | None = None,
    budget: float | None = None,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
    plot: bool = True,
    stop_reason: Callable[[], str] = lambda: "cancelled",
) -> Comparison:
    """Run every config on `items` as the eval `<compare_id>-<name>`; compare; write
    `runs_dir/<compare_id>/compare.json` (and `compare.png` unless `plot` is False).

    `configs` are config files (named by their stems) or a mapping of name to config.
    `equal_budget` ("tokens", "cost" or "lanes") gives every config one budget a question,
    what it may pay: `budget`, else the smallest mean a config paid on its pilot (the first
    questions, run as configured: `<compare_id>-<name>.pilot`); each loop's own `fit` spends
    it (`_fitting`). Bad input is refused before anything runs; the same call again resumes
    each eval (pilots too) and runs nothing already recorded.
    `on_start(name, ...)` and `on_result(name, row)` are the evals' progress hooks.
    """
    arms = _arms(configs)
    validate_run_id(compare_id)
    if concurrency < 1:
        raise ConfigError(f"--concurrency: must be at least 1, got {concurrency}")
    # The evals check these too, but each only as it starts: check every config now.
    with plugin_folders(*(config.folder for _, _, config in arms)):  # as the CLI finds them
        given = resolve_scorer(scorer, items).verifier(items) is not None
    for _, source, config in arms:
        preflight(config, source, verifier_given=given)
    if equal_budget is None and budget is not None:
        raise ConfigError("--budget: applies with --equal-budget tokens|cost|lanes")
    mode = check_unit(equal_budget) if equal_budget is not None else None
    check_pricing(arms, mode)
    folder = Path(runs_dir) / compare_id
    for marker, what in (("events.jsonl", "a run's"), ("eval.json", "an eval's")):
        if (folder / marker).exists():
            raise ConfigError(f"{folder}: is {what} folder, not a comparison's: choose another --compare-id")
    last = max((item.index for item in items), default=0)
    for name, _, config in arms:  # other questions, or a pilot of another config: refused now
        eval_id = validate_run_id(f"{compare_id}-{name}")
        validate_run_id(RUN_IDS.format(eval_id=pilot_id(compare_id, name), index=last))
        _check_recorded(compare_id, name, eval_id, None, items, runs_dir, config)
        if mode is not None:
            pilot = items[:PILOT_QUESTIONS]
            _check_recorded(
                compare_id, f"{name}'s pilot", pilot_id(compare_id, name), config, pilot, runs_dir
            )
    settled: EqualBudget | None = None
    keys: list[dict[str, Any]] = [{} for _ in arms]
    records: list[FitRecord | None] = [None for _ in arms]
    if mode is not None:
        settled, fits = await settle_budget(
            arms,
            items,
            mode,
            budget,
            prefix=compare_id,
            runs_dir=str(runs_dir),
            concurrency=concurrency,
            scorer=scorer,
            on_start=on_start,
            on_result=on_result,
            stop_reason=stop_reason,
        )
        arms = [(name, source, fit.config) for (name, source, _), fit in zip(arms, fits, strict=True)]
        keys = [fit.keys for fit in fits]
        records = [fit.record for fit in fits]
    for name, _, config in arms:  # a changed config or budget: refused before any eval runs
        _check_recorded(compare_id, name, f"{compare_id}-{name}", config, items, runs_dir)

    unit = mode or "tokens"
    lines: list[Compared] = []
    marks: list[dict[int, bool]] = []
    chosen_scorer = ""
    for (name, source, config), fitted, record in zip(arms, keys, records, strict=True):
        eval_id = f"{compare_id}-{name}"
        fitted_to = None
        if settled is not None and record is not None and not record.greedy:
            fitted_to = FittedBudget(unit=settled.mode, budget=settled.limit)
        summary = await run_eval(
            config,
            items,
            eval_id=eval_id,
            runs_dir=runs_dir,
            concurrency=concurrency,
            scorer=scorer,
            dataset=dataset,
            fitted_to=fitted_to,
            on_start=functools.partial(on_start, name) if on_start else None,
            on_result=functools.partial(on_result, name) if on_result else None,
            stop_reason=stop_reason,
        )
        chosen_scorer = summary.scorer
        wanted = {item.index for item in items}
        store = open_store(config.store.url, runs_dir, config.store.password_env)
        rows = read_results(store.eval_record(eval_id))  # where run_eval recorded it
        marks.append({i: row.correct for i, row in rows.items() if i in wanted})
        kept = [row for i, row in rows.items() if i in wanted]
        mean, least, most = spread(kept, unit)
        greedy = record is not None and record.greedy
        limit = settled.limit if settled is not None and not greedy else None
        lines.append(
            Compared(
                name=name,
                config=source,
                eval_id=eval_id,
                loop=config.loop.coordinator,
                n=summary.n,
                correct=summary.correct,
                accuracy=summary.accuracy,
                interval=summary.interval,
                abstentions=summary.abstentions,
                failed=summary.failed,
                mean_lanes=summary.mean_lanes,
                mean_tokens=summary.mean_tokens,
                mean_cost=summary.mean_cost,
                wall_s=summary.wall_s,
                limits=config.budget.model_dump(mode="json"),
                unit=UNITS[unit],
                budget=limit,
                paid_mean=mean,
                paid_min=least,
                paid_max=most,
                per_spend=summary.accuracy / mean * _PER[unit] if mean > 0 else None,
                flag=_flag(mean, limit),
                fitted=fitted,
                fit=record,
                capped=sum(row.capped for row in kept),
                refused=sum(row.capped and row.status == "failed" for row in kept),
                against_best=None,
            )
        )

    order = ranked(lines)
    reference = order[0]
    best = None if lines[reference].flag == "over" else lines[reference].name
    on_frontier = frontier([(line.paid_mean, line.accuracy) for line in lines if line.flag != "over"])
    within = [i for i, line in enumerate(lines) if line.flag != "over"]
    tests = {i: mcnemar(marks[reference], marks[i]) for i in range(len(lines)) if i != reference}
    adjusted = holm([test.p_value for test in tests.values()])
    m = sum(p is not None for p in adjusted)
    tests = {
        i: test.model_copy(update={"p_adjusted": p, "adjusted_over": m if p is not None else None})
        for (i, test), p in zip(tests.items(), adjusted, strict=True)
    }
    lines = [
        line.model_copy(
            update={
                "pareto": i in within and within.index(i) in on_frontier,
                "against_best": tests.get(i),
            }
        )
        for i, line in enumerate(lines)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    comparison = Comparison(
        compare_id=compare_id,
        dataset=dataset.spec if dataset else "<items>",
        scorer=chosen_scorer,
        questions=len(items),
        best=best,
        tests=(
            f"McNemar's exact test against {lines[reference].name}, Holm-adjusted across {m} "
            f"test{'s' * (m != 1)} ({CORRECTION})"
        ),
        equal_budget=settled,
        configs=[lines[i] for i in order],
        plot=None,
    )
    if plot:
        comparison = comparison.model_copy(update={"plot": draw(comparison, folder / "compare.png")})
    replace_file(folder / "compare.json", as_json(comparison))
    return comparison


def _check_recorded(
    compare_id: str,
    name: str,
    eval_id: str,
    config: LoopConfig | None,
    items: Sequence[Item],
    runs_dir: str | Path,
    where: LoopConfig | None = None,
) -> None:
    """An eval this comparison recorded before must have been run on these questions (and
    with `config`, where given); `where` is the config whose store holds it (`config`)."""
    home = where or config
    assert home is not None  # one of the two is always given
    store = open_store(home.store.url, runs_dir, home.store.password_env)
    if not store.eval_record(eval_id).exists():
        check_eval_id(eval_id)
        return
    recorded = read_manifest(store, eval_id)
    if config is not None and recorded.config_hash != config_hash(config):
        raise ConfigError(
            f"compare {compare_id}: {name} was run with another config or budget; choose a new --compare-id"
        )
    if recorded.questions_hash != questions_hash(items):
        raise ConfigError(
            f"compare {compare_id}: {name} was run on other questions (--dataset, --limit); "
            "choose a new --compare-id"
        )


def ranked(lines: Sequence[Compared]) -> list[int]:
    """The configs' order, best first: every one that paid within 105% of the budget before
    any that paid over it, then by accuracy, lower mean cost, fewer tokens computed, the order
    given."""
    return sorted(
        range(len(lines)),
        key=lambda i: (
            lines[i].flag == "over",
            -lines[i].accuracy,
            lines[i].mean_cost,
            computed(lines[i]),
            i,
        ),
    )


def computed(line: Compared) -> float:
    """Mean tokens computed per question (cached prefill is not computed again)."""
    return math.fsum(value for name, value in line.mean_tokens.items() if name != "cached_prefill")


def replace_file(path: Path, data: bytes) -> None:
    """The comparison's own file, replaced whole (written beside, then renamed)."""
    draft = path.with_name(f".{path.name}.new")
    try:
        draft.write_bytes(data)
        os.replace(draft, path)
    except OSError as exc:
        raise LogWriteError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        draft.unlink(missing_ok=True)


_PER = {"tokens": 1000.0, "cost": 1.0, "lanes": 1.0}  # accuracy per 1,000 tokens, per USD, per lane
UNDER, OVER = 0.80, OVER_BUDGET  # a config that paid outside these shares of the budget is flagged


def _flag(paid: float, budget: float | None) -> Literal["under", "over"] | None:
    if budget is None or budget <= 0:
        return None
    if paid < UNDER * budget:
        return "under"
    if paid > OVER * budget:
        return "over"
    return None
