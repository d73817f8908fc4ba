"""What the eval pages are drawn from: one eval's figures and questions (all, or those it got
right, or wrong), live while its results file grows; and every eval as a point against its
spend with the frontier marked, the pilots of compares and sweeps listed apart."""

from __future__ import annotations

import json
import shlex
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

import anyio

from lanefold.evaluate import is_pilot, read_manifest, read_results, read_summary, wilson_interval
from lanefold.primitives import ConfigError, LanefoldError, Store
from lanefold.view._charts import Point, curve, frontier
from lanefold.view._templates import eval_parts

__all__ = ("SCORES", "Figures", "eval_context", "eval_points", "watch_eval")

SCORES = ("right", "wrong")  # what `?score=` may ask for (nothing: every question)
_POLL_S = 0.5  # how often a live eval page's feed reads the results again
_QUIET = 30  # polls without a new question before a comment line keeps the connection open


@dataclass(frozen=True, slots=True)
class Figures:
    """An eval so far: questions landed of `total` (None: no manifest says), right among them,
    accuracy with its 95% Wilson interval (the summary's, once it has ended), ended or not."""

    landed: int
    total: int | None
    correct: int
    accuracy: float | None
    low: float | None
    high: float | None
    ended: bool


def eval_context(store: Store, eval_id: str, score: str, where: Sequence[str] = ()) -> dict[str, Any]:
    """What eval.html is drawn from; a LanefoldError where the record cannot be read. `score`
    ("right", "wrong" or "") picks the questions listed; the counts and the curve are the whole
    eval's, the curve in the order the questions landed. Live (`/live/evals/<id>`) until the
    eval's summary is written. `where`: the flags that find the store, for the command that
    continues the eval."""
    record = store.eval_record(eval_id)
    summary = read_summary(record)
    try:
        total: int | None = read_manifest(store, eval_id).questions
    except ConfigError:  # an eval folder without its manifest yet: no total to show
        total = None
    rows = [
        {
            "id": r.index,
            "correct": r.correct,
            "agreement": _agreement(r.answer, r.lane_answers),
            "cost_usd": r.cost,
            "run_id": r.run_id,
        }
        for r in read_results(record).values()  # in the order they landed
    ]
    right = sum(bool(r["correct"]) for r in rows)
    if summary is not None:
        low, high = summary.interval[:2]
        figures = Figures(len(rows), total, right, summary.accuracy, low, high, True)
    elif rows:
        low, high = wilson_interval(right, len(rows))
        figures = Figures(len(rows), total, right, right / len(rows), low, high, False)
    else:
        figures = Figures(0, total, 0, None, None, None, False)
    shown = summary.model_dump(mode="json") if summary is not None else None
    return {
        "title": f"eval {eval_id}",
        "live": None if summary is not None else f"/live/evals/{quote(eval_id)}?score={score}",
        "figures": figures,
        "scalars": [(k, v) for k, v in (shown or {}).items() if not isinstance(v, dict | list)],
        "rows": sorted(
            (r for r in rows if not score or bool(r["correct"]) == (score == "right")), key=lambda r: r["id"]
        ),
        "counts": {"right": right, "wrong": len(rows) - right},
        "score": score,
        "eval_id": eval_id,
        "curve": curve([bool(r["correct"]) for r in rows], total),
        "command": shlex.join(["orchestrator", "eval", "--resume", eval_id, *where]),
    }


async def watch_eval(store: Store, eval_id: str, score: str) -> AsyncIterator[bytes]:
    """The eval page's live parts again whenever a question lands, until its summary is
    written (then the last parts, and `end`); a record that cannot be read is told in one
    line (`refused`) and ends the feed."""
    seen, quiet = -1, 0
    while True:
        try:
            context = await anyio.to_thread.run_sync(lambda: eval_context(store, eval_id, score))
        except LanefoldError as exc:
            yield _sse("refused", {"line": f"orchestrator show: {exc}"})
            return
        figures: Figures = context["figures"]
        if figures.landed != seen or figures.ended:
            seen, quiet = figures.landed, 0
            yield _sse("swap", eval_parts(context))
        elif (quiet := quiet + 1) >= _QUIET:
            quiet = 0
            yield b": still here\n\n"
        if figures.ended:
            yield _sse("end", {})
            return
        await anyio.sleep(_POLL_S)


def eval_points(store: Store, prefix: str) -> tuple[list[Point], list[str]]:
    """The evals whose id starts with `prefix`, each with a summary, as points (those on the
    frontier marked); and apart, never points, the pilots compares and sweeps ran."""
    points, pilots = [], []
    for eval_id in store.list_evals():
        if not eval_id.startswith(prefix):
            continue
        if is_pilot(eval_id):
            pilots.append(eval_id)
            continue
        summary = read_summary(store.eval_record(eval_id))
        if summary is not None:
            low, high = summary.interval
            fitted = read_manifest(store, eval_id).fitted_to  # the equal budget it had
            over = fitted is not None and fitted.over(summary)
            points.append(Point(eval_id, summary.accuracy, low, high, summary.mean_cost, over))
    best = frontier(points)
    return [replace(p, frontier=p.eval_id in best) for p in points], pilots


def _sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def _agreement(answer: str | None, lanes: list[str | None]) -> str:
    return f"{sum(a == answer for a in lanes) / len(lanes):.2f}" if lanes and answer is not None else ""
