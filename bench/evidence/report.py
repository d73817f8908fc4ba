"""The evidence page's tables, printed from what the evidence runs recorded.

    PYTHONPATH=. .venv/bin/python bench/evidence/report.py sweep RUNS_DIR SWEEP_ID
    PYTHONPATH=. .venv/bin/python bench/evidence/report.py humaneval RUNS_DIR POOL_EVAL GREEDY_EVAL

`sweep`: for each loop and budget of a `orchestrator sweep`, its accuracy and what it paid,
and the paired test against greedy decoding on the same questions (each question's accuracy,
0/1 for a sampled point, majority@k for a point read from a pool, minus greedy's 0/1; mean
difference, its standard error, a two-sided p from the normal approximation); then, per loop,
the first budget at which it beats greedy at p < 0.05, or "never, up to N".

`humaneval`: a pool of k lanes per problem scored by the problems' tests, and a greedy eval:
accuracy against the tokens a question pays for k = 1, 2, 4, 8, 16: greedy; majority@k over
programs normalised (the code parsed and printed again by `ast`, so formatting and comments
do not split a vote); best-of-k by tests (`any_pass` with the tests as the verifier, which is
pass@k by the unbiased estimator).
"""

from __future__ import annotations

import ast
import json
import math
import re
import sys
import warnings
from pathlib import Path
from statistics import NormalDist, fmean, stdev

from lanefold.evaluate import majority_at_k, pass_at_k, read_pool

FENCE = re.compile(r"```(?:python|py)?\n(.*?)```", re.S)


def rows(runs: Path, eval_id: str) -> dict[int, dict]:
    lines = (runs / eval_id / "results.jsonl").read_text().splitlines()
    out = {}
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last row
        out[row["index"]] = row
    return out


def paired(values: dict[int, float], base: dict[int, float]) -> tuple[float, float, float]:
    """Mean difference, its standard error, two-sided p (normal approximation)."""
    common = sorted(set(values) & set(base))
    diffs = [values[i] - base[i] for i in common]
    mean = fmean(diffs)
    se = stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    if se == 0.0:
        return mean, 0.0, 1.0 if mean == 0 else 0.0
    return mean, se, 2 * (1 - NormalDist().cdf(abs(mean / se)))


def per_question(runs: Path, point: dict) -> dict[int, float]:
    """Each question's accuracy at a sweep point."""
    if point["source"] == "pool":
        pool = read_pool(runs, point["eval_id"])
        return {
            q.index: majority_at_k(q.answers, q.correct, point["lanes"]).value
            for q in pool.questions
            if len(q.answers) >= point["lanes"]
        }
    return {i: float(r["correct"]) for i, r in rows(runs, point["eval_id"]).items()}


def sweep(runs: Path, sweep_id: str) -> None:
    record = json.loads((runs / sweep_id / "sweep.json").read_text())
    greedy_name = (record.get("baseline") or {}).get("name")
    configs = {c["name"]: c for c in record["configs"]}
    if greedy_name is None:
        sys.exit("no greedy config in this sweep: nothing to test against")
    largest = configs[greedy_name]["points"][-1]
    base = {
        i: float(r["lane_correct"][0]) if r["lane_correct"] else 0.0
        for i, r in rows(runs, largest["eval_id"]).items()
    }
    print(
        f"sweep {sweep_id}: {record['questions']} questions of {record['dataset']}, "
        f"budgets in {record['unit']} paid a question"
    )
    print(f"greedy ({greedy_name}): {fmean(base.values()):.3f} on {len(base)} questions\n")
    print(f"{'loop':<10} {'budget':>7} {'fitted':<28} {'paid':>7} {'accuracy':>9} {'vs greedy':>10} {'p':>7}")
    first: dict[str, str] = {}
    for name, config in configs.items():
        if name == greedy_name:
            continue
        for point in config["points"]:
            values = per_question(runs, point)
            mean, _, p = paired(values, base)
            fitted = ", ".join(f"{k}={v}" for k, v in point["fitted"].items() if k != "min_quorum")
            print(
                f"{name:<10} {point['budget']:>7g} {fitted:<28} {point['paid_mean']:>7.1f} "
                f"{point['accuracy']:>9.3f} {mean:>+10.3f} {p:>7.3f}{'  *' if mean > 0 and p < 0.05 else ''}"
            )
            if name not in first and mean > 0 and p < 0.05:
                first[name] = f"{point['budget']:g} {record['unit']} (+{mean:.3f}, p = {p:.3f})"
        first.setdefault(name, f"never, up to {max(record['budgets']):g} {record['unit']}")
    print("\nfirst budget that beats greedy (paired, p < 0.05):")
    for name, when in first.items():
        print(f"  {name:<10} {when}")


def normalised(text: str | None) -> str | None:
    """A program as `ast` prints it back (its first fenced block if it has one); the text
    itself stripped where it does not parse."""
    if text is None:
        return None
    fenced = FENCE.search(text)
    code = fenced.group(1) if fenced else text
    try:
        with warnings.catch_warnings():  # a model's code may hold odd literals: not ours to warn of
            warnings.simplefilter("ignore")
            return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError):
        return code.strip()


def humaneval(runs: Path, pool_id: str, greedy_id: str) -> None:
    pool, greedy = rows(runs, pool_id), rows(runs, greedy_id)
    finished = [r for r in pool.values() if r["status"] != "failed" and r["lane_correct"]]
    lanes = min(len(r["lane_correct"]) for r in finished)
    prefill = fmean(r["tokens"]["prefill"] for r in finished)
    decode_per_lane = fmean(r["tokens"]["decode"] / len(r["lane_correct"]) for r in finished)
    greedy_paid = fmean(g["tokens"]["prefill"] + g["tokens"]["decode"] for g in greedy.values())
    print(f"HumanEval: {len(pool)} problems; pool {pool_id} ({lanes} lanes each), greedy {greedy_id}")
    right = fmean(float(g["correct"]) for g in greedy.values())
    print(f"greedy: {right:.3f} at {greedy_paid:.0f} tokens paid a problem\n")
    print(f"{'k':>3} {'paid':>7} {'majority@k (normalised)':>24} {'best-of-k by tests':>19}")
    k = 1
    while k <= lanes:
        votes = []
        for r in finished:
            programs = [normalised(a) for a in r["lane_answers"][:lanes]]
            votes.append(majority_at_k(programs, r["lane_correct"][:lanes], k).value)
        passes = [pass_at_k(lanes, sum(r["lane_correct"][:lanes]), k) for r in finished]
        n = len(pool)  # a failed problem counts as wrong
        paid = prefill + k * decode_per_lane
        print(f"{k:>3} {paid:>7.0f} {sum(votes) / n:>24.3f} {sum(passes) / n:>19.3f}")
        k *= 2


if __name__ == "__main__":
    what, runs, *rest = sys.argv[1:]
    {"sweep": sweep, "humaneval": humaneval}[what](Path(runs), *rest)
