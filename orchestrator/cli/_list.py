"""`orchestrator list`: the runs a store holds, newest first, filtered by status, loop, eval,
time, and for a gateway's runs the model asked for and the key (`--model vote --caller alice`).
Each row is read from a run's first and last events (`Store.list_runs`); `show` checks a run
whole."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

from lanefold.execution import open_store
from lanefold.primitives import RunStatus, RunSummary

__all__ = ("add_commands", "render")

Handler = Callable[[argparse.Namespace], int]
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since(text: str) -> datetime:
    """argparse type of `--since`: an ISO date or time (UTC where no zone is given), or a time
    ago (`30m`, `2h`, `7d`)."""
    ago = _AGO.fullmatch(text.strip())
    if ago is not None:
        return datetime.now(UTC) - timedelta(seconds=float(ago[1]) * _UNIT_S[ago[2]])
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time (2026-12-05, 2026-12-05T09:30, or ago: 30m, 2h, 7d)"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of 1 or more")
    return int(text)


def add_commands(sub: Any, common: Callable[..., None]) -> dict[str, Handler]:
    """Add `list` to the CLI's subcommands; its handler by name."""
    p = sub.add_parser("list", help="the runs in a store, newest first")
    p.add_argument(
        "--status",
        choices=get_args(RunStatus),
        help="only runs that ended so, or are running, or stopped (killed: resumable)",
    )
    p.add_argument("--eval", metavar="EVAL_ID", help="only the runs of this eval")
    p.add_argument("--loop", metavar="NAME", help="only runs of this loop (its coordinator)")
    p.add_argument("--model", metavar="NAME", help="only gateway runs a client asked this model for")
    p.add_argument("--caller", metavar="KEY", help="only gateway runs of this key (its name)")
    p.add_argument(
        "--since",
        type=since,
        metavar="WHEN",
        help="only runs started since (an ISO time, or ago: 30m, 2h, 7d)",
    )
    p.add_argument("--limit", type=_count, default=50, metavar="N", help="at most N rows (50)")
    common(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return {"list": _list}


def _list(args: argparse.Namespace) -> int:
    store = open_store(args.store, args.runs_dir)
    # model and caller only where given: a store written before they were filters still lists
    asked = {name: getattr(args, name) for name in ("model", "caller") if getattr(args, name) is not None}
    runs = store.list_runs(
        status=args.status, loop=args.loop, eval_id=args.eval, since=args.since, limit=args.limit, **asked
    )
    if args.json:
        for summary in runs:
            print(json.dumps(summary.to_json()))
    elif runs:
        print(render(runs))
    else:
        print(f"no runs in {store.describe}" + (" match" if _filtered(args) else ""))
    return 0


def _filtered(args: argparse.Namespace) -> bool:
    return any(
        getattr(args, key) is not None for key in ("status", "eval", "loop", "since", "model", "caller")
    )


def render(runs: list[RunSummary]) -> str:
    """Runs as an aligned table: id, loop, status, answer, lanes, tokens, cost, started; a
    gateway's run shows the model its client asked for and the key's name beside its loop
    (`vote (parallel_sample) by alice`)."""
    rows = [("run", "loop", "status", "answer", "lanes", "tokens", "cost", "started")]
    for s in runs:
        answer = "-" if s.answer is None else s.answer if len(s.answer) <= 24 else s.answer[:23] + "…"
        loop = s.loop if s.model is None else f"{s.model} ({s.loop})"
        rows.append(
            (
                s.run_id,
                loop if s.caller is None else f"{loop} by {s.caller}",
                s.status,
                answer,
                str(s.lanes),
                str(s.tokens),
                f"${s.cost_usd:.6f}",
                s.started.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {4, 5, 6}
    return "\n".join(
        "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    )
