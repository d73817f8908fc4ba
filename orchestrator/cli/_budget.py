"""`orchestrator budget set|show NAME`: a named budget in the store (`[budget] shared`, a gateway
key's `key:<name>`), on PostgreSQL (`--store URL`) or beside the runs (`--runs-dir DIR`).

`set` creates the budget or changes its limits (a limit not given keeps its value; `none`
lifts it); `show` prints limit, spent and held for tokens, cost and requests, after charging
the holds of dead workers (as the next reservation would), and the requests it refused.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

from lanefold.execution import budget_store, open_store
from lanefold.primitives import BudgetView, ConfigError

__all__ = ("add_commands", "limit_type", "render")

Handler = Callable[[argparse.Namespace], int]


def limit_type(kind: type[int] | type[float]) -> Callable[[str], int | float | None]:
    """An argparse type: a limit of `kind` at least 0, or `none` (None: no limit)."""

    def parse(text: str) -> int | float | None:
        if text.strip().lower() == "none":
            return None
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number (or 'none')") from None
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"{text!r}: must be a finite number >= 0")
        return value

    return parse


def add_commands(sub: Any, common: Callable[..., None] | None = None) -> dict[str, Handler]:
    """Add `budget` (with `set` and `show`) to the CLI's subcommands; its handler by name."""
    p = sub.add_parser("budget", help="a named budget in the store ([budget] shared, a gateway key's)")
    verbs = p.add_subparsers(dest="verb", required=True)
    for verb, text in (
        ("set", "create a shared budget or change its limits"),
        ("show", "print a shared budget's limits, spent and held"),
    ):
        v = verbs.add_parser(verb, help=text)
        v.add_argument("name")
        v.add_argument(
            "--store",
            metavar="URL",
            help="the PostgreSQL database the runs record to (postgresql://...; "
            "default: the files store under --runs-dir)",
        )
        v.add_argument("--runs-dir", default="runs", help="where run logs live (default ./runs)")
        if verb == "set":
            v.add_argument("--max-tokens", type=limit_type(int), default=_UNSET, metavar="N")
            v.add_argument("--max-cost-usd", type=limit_type(float), default=_UNSET, metavar="USD")
            v.add_argument("--max-requests", type=limit_type(int), default=_UNSET, metavar="N")
        v.add_argument("--json", action="store_true", help="print the budget as JSON")
        v.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    return {"budget": _budget}


_UNSET: Any = object()


def _budget(args: argparse.Namespace) -> int:
    opened = open_store(args.store, args.runs_dir)
    store = budget_store(opened, "--store")
    if args.verb == "set":
        limits = {
            key: getattr(args, key)
            for key in ("max_tokens", "max_cost_usd", "max_requests")
            if getattr(args, key) is not _UNSET
        }
        view = store.set_budget(args.name, **limits)
    else:
        found = store.read_budget(args.name)
        if found is None:
            raise ConfigError(
                f"budget {args.name!r}: no such budget in {opened.describe} "
                f"(create it with: orchestrator budget set {args.name} --max-tokens N)"
            )
        view = found
    print(json.dumps(view.to_json()) if args.json else render(view))
    return 0


def render(view: BudgetView) -> str:
    """The budget as a small table: limit, spent, held (and left) per measure."""

    def cell(value: float | None, money: bool) -> str:
        if value is None:
            return "unlimited"
        return f"${value:.6f}" if money else f"{int(value)}"

    rows = [
        ("tokens", view.max_tokens, view.spent_tokens, view.held_tokens, False),
        ("cost", view.max_cost_usd, view.spent_cost_usd, view.held_cost_usd, True),
        ("requests", view.max_requests, view.spent_requests, view.held_requests, False),
    ]
    table = [("", "limit", "spent", "held", "left")]
    for label, limit, spent, held, money in rows:
        left = None if limit is None else limit - spent - held
        table.append((label, cell(limit, money), cell(spent, money), cell(held, money), cell(left, money)))
    widths = [max(len(row[i]) for row in table) for i in range(5)]
    lines = [f"budget {view.name}: {view.holders} run(s) holding part of it now"]
    lines += [
        "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)).rstrip()
        for row in table
    ]
    if view.charged_tokens or view.charged_requests or view.charged_cost_usd:
        lines.append(
            f"of spent, charged whole for dead workers' holds: {view.charged_tokens} "
            f"tokens, ${view.charged_cost_usd:.6f}, {view.charged_requests} requests"
        )
    if view.refusals:
        lines.append(f"refused: {view.refusals} request(s) it could not fund (never started)")
    return "\n".join(lines)
