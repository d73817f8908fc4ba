"""Comparing loop configs on one dataset: paired accuracy, spend, and equal budgets.

    comparison = await run_compare(["greedy.toml", "vote8.toml"], items, compare_id="cmp",
                                   equal_budget="tokens")

Each config runs as its own eval (`<compare_id>-<name>`, resumable) on the same questions,
one config after another; the comparison reads the evals back, pairs them by question
(McNemar against the best) and writes `runs/<compare_id>/compare.json` and `compare.png`.
With an equal budget every config gets one per-question limit, written into its config before
it runs (`_equal_budget`), so a loop that spends less cannot look better by spending more.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from lanefold.config import LoopConfig, config_hash, load_config, preflight
from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._equal_budget import (
    BUDGET_MODES,
    BudgetMode,
    apply_limit,
    equal_limit,
    fitted_keys,
)
from lanefold.evaluate._eval import questions_hash, read_manifest, run_eval
from lanefold.evaluate._eval_records import (
    RUN_IDS,
    QuestionResult,
    as_json,
    check_eval_id,
    read_results,
)
from lanefold.evaluate._item import Item
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.execution import open_store
from lanefold.primitives import ConfigError, LogWriteError, plugin_folders, validate_run_id

__all__ = (
    "Compared",
    "Comparison",
    "EqualBudget",
    "McNemar",
    "arm_names",
    "mcnemar",
    "mcnemar_p",
    "run_compare",
)

_log = logging.getLogger("lanefold.compare")

EXACT_BELOW = 25  # discordant pairs under which McNemar's p-value is the exact binomial one
ConfigLike = LoopConfig | str | Path
OnStart = Callable[[str, int, Sequence[QuestionResult]], None]
OnResult = Callable[[str, QuestionResult], None]


# -- the paired test --------------------------------------------------------------------------


class McNemar(BaseModel):
    """A paired test of two configs on the same questions.

    `only_first`: questions the first got right and the second wrong; `only_second` the
    reverse; `p_value` two-sided, by `method` ("exact": the binomial on the discordant pairs,
    "chi2": chi-square with continuity correction), None where nothing was paired.
    """

    model_config = ConfigDict(frozen=True)

    paired: int
    only_first: int
    only_second: int
    p_value: float | None
    method: Literal["exact", "chi2", "none"]


def mcnemar(first: Mapping[int, bool], second: Mapping[int, bool]) -> McNemar:
    """McNemar's test over the questions both have (keys: question index)."""
    common = set(first) & set(second)
    b = sum(1 for i in common if first[i] and not second[i])
    c = sum(1 for i in common if second[i] and not first[i])
    if not common:
        return McNemar(paired=0, only_first=0, only_second=0, p_value=None, method="none")
    p, method = mcnemar_p(b, c)
    return McNemar(paired=len(common), only_first=b, only_second=c, p_value=p, method=method)


def mcnemar_p(b: int, c: int) -> tuple[float, Literal["exact", "chi2"]]:
    """Two-sided p-value of b against c discordant pairs: exact (binomial, p = 1/2) under
    EXACT_BELOW pairs, else chi-square with continuity correction."""
    n = b + c
    if n < EXACT_BELOW:
        tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
        return min(1.0, 2 * tail / 2**n), "exact"
    statistic = max(0, abs(b - c) - 1) ** 2 / n
    return math.erfc(math.sqrt(statistic / 2)), "chi2"  # chi-square(1)'s upper tail


# -- compare.json -----------------------------------------------------------------------------


class EqualBudget(BaseModel):
    """How the configs were put on one budget: the unit, the per-question limit, where it
    came from, and each config's worst case in that unit (None: not known)."""

    model_config = ConfigDict(frozen=True)

    mode: BudgetMode
    limit: float
    source: Literal["largest need", "--budget"]
    needs: dict[str, float | None]


class Compared(BaseModel):
    """One config's line: its eval, accuracy and 95% Wilson interval, spend per question
    (tokens by bill line), the eval's wall time, the `[budget]` it ran with (and, under an
    equal lane budget, the loop keys capped) and McNemar's test against the best."""

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
    budget: dict[str, Any]
    lane_cap: dict[str, Any] = {}  # the loop keys its `fit` set to spend the equal budget
    against_best: McNemar | None  # None: this is the best


