"""What the eval pages are drawn from: one eval's summary and questions (all, or those it got
right, or wrong), and every eval as a point against its spend with the frontier marked."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lanefold.evaluate import read_manifest, read_results, read_summary
from lanefold.primitives import EvalRecord, Store
from lanefold.view._charts import Point, curve, frontier

__all__ = ("SCORES", "eval_context", "eval_points")

SCORES = ("right", "wrong")  # what `?score=` may ask for (nothing: every question)


def eval_context(record: EvalRecord, eval_id: str, score: str) -> dict[str, Any]:
    """What eval.html is drawn from; a LanefoldError where the record cannot be read. `score`
    ("right", "wrong" or "") picks the questions listed; the counts and the curve are the whole
    eval's."""
    summary = read_summary(record)
    data = [
        {
            "id": r.index,
            "correct": r.correct,
            "agreement": _agreement(r.answer, r.lane_answers),
            "cost_usd": r.cost,
            "run_id": r.run_id,
        }
        for _, r in sorted(read_results(record).items())
    ]
    shown = summary.model_dump(mode="json") if summary is not None else None
    return {
        "title": f"eval {eval_id}",
        "live": None,
        "summary": shown,
        "interval": ((shown or {}).get("interval") or [None, None])[:2],
        "scalars": [(k, v) for k, v in (shown or {}).items() if not isinstance(v, dict | list)],
        "rows": [r for r in data if not score or bool(r["correct"]) == (score == "right")],
        "counts": {
            "right": sum(bool(r["correct"]) for r in data),
            "wrong": sum(not r["correct"] for r in data),
        },
        "score": score,
        "eval_id": eval_id,
        "curve": curve([bool(r["correct"]) for r in data]),
    }


def eval_points(store: Store, prefix: str) -> list[Point]:
    """The evals whose id starts with `prefix`, each with a summary, as points; those on the
    frontier marked."""
    points = []
    for eval_id in store.list_evals():
        if not eval_id.startswith(prefix):
            continue
        summary = read_summary(store.eval_record(eval_id))
        if summary is not None:
            low, high = summary.interval
            fitted = read_manifest(store, eval_id).fitted_to  # the equal budget it had
            over = fitted is not None and fitted.over(summary)
            points.append(Point(eval_id, summary.accuracy, low, high, summary.mean_cost, over))
    best = frontier(points)
    return [replace(p, frontier=p.eval_id in best) for p in points]


def _agreement(answer: str | None, lanes: list[str | None]) -> str:
    return f"{sum(a == answer for a in lanes) / len(lanes):.2f}" if lanes and answer is not None else ""
