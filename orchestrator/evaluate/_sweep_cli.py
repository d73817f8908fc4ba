"""`orchestrator sweep`: accuracy against paid spend, every config fitted at every budget.

    orchestrator sweep A.toml B.toml ... --dataset PATH_OR_SPEC --budgets 200,400,800,1600
                       [--unit tokens|cost] [--limit N] [--concurrency Q] [--sweep-id ID]
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

from lanefold._config import load_config
from lanefold._store import new_run_id
from lanefold.evaluate._compare_plot import readable
from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._sweep import Sweep, parse_budgets, run_sweep
from lanefold.primitives import validate_run_id

__all__ = ("add_parser", "command", "print_sweep")


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
    common(p)
    p.add_argument("--json", action="store_true", help="print sweep.json")


def command(args: argparse.Namespace) -> int:
    """Run (or continue) the sweep and print its table."""
    # The CLI's own helpers; imported here because `orchestrator._cli` imports this module.
    from lanefold._cli import _SIGNAL_EXIT, _error, _Interrupted, _interruptible, where

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
            stop_reason=reason,
        )

    try:
        sweep = _interruptible(go, lambda: sweep_id)
    except _Interrupted as stop:
        again = [*_words(args), "--sweep-id", sweep_id, *where(args)]
        _error("sweep", f"interrupted by {stop.signal_name}; continue with: {shlex.join(again)}")
        return _SIGNAL_EXIT.get(stop.signal_name, 130)
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
    return words


def print_sweep(sweep: Sweep, console: Console | None = None) -> None:
    """Config x budget: accuracy and what a question paid (`~` read from a pool; `!` paid
    under 80% or over 105% of the budget)."""
    title = (
        f"sweep {sweep.sweep_id}: {sweep.questions} questions of {sweep.dataset}, scored "
        f"{sweep.scorer}; budgets in {sweep.unit} paid a question"
    )
    if sweep.baseline is not None:
        title += f"; greedy ({sweep.baseline.name}) {sweep.baseline.accuracy:.3f}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("config")
    table.add_column("loop")
    for budget in sweep.budgets:
        table.add_column(readable(budget, sweep.unit), justify="right")
    for line in sweep.configs:
        cells = []
        for point in line.points:
            spent = f"${point.paid_mean:.3g}" if sweep.unit == "USD" else f"{point.paid_mean:,.0f}"
            mark = ("~" if point.source == "pool" else "") + ("!" if point.flag else "")
            cells.append(f"{point.accuracy:.3f} ({spent}){mark}")
        table.add_row(line.name, line.loop, *cells)
    if console is None:
        console = Console()
        if not console.is_terminal:  # a pipe or a file: the whole table, never wrapped at 80
            console = Console(width=240)
    console.print(table)
    console.print("accuracy (mean paid a question); ~ read from a larger budget's lanes; ! outside 80-105%")
