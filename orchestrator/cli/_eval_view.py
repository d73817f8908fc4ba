"""`orchestrator tail EVAL_ID` and `orchestrator show EVAL_ID`: an eval read as a run is.

`tail` prints one line per finished question (with `--follow`, as they land, until every
question has its row or no process has run the eval for `--wait` seconds); `show` prints the
eval's summary: its own once the eval has ended, else the summary of the rows so far. Both
read the eval's record from the store it is in (`--store`, else files under `--runs-dir`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from lanefold.cli._eval import print_summary
from lanefold.evaluate import (
    EvalSummary,
    QuestionResult,
    read_manifest,
    read_results,
    read_summary,
    rereductions,
    summarize,
)
from lanefold.primitives import Store

__all__ = ("describe_row", "show_eval", "tail_eval")

_POLL_S = 0.2


def describe_row(row: QuestionResult) -> str:
    """One finished question as `tail` prints it."""
    verdict = "right" if row.correct else "wrong"
    tokens = sum(row.tokens.values())
    line = (
        f"#{row.index} {verdict} {row.status} answer={row.answer!r} gold={row.gold!r} "
        f"lanes={row.lanes} tokens={tokens} cost=${row.cost:.6f} run={row.run_id}"
    )
    return f"{line} error={row.error!r}" if row.error else line


def tail_eval(args: argparse.Namespace, out: Callable[[str], None], store: Store) -> int:
    """Print the eval's finished questions, and with `--follow` the ones still to come."""
    eval_id = args.run_id
    record = store.eval_record(eval_id)
    shown = 0
    idle_since = time.monotonic()
    while True:
        rows = list(read_results(record).values())  # in the order they landed
        for row in rows[shown:]:
            out(row.model_dump_json() if args.json else describe_row(row))
        shown = len(rows)
        if not args.follow or shown >= read_manifest(store, eval_id).questions:
            return 0
        if record.running():
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > args.wait:
            return 0  # nothing runs the eval: what is recorded has been printed
        time.sleep(_POLL_S)


def show_eval(args: argparse.Namespace, out: Callable[[str], None], store: Store) -> int:
    """Print the eval's summary: its own once it has ended, else the rows' so far."""
    eval_id = args.run_id
    record = store.eval_record(eval_id)
    manifest = read_manifest(store, eval_id)
    rows = read_results(record)
    summary: EvalSummary | None = read_summary(record)
    if summary is None or summary.n != len(rows):  # running, or cut off: what is there so far
        loop = manifest.config.get("loop")
        summary = summarize(
            [rows[i] for i in sorted(rows)],
            eval_id=eval_id,
            config=manifest.config_path or "<config>",
            loop=str(loop.get("coordinator") if isinstance(loop, dict) else loop),
            dataset=manifest.dataset,
            scorer=manifest.scorer,
            wall_s=summary.wall_s if summary is not None else 0.0,
            results=record.results_location,
        )
    running = record.running()
    again: list[dict[str, Any]] = [
        {
            "eval_id": m.eval_id,
            "asked": m.rescore_of.describe() if m.rescore_of else "",
            "reducer": m.rescore_of.reducer if m.rescore_of else None,
            "verifier": m.rescore_of.verifier if m.rescore_of else None,
            "verifier_command": m.rescore_of.verifier_command if m.rescore_of else None,
            "n": s.n if s else None,
            "accuracy": s.accuracy if s else None,
            "interval": list(s.interval) if s else None,
        }
        for m, s in rereductions(store, eval_id)
    ]
    if args.json:
        out(
            json.dumps(
                {
                    **summary.model_dump(mode="json"),
                    "questions": manifest.questions,
                    "running": running,
                    "rereductions": again,
                }
            )
        )
        return 0
    print_summary(summary)
    if summary.n < manifest.questions:
        out(f"{summary.n} of {manifest.questions} questions finished{' (running)' if running else ''}")
    if manifest.rescore_of is not None:
        out(f"a re-reduction of eval {manifest.rescore_of.eval_id}: {manifest.rescore_of.describe()}")
    for line in again:
        if line["accuracy"] is None:
            out(f"re-reduction {line['eval_id']} ({line['asked']}): unfinished")
            continue
        low, high = line["interval"]
        out(
            f"re-reduction {line['eval_id']} ({line['asked']}): accuracy {line['accuracy']:.3f} "
            f"(95% CI {low:.3f}-{high:.3f}), {line['n']} questions"
        )
    return 0
