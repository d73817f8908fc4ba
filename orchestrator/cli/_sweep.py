"""`orchestrator sweep`: accuracy against paid spend, every config fitted at every budget.

    orchestrator sweep A.toml B.toml ... --dataset PATH_OR_SPEC --budgets 200,400,800,1600
                       [--unit tokens|cost] [--no-pool] [--limit N] [--concurrency Q] [--sweep-id ID]
                       [--runs-dir DIR] [--question-field F] [--answer-field F] [--scorer S]
                       [--json]

Exit codes: 0 swept, 2 bad input (one line, nothing written), 130/143 interrupted (the same
command with `--sweep-id ID` continues it).
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable

from rich import box
from rich.console import Console
from rich.table import Table

from lanefold.cli._shared import SIGNAL_EXIT, Interrupted, error, interruptible, where
from lanefold.config import load_config
from lanefold.evaluate import DatasetSpec, Sweep, SweepPoint, parse_budgets, readable, run_sweep
from lanefold.execution import new_run_id
from lanefold.primitives import validate_run_id

__all__ = ("add_commands", "add_parser", "command", "print_sweep")


def add_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add `sweep` to the `orchestrator` command's subparsers."""
    p = sub.add_parser("sweep", help="accuracy against paid spend: every config fitted at every budget")
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="one or more loop config files")
    p.add_argument("--dataset", required=True, metavar="PATH_OR_SPEC", help="as `orchestrator eval` takes it")
    p.add_argument(
        "--budgets",
        required=True,
        metavar="B,B,...",
        help="what a question may pay at each point, comma-separated (e.g. 200,400,800,1600)",
    )
    p.add_argument("--unit", default="tokens", metavar="tokens|cost", help="tokens computed (default) or USD")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N questions")
    p.add_argument(
        "--concurrency", type=int, default=8, metavar="Q", help="questions in flight at once (default 8)"
    )
    p.add_argument(
        "--sweep-id",
        metavar="ID",
        help="name the sweep (default: a new sortable id); the same id continues it",
    )
    p.add_argument("--question-field", metavar="F", help="the question's field (default question)")
    p.add_argument("--answer-field", metavar="F", help="the gold answer's field (default answer)")
    p.add_argument(
        "--scorer", metavar="S", help="exact (default), numeric[:TOL], humaneval[:SECONDS] or module:function"
    )
    p.add_argument(
        "--no-pool",
        action="store_true",
        help="sample every point: a real run at each budget, none read from a larger budget's lanes",
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print sweep.json")


def command(args: argparse.Namespace) -> int:
    """Run (or continue) the sweep and print its table."""
    # The CLI's own helpers; imported here because `orchestrator.cli._main` imports this module.

    budgets = parse_budgets(args.budgets, args.unit)
    for path in args.configs:  # before the dataset, which may be fetched
        load_config(path)
    sweep_id = validate_run_id(args.sweep_id or new_run_id())
    dataset = DatasetSpec(args.dataset, args.question_field, args.answer_field, args.limit)
    items = dataset.load()

    async def go(reason: Callable[[], str]) -> Sweep:
        return await run_sweep(
            args.configs,
            items,
            sweep_id=sweep_id,
            budgets=budgets,
            unit=args.unit,
            runs_dir=args.runs_dir,
            concurrency=args.concurrency,
            scorer=args.scorer,
            dataset=dataset,
            pool=not args.no_pool,
            stop_reason=reason,
        )

    try:
        sweep = interruptible(go, lambda: sweep_id)
    except Interrupted as stop:
        again = [*_words(args), "--sweep-id", sweep_id, *where(args)]
        error("sweep", f"interrupted by {stop.signal_name}; continue with: {shlex.join(again)}")
        return SIGNAL_EXIT.get(stop.signal_name, 130)
    if args.json:
        print(json.dumps(sweep.model_dump(mode="json")))
    else:
        print_sweep(sweep)
    return 0


def _words(args: argparse.Namespace) -> list[str]:
    words = ["orchestrator", "sweep", *args.configs, "--dataset", args.dataset, "--budgets", args.budgets]
    for flag, value in (
        ("--unit", args.unit),
        ("--limit", args.limit),
        ("--question-field", args.question_field),
        ("--answer-field", args.answer_field),
        ("--scorer", args.scorer),
        ("--concurrency", args.concurrency),
    ):
        if value is not None:
            words += [flag, str(value)]
    return [*words, "--no-pool"] if args.no_pool else words


def print_sweep(sweep: Sweep, console: Console | None = None) -> None:
    """Config x budget: accuracy and what a question paid (`~` read from a pool, never
    tested; `!` paid under 80% or over 105% of the budget), and a real run's Holm-adjusted p
    against greedy; a budget the loop cannot use says so instead. Greedy, never fitted, is one
    line at what it paid; the test and its correction are stated under the table."""
    title = (
        f"sweep {sweep.sweep_id}: {sweep.questions} questions of {sweep.dataset}, scored "
        f"{sweep.scorer}; budgets in {sweep.unit} paid a question"
    )
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("config")
    table.add_column("loop")
    for budget in sweep.budgets:
        table.add_column(readable(budget, sweep.unit), justify="right")
    for line in sweep.configs:
        table.add_row(line.name, line.loop, *(_cell(point, sweep.unit) for point in line.points))
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: the whole table, never wrapped at 80
            console = Console(width=240)
    console.print(table)
    console.print(
        "accuracy (mean paid a question), what fit chose; ~ read from a larger budget's lanes "
        "(not a run: not tested); ! outside 80-105%; p: against greedy, Holm-adjusted"
    )
    base = sweep.baseline
    if base is not None:
        console.print(
            f"greedy ({base.name}), one lane at temperature 0, never fitted: {base.accuracy:.3f} "
            f"at {_spent(base.paid_mean, sweep.unit)} {sweep.unit} paid a question"
        )
    if sweep.tests:
        console.print(sweep.tests)


def _spent(value: float, unit: str) -> str:
    return f"${value:.3g}" if unit == "USD" else f"{value:,.0f}"


def _cell(point: SweepPoint, unit: str) -> str:
    if point.status == "below_least":
        return "cannot run at this budget"
    if point.status == "refused" or point.accuracy is None:
        return f"refused ({point.refused} runs)"
    mark = ("~" if point.source == "pool" else "") + ("!" if point.flag else "")
    parts = [f"{k}={v}" for k, v in point.fitted.items() if "quorum" not in k]
    test = point.against_greedy
    if test is not None and test.p_adjusted is not None:
        parts.append(f"p={test.p_adjusted:.2g}")
    return f"{point.accuracy:.3f} ({_spent(point.paid_mean, unit)}){mark} {', '.join(parts)}".strip()


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Callable[..., None]
) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `sweep` to the CLI's subcommands; its handler by name."""
    add_parser(sub, common)
    return {"sweep": command}
