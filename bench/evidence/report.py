"""The evidence page's tables, printed from what the evidence runs recorded.

    .venv/bin/python bench/evidence/report.py sweep RUNS_DIR SWEEP_ID [--keep DIR]
    .venv/bin/python bench/evidence/report.py humaneval RUNS_DIR POOL_EVAL GREEDY_EVAL
    .venv/bin/python bench/evidence/report.py lanes RUNS_DIR SWEEP_ID
    .venv/bin/python bench/evidence/report.py reduced RUNS_DIR SWEEP_ID

`sweep`: for each loop and budget of an `orchestrator sweep`, what `fit` chose (its keys, the
spend it expected from its pilot), what a question paid and the accuracy; a point read from a
pool says so and is not tested (it is an average over subsets of lanes, not a run); a budget a
loop cannot use, or that refused every run, says so instead of a figure. Each real run is
tested against greedy decoding on the same questions as `sweep` tested it: McNemar's exact test,
Holm-adjusted across every point the sweep tests (the correction is printed). Greedy (one lane at
temperature 0) is never fitted: one run, at what it paid. Then, per loop, the first budget at
which a real run beats greedy at Holm-adjusted p < 0.05. `--keep DIR` copies `sweep.json` (the
fit record and the tests) to `DIR/<SWEEP_ID>.sweep.json`, beside the page's tables.

`humaneval`: a pool of k lanes per problem scored by the problems' tests, and a greedy eval:
accuracy against the tokens a question pays for k = 1, 2, 4, 8, 16: greedy; majority@k over
programs normalised (the code parsed and printed again by `ast`, so formatting and comments
do not split a vote); best-of-k by tests (`any_pass` with the tests as the verifier, which is
pass@k by the unbiased estimator). At the pool's whole k, each is one answer a problem, tested
against greedy by McNemar's exact test with Holm's correction over the two tests.

`lanes`: what a sweep's lanes held, for loops whose answers are calls or JSON values: per real
run, the lanes a question ran, the share of lanes with an answer (a valid call or value: under
constrained decoding the rest were cut off), the share of lanes right, the share of questions
some lane got right (what a perfect selector would reach) and the accuracy the reducer reached.
A reducer pays where lanes are right more often than greedy and it finds the right one.

`reduced`: a sweep's real runs reduced again without sampling (`orchestrator reduce --eval
EVAL_ID --reducer R [--verifier V]`, written beside each eval as `EVAL_ID.rN`): the same lanes,
the same tokens paid, another reducer. Each real point and each of its re-reductions is tested
against greedy decoding (McNemar's exact test, Holm-adjusted across all of them), then each
re-reduction against the reducer its lanes were sampled for, on the same lanes (not adjusted:
a description of where the two reducers part, not a claim).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import warnings
from pathlib import Path
from statistics import fmean

from lanefold.evaluate import Sweep, holm, majority_at_k, mcnemar, pass_at_k, rereductions
from lanefold.execution import open_store

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


def right_by_index(runs: Path, eval_id: str) -> dict[int, bool]:
    return {index: bool(row["correct"]) for index, row in rows(runs, eval_id).items()}


def sweep(runs: Path, sweep_id: str, *keep: str) -> None:
    record = Sweep.model_validate_json((runs / sweep_id / "sweep.json").read_text())
    unit, base = record.unit, record.baseline
    if base is None:
        sys.exit("no greedy config in this sweep (one lane at temperature 0): nothing to test against")
    print(
        f"sweep {sweep_id}: {record.questions} questions of {record.dataset}, "
        f"budgets in {unit} paid a question"
    )
    print(
        f"greedy ({base.name}): {base.accuracy:.3f} at {base.paid_mean:.1f} {unit} paid a question, "
        f"one lane at temperature 0, never fitted (eval {base.eval_id})"
    )
    print(f"tests: {record.tests}\n")
    head = f"{'loop':<12} {'budget':>7} {'fitted':<26} {'expected':>8} {'paid':>7} {'accuracy':>8}"
    print(f"{head} {'vs greedy':>10} {'b-c':>7} {'p':>7} {'p Holm':>7}")
    first: dict[str, str] = {}
    for line in record.configs:
        for point in line.points:
            fit = point.fit
            keys = ", ".join(f"{k}={v}" for k, v in point.fitted.items() if "quorum" not in k)
            lead = f"{line.name:<12} {point.budget:>7g}"
            if point.status == "below_least":
                print(f"{lead} cannot run at this budget: {point.note}")
                continue
            if point.status == "refused":
                print(
                    f"{lead} {keys:<26} refused: the budget refused all {point.refused} runs "
                    "(none is a point)"
                )
                continue
            expected = (
                f"{fit.expected:>8.1f}" if fit is not None and fit.expected is not None else f"{'-':>8}"
            )
            row = f"{lead} {keys:<26} {expected} {point.paid_mean:>7.1f} {point.accuracy or 0.0:>8.3f}"
            flag = f"  ({point.flag} budget)" if point.flag else ""
            if point.source == "pool":
                print(f"{row} {'read from a pool: not a run, not tested':>34}{flag}")
                continue
            test = point.against_greedy
            if test is None or test.p_value is None:
                print(f"{row} {'not paired':>10}{flag}")
                continue
            gain = (point.accuracy or 0.0) - base.accuracy
            adjusted = test.p_adjusted if test.p_adjusted is not None else test.p_value
            mark = "  *" if gain > 0 and adjusted < 0.05 else ""
            b_c = f"{test.only_first}-{test.only_second}"
            print(f"{row} {gain:>+10.3f} {b_c:>7} {test.p_value:>7.3g} {adjusted:>7.3g}{mark}{flag}")
            if line.name not in first and gain > 0 and adjusted < 0.05:
                first[line.name] = f"{point.budget:g} {unit} ({keys}; {gain:+.3f}, p = {adjusted:.3g} Holm)"
        first.setdefault(line.name, f"never, up to {max(record.budgets):g} {unit}")
    print("\nfirst budget at which a real run beats greedy (McNemar exact, Holm-adjusted p < 0.05):")
    for name, when in first.items():
        print(f"  {name:<12} {when}")
    if keep:
        if keep[0] != "--keep" or len(keep) != 2:
            sys.exit("usage: report.py sweep RUNS_DIR SWEEP_ID [--keep DIR]")
        kept = Path(keep[1]) / f"{sweep_id}.sweep.json"
        shutil.copyfile(runs / sweep_id / "sweep.json", kept)
        print(f"\nkept {kept} (what fit chose, from which pilot figures, and the tests)")


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
    # At the pool's whole k each is one answer a problem: paired against greedy, exactly.
    base = {i: bool(g["correct"]) for i, g in greedy.items()}
    whole = {
        "majority": {
            i: bool(
                majority_at_k(
                    [normalised(a) for a in r["lane_answers"][:lanes]], r["lane_correct"][:lanes], lanes
                ).value
            )
            if r["status"] != "failed" and r["lane_correct"]
            else False
            for i, r in pool.items()
        },
        "best-of-k": {i: any(r["lane_correct"][:lanes]) for i, r in pool.items()},
    }
    tests = {name: mcnemar(answers, base) for name, answers in whole.items()}
    adjusted = holm([test.p_value for test in tests.values()])
    print(f"\nat k = {lanes} against greedy, McNemar's exact test, Holm-adjusted across {len(tests)} tests:")
    for (name, test), p in zip(tests.items(), adjusted, strict=True):
        print(
            f"  {name:<10} {test.only_first} wins, {test.only_second} losses of {test.paired} "
            f"paired: p = {test.p_value:.3g}, Holm {p:.3g}"
        )


def lanes(runs: Path, sweep_id: str) -> None:
    record = Sweep.model_validate_json((runs / sweep_id / "sweep.json").read_text())
    print(f"lanes of sweep {sweep_id}: {record.questions} questions of {record.dataset}")
    print(
        f"{'loop':<14} {'budget':>7} {'lanes':>6} {'answered':>9} {'lane right':>10} "
        f"{'some lane right':>15} {'accuracy':>8}"
    )
    runs_of = [(record.baseline.name, "greedy", record.baseline.eval_id)] if record.baseline else []
    for line in record.configs:
        runs_of += [
            (line.name, f"{point.budget:g}", point.eval_id)
            for point in line.points
            if point.status == "ran" and point.source == "eval" and point.eval_id
        ]
    for name, budget, eval_id in runs_of:
        found = list(rows(runs, eval_id).values())
        held = [r for r in found if r["lane_answers"]]
        answers = [a for r in held for a in r["lane_answers"]]
        right = [c for r in held for c in r["lane_correct"]]
        some = sum(any(r["lane_correct"]) for r in held) / len(found)
        accuracy = fmean(float(r["correct"]) for r in found)
        answered = sum(a is not None for a in answers) / len(answers)
        print(
            f"{name:<14} {budget:>7} {fmean(len(r['lane_answers']) for r in held):>6.1f} "
            f"{answered:>9.3f} {fmean(right):>10.3f} {some:>15.3f} {accuracy:>8.3f}"
        )


def reduced(runs: Path, sweep_id: str) -> None:
    record = Sweep.model_validate_json((runs / sweep_id / "sweep.json").read_text())
    base = record.baseline
    if base is None or base.eval_id is None:
        sys.exit("no greedy config in this sweep (one lane at temperature 0): nothing to test against")
    greedy = right_by_index(runs, base.eval_id)
    store = open_store(None, runs)
    print(f"re-reductions of sweep {sweep_id}: {record.questions} questions of {record.dataset}")
    print(
        f"greedy ({base.name}): {fmean(greedy.values()):.3f} at {base.paid_mean:.1f} "
        f"{record.unit} paid a question\n"
    )
    found = []  # (label, budget, fitted, paid, sampled-for correct, this correct)
    for line in record.configs:
        for point in line.points:
            if point.status != "ran" or point.source != "eval" or not point.eval_id:
                continue
            keys = ", ".join(f"{k}={v}" for k, v in point.fitted.items() if "quorum" not in k)
            own = right_by_index(runs, point.eval_id)
            found.append((f"{line.name} (as run)", point.budget, keys, point.paid_mean, own, own))
            for manifest, _ in rereductions(store, point.eval_id):
                label = manifest.rescore_of.describe() if manifest.rescore_of else manifest.eval_id
                again = right_by_index(runs, manifest.eval_id)
                found.append((f"  {label}", point.budget, keys, point.paid_mean, own, again))
    tests = [mcnemar(correct, greedy) for *_, correct in found]
    adjusted = holm([t.p_value for t in tests])
    print(
        "tests: McNemar's exact test against greedy on the same questions, "
        f"Holm-adjusted across {len(tests)} tests"
    )
    print(
        f"{'reducer':<40} {'budget':>7} {'fitted':<8} {'paid':>7} {'accuracy':>8} "
        f"{'vs greedy':>10} {'b-c':>7} {'p':>7} {'p Holm':>7}"
    )
    for (label, budget, keys, paid, _, correct), test, adj in zip(found, tests, adjusted, strict=True):
        gain = fmean(correct.values()) - fmean(greedy.values())
        mark = "  *" if gain > 0 and adj is not None and adj < 0.05 else ""
        print(
            f"{label:<40} {budget:>7g} {keys:<8} {paid:>7.1f} {fmean(correct.values()):>8.3f} {gain:>+10.3f} "
            f"{f'{test.only_first}-{test.only_second}':>7} {test.p_value:>7.3g} {adj:>7.3g}{mark}"
        )
    print("\non the same lanes, each re-reduction against the reducer they were sampled for (not adjusted):")
    for label, budget, _, _, own, correct in found:
        if correct is own:
            continue
        test = mcnemar(correct, own)
        print(f"{label.strip():<38} {budget:>7g} {test.only_first}-{test.only_second} p = {test.p_value:.3g}")


if __name__ == "__main__":
    what, runs, *rest = sys.argv[1:]
    {"sweep": sweep, "humaneval": humaneval, "lanes": lanes, "reduced": reduced}[what](Path(runs), *rest)
