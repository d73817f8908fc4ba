"""`orchestrator compare`: several loop configs on the same questions, one table.

    orchestrator compare A.toml B.toml ... --dataset PATH_OR_SPEC [--equal-budget tokens|cost|lanes]
                         [--budget N] [--limit N] [--concurrency Q] [--compare-id ID]
                         [--runs-dir DIR] [--question-field F] [--answer-field F] [--scorer S]
                         [--json]

Exit codes: 0 compared, 2 bad input (one line, nothing written), 130/143 interrupted (the
same command with `--compare-id ID` continues it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from types import TracebackType

from rich import box
from rich.console import Console
from rich.table import Table

from lanefold.cli._progress import EvalProgress
from lanefold.cli._shared import SIGNAL_EXIT, Interrupted, error, interruptible, where
from lanefold.config import load_config
from lanefold.evaluate import (
    BUDGET_MODES,
    TOKEN_LINES,
    Compared,
    Comparison,
    DatasetSpec,
    QuestionResult,
    readable,
    run_compare,
)
from lanefold.execution import new_run_id
from lanefold.primitives import ConfigError, validate_run_id

__all__ = ("add_commands", "add_parser", "command", "print_comparison")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add `compare` to the `orchestrator` command's subparsers."""
    p = sub.add_parser("compare", help="run several loop configs on the same questions and compare them")
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="two or more loop config files")
    p.add_argument(
        "--dataset",
        required=True,
        metavar="PATH_OR_SPEC",
        help="a .jsonl or .csv file, bigbench:<task path>, openai-evals:<name>, "
        "bfcl:<category> or humaneval (`orchestrator datasets` lists them)",
    )
    p.add_argument(
        "--equal-budget",
        metavar="tokens|cost|lanes",
        help="fit every config to the same paid budget a question (tokens computed, USD or lanes)",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="N",
        help="with --equal-budget: what a question may pay (default: the smallest mean a "
        "config paid on a pilot of its first 10 questions)",
    )
    p.add_argument("--limit", type=int, metavar="N", help="only the first N questions")
    p.add_argument(
        "--concurrency",
        type=int,
        default=8,
        metavar="Q",
        help="questions in flight at once, per config (default 8)",
    )
    p.add_argument(
        "--compare-id",
        metavar="ID",
        help="name the comparison (default: a new sortable id); the same id again continues it",
    )
    p.add_argument("--question-field", metavar="F", help="the question's field (default question)")
    p.add_argument("--answer-field", metavar="F", help="the gold answer's field (default answer)")
    p.add_argument(
        "--scorer", metavar="S", help="exact (default), numeric[:TOL], humaneval[:SECONDS] or module:function"
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print compare.json")


def command(args: argparse.Namespace) -> int:
    """Run (or continue) the comparison and print its table."""
    # The CLI's own helpers; imported here because `orchestrator.cli._main` imports this module.

    if len(args.configs) < 2:
        raise ConfigError(f"compare needs at least two configs, got {len(args.configs)}")
    if args.equal_budget is not None and args.equal_budget not in BUDGET_MODES:
        raise ConfigError(f"--equal-budget: unknown {args.equal_budget!r}: tokens, cost or lanes")
    if args.budget is not None and args.equal_budget is None:
        raise ConfigError("--budget: applies with --equal-budget tokens|cost|lanes")
    for path in args.configs:  # before the dataset, which may be fetched
        load_config(path)
    compare_id = validate_run_id(args.compare_id or new_run_id())
    dataset = DatasetSpec(args.dataset, args.question_field, args.answer_field, args.limit)
    items = dataset.load()
    bars = _Bars(compare_id) if not args.json and sys.stdout.isatty() else None

    async def go(reason: Callable[[], str]) -> Comparison:
        return await run_compare(
            args.configs,
            items,
            compare_id=compare_id,
            runs_dir=args.runs_dir,
            concurrency=args.concurrency,
            scorer=args.scorer,
            dataset=dataset,
            equal_budget=args.equal_budget,
            budget=args.budget,
            on_start=bars.start if bars else None,
            on_result=bars.add if bars else None,
            stop_reason=reason,
        )

    try:
        with bars or contextlib.nullcontext():
            comparison = interruptible(go, lambda: compare_id)
    except Interrupted as stop:
        error(
            "compare",
            f"interrupted by {stop.signal_name}; continue with: "
            f"{shlex.join(_again(args, compare_id, where(args)))}",
        )
        return SIGNAL_EXIT.get(stop.signal_name, 130)
    if args.json:
        print(json.dumps(comparison.model_dump(mode="json")))
    else:
        print_comparison(comparison)
    return 0


def _again(args: argparse.Namespace, compare_id: str, where: list[str]) -> list[str]:
    """This comparison's command with its id: what continues it after an interrupt."""
    words = ["orchestrator", "compare", *args.configs, "--dataset", args.dataset]
    for flag, value in (
        ("--limit", args.limit),
        ("--question-field", args.question_field),
        ("--answer-field", args.answer_field),
        ("--scorer", args.scorer),
        ("--equal-budget", args.equal_budget),
        ("--budget", args.budget),
        ("--concurrency", args.concurrency),
    ):
        if value is not None:
            words += [flag, str(value)]
    return [*words, "--compare-id", compare_id, *where]


class _Bars:
    """One eval progress bar per config, each opened as its eval starts."""

    def __init__(self, compare_id: str) -> None:
        self.compare_id = compare_id
        self.console = Console()
        self.bar: EvalProgress | None = None

    def __enter__(self) -> _Bars:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def start(self, name: str, total: int, done: Sequence[QuestionResult]) -> None:
        self._close()
        self.console.print(f"{name}: eval {self.compare_id}-{name}")
        self.bar = EvalProgress(self.console).__enter__()
        self.bar.start(total, done)

    def add(self, name: str, row: QuestionResult) -> None:
        if self.bar is not None:
            self.bar.add(row)


def print_comparison(comparison: Comparison, console: Console | None = None) -> None:
    """The comparison as one table, best first: accuracy and its 95% Wilson interval, what a
    question paid (mean and range, in the budget's unit) against the budget, accuracy per
    1,000 tokens (per dollar, per lane) paid, the Pareto frontier (`*`), the keys the fit set
    (`greedy` where it is never fitted), the questions cut at their per-question limit, tokens
    (by bill line) and cost per question, wall time, and McNemar's exact test against the
    best (p, Holm-adjusted p, and the questions only the best / only this one got right). A
    config that paid under 80% or over 105% of the budget is flagged; one over is never the
    best nor on the frontier. The line under the table states the test and its correction."""
    budget = comparison.equal_budget
    title = (
        f"compare {comparison.compare_id}: {comparison.questions} questions of "
        f"{comparison.dataset}, scored {comparison.scorer}"
    )
    unit = comparison.configs[0].unit if comparison.configs else "tokens"
    if budget is not None:
        title += f"; equal budget {readable(budget.limit, unit)} paid a question"
        if budget.source == "--budget":
            title += " (--budget)"
        elif budget.raised_for is not None:
            title += f" (the least {budget.raised_for} can pay: the smallest pilot mean is below it)"
        else:
            title += f" (the smallest pilot mean, {budget.pilot_questions} questions)"
    lines = [name for name in TOKEN_LINES if any(line.mean_tokens.get(name) for line in comparison.configs)]
    per = {"tokens": "acc/1k tok", "USD": "acc/$", "lanes": "acc/lane"}[unit]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("config")
    table.add_column("loop")
    table.add_column("fitted")
    table.add_column("accuracy", justify="right")
    table.add_column("95% CI")
    table.add_column(f"paid/q ({unit})", justify="right")
    table.add_column("range")
    table.add_column(per, justify="right")
    table.add_column("frontier")
    table.add_column("cut", justify="right")
    table.add_column("lanes", justify="right")
    for name in lines:
        table.add_column(f"{_SHORT.get(name, name)} tok", justify="right")
    table.add_column("cost/q", justify="right")
    table.add_column("wall", justify="right")
    table.add_column("vs best (McNemar)")
    for line in comparison.configs:
        low, high = line.interval
        flag = {"under": " under 80%", "over": " over 105%"}.get(line.flag or "", "")
        greedy = line.fit is not None and line.fit.greedy
        keys = " ".join(f"{key}={value}" for key, value in line.fitted.items() if "quorum" not in key)
        table.add_row(
            line.name,
            line.loop,
            "greedy, not fitted" if greedy else keys or "-",
            f"{line.accuracy:.3f}",
            f"{low:.3f}-{high:.3f}",
            _amount(line.paid_mean, unit) + flag,
            f"{_amount(line.paid_min, unit)}-{_amount(line.paid_max, unit)}",
            f"{line.per_spend:.3g}" if line.per_spend is not None else "-",
            "*" if line.pareto else "",
            str(line.capped) if line.capped else "",
            f"{line.mean_lanes:.2f}",
            *(f"{line.mean_tokens.get(name, 0.0):.0f}" for name in lines),
            f"${line.mean_cost:.6f}",
            f"{line.wall_s:.1f}s",
            _versus(line),
        )
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: the whole table, never wrapped at 80
            console = Console(width=240)
    console.print(table)
    if comparison.tests:
        console.print(
            comparison.tests + ("" if comparison.best else "; no config paid within 105% of the budget")
        )


def _amount(value: float, unit: str) -> str:
    return f"${value:.3g}" if unit == "USD" else f"{value:,.1f}".removesuffix(".0")


def _versus(line: Compared) -> str:
    test = line.against_best
    if test is None:
        return "best" if line.flag != "over" else "reference"
    if test.p_value is None:
        return "nothing paired"
    adjusted = f", Holm {test.p_adjusted:.3g}" if test.p_adjusted is not None else ""
    return f"p={test.p_value:.3g}{adjusted} ({test.only_first} vs {test.only_second})"


_SHORT = {"cached_prefill": "cached", "cut_off": "cut-off"}


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Callable[..., None]
) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `compare` to the CLI's subcommands; its handler by name."""
    add_parser(sub, common)
    return {"compare": command}
