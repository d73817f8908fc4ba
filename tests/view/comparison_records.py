"""A compare's and a sweep's records built by hand, as `orchestrator compare` and `sweep` write
them: a token comparison whose cheapest, most accurate config paid over 105% of the budget (so
it would be on any frontier that did not exclude it), greedy as a compared config, pilots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lanefold.evaluate import Comparison, FitRecord, Sweep

BUDGET = 400.0


def _fit(unit: str, budget: float, keys: dict[str, Any], name: str, greedy: bool = False) -> dict[str, Any]:
    pilot = {
        "eval_id": f"cmp-{name}.pilot",
        "questions": 10,
        "mean_paid": 350.0,
        "prompt_tokens": 40,
        "lanes_per_request": 8,
        "within_request": True,
        "across_requests": None,
        "prefix_reuse": 0.0,
        "reuse_measured": False,
        "prefill_scale": 1.0,
        "prompt_scale": 1.0,
        "growth_scale": 1.0,
        "decode_per_lane": 40.0,
        "cut_off_per_lane": 0.0,
        "kv_usd_per_lane": 0.0,
        "judge_per_candidate": 0.0,
        "judge_usd_per_candidate": 0.0,
        "stops": [None],
    }
    return FitRecord(
        unit=unit, budget=budget, keys=keys, greedy=greedy, pilot=None if greedy else pilot
    ).model_dump(mode="json")


def compared(
    name: str,
    accuracy: float,
    paid: float,
    *,
    unit: str = "tokens",
    budget: float | None = BUDGET,
    fitted: dict[str, Any] | None = None,
    greedy: bool = False,
) -> dict[str, Any]:
    """One config's line of compare.json, its flag by the evaluate code's 80%/105% rule."""
    flag = None
    if budget is not None and not greedy:
        flag = "over" if paid > 1.05 * budget else "under" if paid < 0.8 * budget else None
    return {
        "name": name,
        "config": f"{name}.toml",
        "eval_id": f"cmp-{name}",
        "loop": "parallel_sample",
        "n": 20,
        "correct": round(20 * accuracy),
        "accuracy": accuracy,
        "interval": [max(0.0, accuracy - 0.2), min(1.0, accuracy + 0.2)],
        "abstentions": 0,
        "failed": 0,
        "mean_lanes": 1.0,
        "mean_tokens": {"prefill": 40.0, "decode": paid - 40.0},
        "mean_cost": 0.0001,
        "wall_s": 1.0,
        "limits": {},
        "unit": unit,
        "budget": None if greedy else budget,
        "paid_mean": paid,
        "paid_min": paid,
        "paid_max": paid,
        "per_spend": None,
        "flag": flag,
        "fitted": fitted or {},
        "fit": _fit(unit, budget or 0.0, fitted or {}, name, greedy) if budget is not None else None,
        "against_best": None,
    }


def comparison(configs: list[dict[str, Any]], compare_id: str = "cmp", mode: str = "tokens") -> Comparison:
    """compare.json of `configs` at the equal budget `BUDGET` (in `mode`)."""
    return Comparison.model_validate(
        {
            "compare_id": compare_id,
            "dataset": "q.jsonl",
            "scorer": "exact",
            "questions": 20,
            "best": configs[0]["name"],
            "equal_budget": {"mode": mode, "limit": BUDGET, "source": "--budget", "pilot_questions": 10},
            "configs": configs,
            "plot": None,
        }
    )


def token_comparison(compare_id: str = "cmp", over: str = "wide") -> Comparison:
    """greedy, vote (k=5), and `over` (k=23): the most accurate and cheapest, but over budget."""
    return comparison(
        [
            compared(over, 0.9, 450.0, fitted={"k": 23}),
            compared("vote", 0.7, 390.0, fitted={"k": 5}),
            compared("greedy", 0.5, 120.0, greedy=True),
        ],
        compare_id,
    )


def sweep(sweep_id: str = "sw", name: str = "vote") -> Sweep:
    """A token sweep of `name` at 200, 400 and 800: 200 below its least, 400 read from the
    pool, 800 a real run over its budget; greedy the baseline."""

    def point(budget: float, **given: Any) -> dict[str, Any]:
        base = {
            "budget": budget,
            "point_id": f"{sweep_id}-{name}-{budget:g}",
            "eval_id": f"{sweep_id}-{name}-800",
            "source": "eval",
            "fitted": {},
            "lanes": None,
            "n": 20,
            "accuracy": None,
            "interval": None,
            "paid_mean": 0.0,
            "paid_min": 0.0,
            "paid_max": 0.0,
        }
        return base | given

    return Sweep.model_validate(
        {
            "sweep_id": sweep_id,
            "dataset": "q.jsonl",
            "scorer": "exact",
            "questions": 20,
            "unit": "tokens",
            "budgets": [200.0, 400.0, 800.0],
            "pilot_questions": 10,
            "baseline": {
                "name": "greedy",
                "accuracy": 0.5,
                "interval": [0.3, 0.7],
                "config": "greedy.toml",
                "eval_id": f"{sweep_id}-greedy-greedy",
                "paid_mean": 120.0,
            },
            "configs": [
                {
                    "name": name,
                    "config": f"{name}.toml",
                    "loop": "parallel_sample",
                    "pilot": 350.0,
                    "points": [
                        point(
                            200.0, status="below_least", source="none", eval_id=None, note="k = 2 at least"
                        ),
                        point(
                            400.0,
                            source="pool",
                            fitted={"k": 5},
                            lanes=5,
                            accuracy=0.7,
                            interval=[0.5, 0.9],
                            paid_mean=390.0,
                        ),
                        point(
                            800.0,
                            fitted={"k": 23},
                            lanes=23,
                            accuracy=0.95,
                            interval=[0.8, 1.0],
                            paid_mean=900.0,
                            flag="over",
                        ),
                    ],
                }
            ],
            "plot": None,
        }
    )


def write(runs: Path, record: Comparison | Sweep) -> None:
    """The record where `compare`/`sweep` writes it: `<runs>/<id>/compare.json` or `sweep.json`."""
    kind, record_id = (
        ("compare", record.compare_id) if isinstance(record, Comparison) else ("sweep", record.sweep_id)
    )
    (runs / record_id).mkdir(parents=True, exist_ok=True)
    (runs / record_id / f"{kind}.json").write_text(json.dumps(record.model_dump(mode="json")))