class Comparison(BaseModel):
    """`compare.json`: every config on the same questions, best first: by accuracy, then by
    lower mean cost, then fewer tokens computed, then the order given."""

    model_config = ConfigDict(frozen=True)

    compare_id: str
    dataset: str
    scorer: str
    questions: int
    best: str
    equal_budget: EqualBudget | None
    configs: list[Compared]
    plot: str | None


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
    `equal_budget` ("tokens", "cost" or "lanes") gives every config one per-question limit:
    `budget`, else the largest any config needs. Everything is checked before the first eval
    starts; the same call again resumes each eval and runs nothing already recorded.
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
    settled: EqualBudget | None = None
    caps: list[dict[str, Any]] = [{} for _ in arms]
    if equal_budget is not None:
        if equal_budget not in BUDGET_MODES:
            raise ConfigError(f"--equal-budget: unknown {equal_budget!r}: tokens, cost or lanes")
        mode: BudgetMode = equal_budget  # narrowed by the check above
        questions = [item.question for item in items]
        limit, needs = equal_limit([(source, c) for _, source, c in arms], mode, questions, budget)
        # Each loop's own fit says how it spends the limit (the keys it sets are recorded).
        caps = [fitted_keys(c, mode, limit, source, questions) for _, source, c in arms]
        arms = [(name, source, apply_limit(c, mode, limit, source, questions)) for name, source, c in arms]
        settled = EqualBudget(
            mode=mode,
            limit=limit,
            source="largest need" if budget is None else "--budget",
            needs={name: value for (name, _, _), value in zip(arms, needs, strict=True)},
        )
    folder = Path(runs_dir) / compare_id
    for marker, what in (("events.jsonl", "a run's"), ("eval.json", "an eval's")):
        if (folder / marker).exists():
            raise ConfigError(f"{folder}: is {what} folder, not a comparison's: choose another --compare-id")
    last = max((item.index for item in items), default=0)
    for name, _, config in arms:  # a changed config or limit: refused before anything runs
        eval_id = validate_run_id(f"{compare_id}-{name}")
        validate_run_id(RUN_IDS.format(eval_id=eval_id, index=last))
        store = open_store(config.store.url, runs_dir, config.store.password_env)
        if not store.eval_record(eval_id).exists():
            check_eval_id(eval_id)
            continue
        recorded = read_manifest(store, eval_id)
        if recorded.config_hash != config_hash(config):
            raise ConfigError(
                f"compare {compare_id}: {name} was run with another config or "
                f"budget; choose a new --compare-id"
            )
        if recorded.questions_hash != questions_hash(items):
            raise ConfigError(
                f"compare {compare_id}: {name} was run on other questions "
                f"(--dataset, --limit); choose a new --compare-id"
            )

    lines: list[Compared] = []
    marks: list[dict[int, bool]] = []
    chosen_scorer = ""
    for (name, source, config), cap in zip(arms, caps, strict=True):
        eval_id = f"{compare_id}-{name}"
        summary = await run_eval(
            config,
            items,
            eval_id=eval_id,
            runs_dir=runs_dir,
            concurrency=concurrency,
            scorer=scorer,
            dataset=dataset,
            on_start=functools.partial(on_start, name) if on_start else None,
            on_result=functools.partial(on_result, name) if on_result else None,
            stop_reason=stop_reason,
        )
        chosen_scorer = summary.scorer
        wanted = {item.index for item in items}
        store = open_store(config.store.url, runs_dir, config.store.password_env)
        rows = read_results(store.eval_record(eval_id))  # where run_eval recorded it
        marks.append({i: row.correct for i, row in rows.items() if i in wanted})
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
                budget=config.budget.model_dump(mode="json"),
                lane_cap=cap,
                against_best=None,
            )
        )

    order = sorted(
        range(len(lines)), key=lambda i: (-lines[i].accuracy, lines[i].mean_cost, computed(lines[i]), i)
    )
    best = order[0]
    lines = [
        line if i == best else line.model_copy(update={"against_best": mcnemar(marks[best], marks[i])})
        for i, line in enumerate(lines)
    ]
    folder.mkdir(parents=True, exist_ok=True)
    comparison = Comparison(
        compare_id=compare_id,
        dataset=dataset.spec if dataset else "<items>",
        scorer=chosen_scorer,
        questions=len(items),
        best=lines[best].name,
        equal_budget=settled,
        configs=[lines[i] for i in order],
        plot=None,
    )
    if plot:
        comparison = comparison.model_copy(update={"plot": draw(comparison, folder / "compare.png")})
    _replace(folder / "compare.json", as_json(comparison))
    return comparison


def computed(line: Compared) -> float:
    """Mean tokens computed per question (cached prefill is not computed again)."""
    return math.fsum(value for name, value in line.mean_tokens.items() if name != "cached_prefill")


def draw(comparison: Comparison, path: Path) -> str | None:
    """`compare.png`: accuracy against mean cost per question, 95% interval bars, one point
    per config (mean tokens on the x axis where nothing is priced). None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: no display is asked for, on a server or in CI
        from matplotlib import pyplot
    except ImportError:
        _log.warning("compare.no_matplotlib: install matplotlib to draw %s", path)
        return None
    lines = comparison.configs
    priced = any(line.mean_cost > 0 for line in lines)
    xs = [line.mean_cost if priced else computed(line) for line in lines]
    figure, axes = pyplot.subplots(figsize=(6.4, 4.4))
    try:
        for x, line in zip(xs, lines, strict=True):
            low, high = line.interval
            axes.errorbar(
                [x],
                [line.accuracy],
                yerr=[[line.accuracy - low], [high - line.accuracy]],
                fmt="o",
                capsize=4,
                label=f"{line.name} ({line.loop})",
            )
            axes.annotate(
                line.name, (x, line.accuracy), textcoords="offset points", xytext=(6, 6), fontsize=8
            )
        axes.set_xlabel(
            "mean cost per question (USD)" if priced else "mean tokens computed per question (nothing priced)"
        )
        axes.set_ylabel("accuracy (95% Wilson interval)")
        axes.set_ylim(0, 1.02)
        budget = comparison.equal_budget
        axes.set_title(
            f"compare {comparison.compare_id}: {comparison.questions} questions"
            + (f", equal {budget.mode} ({budget.limit:g})" if budget else "")
        )
        axes.legend(fontsize=8, loc="lower right")
        axes.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        pyplot.close(figure)
    return str(path)


def _replace(path: Path, data: bytes) -> None:
    """The comparison's own file, replaced whole (written beside, then renamed)."""
    draft = path.with_name(f".{path.name}.new")
    try:
        draft.write_bytes(data)
        os.replace(draft, path)
    except OSError as exc:
        raise LogWriteError(f"{path}: cannot write: {exc.strerror or exc}") from None
    finally:
        draft.unlink(missing_ok=True)
