"""`orchestrator list`: the runs a store holds, newest first, found as the view's search finds
them (`RunSearch`: question and answer text, status, loop, eval, the model a gateway's client
asked for and its key, a start between `--since` and `--until`), so a filter means the same on
the command line and on the page. Each row is read from a run's first and last events
(`Store.list_runs`); `show` checks a run whole."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

from lanefold.execution import open_store
from lanefold.primitives import RunStatus, RunSummary
from lanefold.view import RunSearch

__all__ = ("add_commands", "render")

Handler = Callable[[argparse.Namespace], int]
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def when(text: str) -> datetime:
    """argparse type of `--since` and `--until`: an ISO date or time (UTC where no zone is
    given), or a time ago (`30m`, `2h`, `7d`); anything else is a usage error naming the flag."""
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
    p.add_argument("--question", metavar="TEXT", help="only runs whose question holds TEXT (any case)")
    p.add_argument("--answer", metavar="TEXT", help="only runs whose answer holds TEXT (any case)")
    p.add_argument(
        "--since",
        type=when,
        metavar="WHEN",
        help="only runs started at or after (an ISO time, or ago: 30m, 2h, 7d)",
    )
    p.add_argument(
        "--until",
        type=when,
        metavar="WHEN",
        help="only runs started at or before (an ISO time, or ago: 30m, 2h, 7d)",
    )
    p.add_argument("--limit", type=_count, default=50, metavar="N", help="at most N rows (50)")
    common(p)
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return {"list": _list}


def _list(args: argparse.Namespace) -> int:
    store = open_store(args.store, args.runs_dir)
    # each of the search's fields is the flag of its name: the view's search, not a copy of it
    search = RunSearch.model_validate({name: getattr(args, name) for name in RunSearch.model_fields})
    runs = search.runs(store, args.limit)
    if args.json:
        for summary in runs:
            print(json.dumps(summary.to_json()))
    elif runs:
        print(render(runs))
    else:
        print(f"no runs in {store.describe}" + (" match" if search.shown() else ""))
    return 0


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
