"""`orchestrator eval`: datasets, scorers, the statistics of the summary, resume and bad input.

Everything runs on the simulated backend, whose answers are a function of the prompt and the
lane's seed: the accuracy test is exact for its seeds, and the resume tests count backend
calls (`call_log`) and compare run logs byte for byte, never timings.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import lanefold
import lanefold.cli._main as cli
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.cli._eval import command
from lanefold.cli._progress import EvalProgress
from lanefold.evaluate._datasets import DatasetSpec, load_dataset
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import (
    EvalSummary,
    QuestionResult,
    pass_at_k,
    read_manifest,
    read_results,
    wilson_interval,
)
from lanefold.evaluate._item import Item
from lanefold.evaluate._scorer import Score
from lanefold.evaluate._scoring import HumanEvalTests, humaneval_program, resolve_scorer
from lanefold.primitives import ConfigError
from lanefold.stores.files import RunLock

ROOT = Path(__file__).resolve().parents[2]


def config(
    *,
    k: int = 1,
    backend: dict[str, Any] | None = None,
    **extra: Any,
) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "seed": 3, **extra.pop("loop", {})},
            "backend": {"kind": "simulated", "accuracy": 0.7, **(backend or {})},
            "log": {"fsync": "never"},
            **extra,
        }
    )


def items(n: int, gold: str = "391") -> list[Item]:
    return [Item(i, f"Question number {i}?", gold, source=f"<test>:{i + 1}") for i in range(n)]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def eval_cli(*argv: str) -> int:
    """The `eval` command's handler on the CLI's own parser: errors arrive as exceptions."""
    return command(cli._parser().parse_args(["eval", *argv]))


def run(coro_fn: Any) -> Any:
    return anyio.run(coro_fn)


class Counting(SimulatedBackend):
    """The simulated backend, counting loads."""

    loads = 0

    async def load(self) -> None:
        self.loads += 1


# -- statistics -------------------------------------------------------------------------------

Z = 1.959963984540054


@pytest.mark.parametrize(("x", "n"), [(0, 10), (5, 10), (7, 10), (10, 10), (350, 500), (1, 3)])
def test_wilson_interval_matches_closed_form(x: int, n: int) -> None:
    low, high = wilson_interval(x, n)
    p = x / n
    # The Wilson bounds are the roots of n (p - q)^2 = z^2 q (1 - q) ...
    for bound in (low, high):
        assert n * (p - bound) ** 2 == pytest.approx(Z * Z * bound * (1 - bound), abs=1e-9)
    # ... and at the edges the closed forms z^2 / (n + z^2) and n / (n + z^2).
    if x == 0:
        assert (low, high) == pytest.approx((0.0, Z * Z / (n + Z * Z)))
    if x == n:
        assert (low, high) == pytest.approx((n / (n + Z * Z), 1.0))
    assert wilson_interval(7, 10) == pytest.approx((0.396778, 0.892209), abs=1e-6)


@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_holds_the_estimate_and_mirrors(case: tuple[int, int]) -> None:
    x, n = case
    low, high = wilson_interval(x, n)
    assert 0.0 <= low <= x / n <= high <= 1.0
    mirror_low, mirror_high = wilson_interval(n - x, n)
    assert (low, high) == pytest.approx((1 - mirror_high, 1 - mirror_low), abs=1e-12)


def test_wilson_interval_of_nothing_is_everything() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


@st.composite
def lanes(draw: st.DrawFn) -> tuple[int, int]:
    n = draw(st.integers(1, 64))
    return n, draw(st.integers(0, n))


@given(lanes())
def test_pass_at_k_is_the_exact_combinatorial_estimator(case: tuple[int, int]) -> None:
    n, c = case
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    for k, value in enumerate(values, start=1):
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert value == pytest.approx(float(exact), abs=1e-12)
        stable = 1 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))  # Chen et al.'s form
        assert value == pytest.approx(stable, abs=1e-9)
        assert 0.0 <= value <= 1.0
    assert all(a <= b + 1e-15 for a, b in itertools.pairwise(values))  # monotone in k
    assert values[0] == pytest.approx(c / n)  # pass@1 is the fraction correct


def test_pass_at_k_refuses_what_has_no_meaning() -> None:
    with pytest.raises(ConfigError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ConfigError):
        pass_at_k(4, 2, 5)


# -- datasets ---------------------------------------------------------------------------------


def test_jsonl_and_csv_rows_become_items(tmp_path: Path) -> None:
    jsonl = write_jsonl(
        tmp_path / "d.jsonl",
        [
            {"question": "2+2?", "answer": 4, "level": 1},
            {},  # {} is refused below
        ],
    )
    jsonl.write_text(
        jsonl.read_text().replace("{}\n", "\n")
        + json.dumps({"question": "Capital of France?", "answer": ["Paris", "paris"]})
    )
    first, second = load_dataset(str(jsonl))
    assert (first.index, first.question, first.answer, dict(first.meta)) == (0, "2+2?", "4", {"level": 1})
    assert first.source == f"{jsonl}:1" and second.source == f"{jsonl}:3"
    assert second.meta["answers"] == ["Paris", "paris"]
    table = tmp_path / "d.csv"
    table.write_text('input,target,extra\n"What is\n1+1?",2,x\n\n3+3?,6,y\n')
    got = load_dataset(str(table), question_field="input", answer_field="target", limit=1)
    assert [(i.question, i.answer, i.source) for i in got] == [("What is\n1+1?", "2", f"{table}:3")]
    assert DatasetSpec(str(table), "input", "target").load()[1].source == f"{table}:5"


def _bad_input_cases(tmp: Path) -> list[tuple[list[str], str]]:
    good = write_jsonl(tmp / "good.jsonl", [{"question": "q1?", "answer": "1"}])
    no_question = write_jsonl(
        tmp / "noq.jsonl",
        [
            {"question": "q?", "answer": "1"},
            {"question": "q?", "answer": "1"},
            {"prompt": "q?", "answer": "1"},
        ],
    )
    no_answer = write_jsonl(tmp / "noa.jsonl", [{"question": "q?", "answer": "1"}, {"question": "q2?"}])
    (tmp / "bad.jsonl").write_text('{"question": "q?", "answer": "1"}\n{"question": \n')
    (tmp / "list.jsonl").write_text('["q?", "1"]\n')
    (tmp / "empty.jsonl").write_text("\n")
    write_jsonl(tmp / "blank.jsonl", [{"question": "  ", "answer": "1"}])
    write_jsonl(tmp / "text.jsonl", [{"question": "q?", "answer": "seven"}])
    (tmp / "d.txt").write_text("q?\n")
    (tmp / "head.csv").write_text("question,gold\nq?,1\n")
    (tmp / "wide.csv").write_text("question,answer\nq?,1\nq2?,2,3\n")
    sim = tmp / "sim.toml"
    sim.write_text('[backend]\nkind = "simulated"\n')
    c, g = str(sim), str(good)
    return [
        ([c, "--dataset", str(tmp / "missing.jsonl")], "missing.jsonl: no such file"),
        ([c, "--dataset", "hf:gsm8k"], "unknown dataset 'hf:gsm8k'"),
        ([c, "--dataset", str(no_question)], "noq.jsonl:3: no 'question' field"),
        ([c, "--dataset", str(no_answer)], "noa.jsonl:2: no 'answer' field"),
        ([c, "--dataset", str(tmp / "bad.jsonl")], "bad.jsonl:2: not valid JSON"),
        ([c, "--dataset", str(tmp / "list.jsonl")], "list.jsonl:1: a row must be a JSON object"),
        ([c, "--dataset", str(tmp / "empty.jsonl")], "empty.jsonl: no rows"),
        ([c, "--dataset", str(tmp / "blank.jsonl")], "blank.jsonl:1: 'question': the question is empty"),
        ([c, "--dataset", str(tmp / "d.txt")], "d.txt: not a dataset file"),
        (
            [c, "--dataset", str(tmp / "head.csv")],
            "head.csv:2: no 'answer' field for the answer (the row has: gold, question)",
        ),
        ([c, "--dataset", str(tmp / "wide.csv")], "wide.csv:3: more cells than the header"),
        (
            [c, "--dataset", g, "--question-field", "input", "--answer-field", "target"],
            "good.jsonl:1: no 'input' field",
        ),
        (
            [c, "--dataset", "humaneval", "--question-field", "prompt"],
            "--question-field: applies to JSONL and CSV files",
        ),
        (
            [c, "--dataset", str(tmp / "text.jsonl"), "--scorer", "numeric"],
            "text.jsonl:1: the gold answer 'seven' is not a number",
        ),
        ([c, "--dataset", g, "--scorer", "fuzzy"], "unknown scorer 'fuzzy'"),
        ([c, "--dataset", g, "--scorer", "no_such_module_here:f"], "cannot import"),
        ([c, "--dataset", g, "--limit", "0"], "--limit: must be at least 1"),
        ([c, "--dataset", g, "--concurrency", "0"], "--concurrency: must be at least 1"),
        ([c, "--dataset", g, "--eval-id", "a/b"], "is not a plain name"),
        ([str(tmp / "none.toml"), "--dataset", g], "none.toml"),
        ([c], "CONFIG and --dataset are required"),
        (["--resume", "nope"], "no eval 'nope'"),
        (["--resume", "nope", "--dataset", g], "--resume: --dataset comes from the eval's"),
    ]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    for argv, expected in _bad_input_cases(tmp_path):
        with pytest.raises(ConfigError) as caught:
            eval_cli(*argv, "--runs-dir", str(runs))
        message = str(caught.value)
        assert caught.value.exit_code == 2, argv
        assert expected in message, (argv, message)
        assert "\n" not in message, argv
        assert not runs.exists(), argv


def test_bad_input_reaches_the_terminal_as_one_line_once_wired(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sim.toml").write_text('[backend]\nkind = "simulated"\n')
    code = cli.main(["eval", "sim.toml", "--dataset", "missing.jsonl"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == "orchestrator eval: --dataset: missing.jsonl: no such file\n"
    assert not (tmp_path / "runs").exists()


# -- scorers ----------------------------------------------------------------------------------


def _score(spec: str | None, item: Item, answer: str | None) -> Score:
    scorer = resolve_scorer(spec, [item])
    score: Score = run(lambda: scorer.score(item, answer, None))
    return score


def test_exact_match_normalises_as_the_vote_does() -> None:
    item = Item(0, "q?", "1000")
    assert _score(None, item, " 1,000. ").correct
    assert not _score("exact", item, "1001").correct
    assert not _score("exact", item, None).correct
    several = Item(0, "q?", "Paris", {"answers": ["Paris", "City of Light"]})
    assert _score("exact", several, "city of light").value == 1.0


def test_numeric_tolerance() -> None:
    item = Item(0, "q?", "3.14159")
    assert not _score("numeric", item, "3.1416").correct
    assert _score("numeric:1e-3", item, "3.1416").correct
    assert _score("numeric:0.5", Item(0, "q?", "100"), "100.4").correct
    assert not _score("numeric", item, "pi").correct
    assert resolve_scorer("numeric").name == "numeric:1e-06"
    with pytest.raises(ConfigError, match="not a number"):
        resolve_scorer("numeric:abc")


def scorer_bool(gold: str | None, answer: str | None, item: Item) -> bool:
    return answer is not None and answer.strip() == f"<{gold}>"


def scorer_partial(gold: str | None, answer: str | None, item: Item) -> float:
    return 0.75


async def scorer_async(gold: str | None, answer: str | None, item: Item) -> bool:
    await anyio.lowlevel.checkpoint()
    return True


def scorer_raises(gold: str | None, answer: str | None, item: Item) -> bool:
    raise ValueError("boom")


def scorer_wrong_type(gold: str | None, answer: str | None, item: Item) -> object:
    return "yes"


def test_module_function_scorers() -> None:
    item = Item(0, "q?", "7")
    here = __name__
    assert _score(f"{here}:scorer_bool", item, "<7>").correct
    assert not _score(f"{here}:scorer_bool", item, "7").correct
    partial = _score(f"{here}:scorer_partial", item, "x")
    assert (partial.value, partial.correct) == (0.75, True)
    assert _score(f"{here}:scorer_async", item, "x").correct
    raised = _score(f"{here}:scorer_raises", item, "x")
    assert (raised.value, raised.error) == (0.0, f"scorer {here}:scorer_raises raised ValueError: boom")
    assert "want a bool or a float" in (_score(f"{here}:scorer_wrong_type", item, "x").error or "")


def test_humaneval_program_takes_the_fenced_code_or_the_continuation() -> None:
    item = Item(
        0,
        "p",
        None,
        {
            "prompt": 'def f(x):\n    """Double."""\n',
            "test": "def check(c):\n    assert c(2) == 4\n",
            "entry_point": "f",
        },
    )
    body = humaneval_program(item, "    return 2 * x\n")
    assert body.startswith(item.meta["prompt"] + "    return 2 * x") and "check(f)" in body
    fenced = humaneval_program(item, "Here:\n```python\ndef f(x):\n    return x + x\n```\nDone")
    assert "def f(x):\n    return x + x\n" in fenced and "Done" not in fenced


@pytest.mark.slow
def test_humaneval_tests_pass_fail_and_time_out() -> None:
    item = Item(
        0,
        "p",
        None,
        {"prompt": "def f(x):\n", "entry_point": "f", "test": "def check(c):\n    assert c(2) == 4\n"},
    )
    tests = HumanEvalTests(timeout_s=2)

    async def main() -> list[Score]:
        return [
            await tests.score(item, None, text)
            for text in (
                "    return 2 * x\n",
                "    return x\n",
                "    while True: pass\n",
                "    print(99)\n    return 2 * x\n",
                "    import sys; sys.exit(0)\n",
            )
        ]

    right, wrong, hung, printed, exits = run(main)
    assert (right.correct, wrong.correct, hung.correct) == (True, False, False)
    assert hung.error is not None and "timed out" in hung.error
    assert printed.correct and not exits.correct
    with pytest.raises(ConfigError, match="no 'prompt' field"):
        resolve_scorer("humaneval", [Item(0, "q?", "1")])


# -- the eval ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_accuracy_lies_in_the_wilson_interval_of_the_known_value(tmp_path: Path) -> None:
    backend = Counting(SimulatedConfig(accuracy=0.7))
    summary = await run_eval(
        config(), items(500), eval_id="acc", runs_dir=tmp_path, concurrency=16, backend=backend
    )
    low, high = summary.interval
    assert low <= 0.7 <= high
    assert summary.n == 500 and summary.correct == round(summary.accuracy * 500)
    assert summary.pass_at_k == {"1": summary.accuracy}  # one lane: pass@1 is the accuracy
    assert backend.loads == 1  # one model for every question
    rows = read_results(tmp_path / "acc" / "results.jsonl")
    assert sorted(rows) == list(range(500))
    # Question i ran with seed 3 + i: the questions' draws are independent.
    started = json.loads((tmp_path / "acc.41" / "events.jsonl").read_text().splitlines()[0])
    assert started["data"]["config"]["loop"]["seed"] == 44


@pytest.mark.anyio
async def test_pass_at_k_and_the_bill_from_the_lanes(tmp_path: Path) -> None:
    cfg = config(
        k=4, loop={"reducer": "majority_vote"}, pricing={"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    )
    summary = await run_eval(cfg, items(200), eval_id="k4", runs_dir=tmp_path, concurrency=8)
    assert set(summary.pass_at_k) == {"1", "2", "4"}
    se = math.sqrt(0.7 * 0.3 / 800)
    assert abs(summary.pass_at_k["1"] - 0.7) < 4 * se
    assert summary.pass_at_k["4"] == pytest.approx(1 - 0.3**4, abs=0.03)
    rows = list(read_results(tmp_path / "k4" / "results.jsonl").values())
    assert all(row.lanes == 4 and len(row.lane_correct) == 4 for row in rows)
    assert summary.mean_lanes == 4
    assert summary.tokens["decode"] == sum(row.tokens["decode"] for row in rows) > 0
    assert summary.cost["total"] == pytest.approx(sum(row.cost for row in rows))
    assert summary.cost["total"] == pytest.approx(summary.cost["prefill"] + summary.cost["decode"])
    csv_lines = (tmp_path / "k4" / "results.csv").read_text().splitlines()
    assert csv_lines[0].startswith("index,run_id,question,answer,gold,correct,score,status,lanes")
    assert len(csv_lines) == 201
    on_disk = EvalSummary.model_validate_json((tmp_path / "k4" / "summary.json").read_text())
    assert on_disk == summary


@pytest.mark.anyio
async def test_a_failed_run_is_a_row_not_the_end(tmp_path: Path) -> None:
    cfg = config(k=4, budget={"max_tokens": 100})  # cannot fund the quorum
    summary = await run_eval(cfg, items(3), eval_id="poor", runs_dir=tmp_path, concurrency=2)
    assert (summary.n, summary.failed, summary.correct, summary.pass_at_k) == (3, 3, 0, {})
    row = read_results(tmp_path / "poor" / "results.jsonl")[0]
    assert row.status == "failed" and row.error is not None
    assert row.error.startswith("BudgetExhaustedError")


@pytest.mark.anyio
async def test_abstentions_are_counted(tmp_path: Path) -> None:
    cfg = config(extract={"regex": r"Final:\s*(\d+)"})  # the simulated text never says it
    summary = await run_eval(cfg, items(4), eval_id="mute", runs_dir=tmp_path)
    assert (summary.abstentions, summary.answered, summary.correct) == (4, 0, 0)


@pytest.mark.anyio
async def test_calling_again_records_what_finished_and_calls_nothing(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    cfg = config(k=2, backend={"call_log": str(log)})
    first = await run_eval(cfg, items(6), eval_id="again", runs_dir=tmp_path, concurrency=3)
    calls = log.read_text()
    results = tmp_path / "again" / "results.jsonl"
    lines = results.read_text().splitlines(keepends=True)
    # A crash after run 5 finished and before its row was appended, mid-append of another:
    results.write_text("".join(lines[:4]) + lines[4][:30])
    seen: list[QuestionResult] = []
    second = await run_eval(cfg, items(6), eval_id="again", runs_dir=tmp_path, on_result=seen.append)
    assert log.read_text() == calls  # no backend call: both runs had finished
    assert len(seen) == 2 and second.correct == first.correct
    assert sorted(read_results(results)) == list(range(6))
    assert len(results.read_text().splitlines()) == 6


@pytest.mark.anyio
async def test_another_config_under_the_same_id_is_refused(tmp_path: Path) -> None:
    await run_eval(config(), items(2), eval_id="one", runs_dir=tmp_path)
    with pytest.raises(ConfigError, match="started with another config"):
        await run_eval(config(k=2), items(2), eval_id="one", runs_dir=tmp_path)
    with pytest.raises(ConfigError, match="started with other questions") as caught:
        await run_eval(config(), items(2, gold="7"), eval_id="one", runs_dir=tmp_path)
    assert str(caught.value).endswith(
        f"continue it with `orchestrator eval --resume one --runs-dir {tmp_path}` or choose a new --eval-id"
    ), "a hint that works as pasted"


@pytest.mark.anyio
async def test_a_larger_limit_grows_an_eval_keeping_what_finished(tmp_path: Path) -> None:
    first = await run_eval(
        config(), items(20)[:4], eval_id="grow", runs_dir=tmp_path, dataset=DatasetSpec("q.jsonl", limit=4)
    )
    logs = {i: (tmp_path / f"grow.{i}" / "events.jsonl").read_bytes() for i in range(4)}
    grown = await run_eval(
        config(), items(20)[:10], eval_id="grow", runs_dir=tmp_path, dataset=DatasetSpec("q.jsonl", limit=10)
    )
    assert (first.n, grown.n) == (4, 10)
    assert all((tmp_path / f"grow.{i}" / "events.jsonl").read_bytes() == log for i, log in logs.items()), (
        "finished questions are kept, not run again"
    )
    manifest = read_manifest(tmp_path, "grow")
    assert (manifest.questions, manifest.limit) == (10, 10)
    with pytest.raises(ConfigError, match="has 10 questions; --limit can grow it, not shrink it"):
        await run_eval(
            config(),
            items(20)[:5],
            eval_id="grow",
            runs_dir=tmp_path,
            dataset=DatasetSpec("q.jsonl", limit=5),
        )


@pytest.mark.anyio
async def test_an_eval_another_process_runs_is_refused_naming_it(tmp_path: Path) -> None:
    await run_eval(config(), items(2), eval_id="busy", runs_dir=tmp_path)
    lock = RunLock.acquire(tmp_path / "busy", "busy")  # as the process running it holds it
    try:
        with pytest.raises(ConfigError) as caught:
            await run_eval(config(), items(2), eval_id="busy", runs_dir=tmp_path)
    finally:
        lock.release()
    assert str(caught.value) == f"eval busy is being run by another process (pid {os.getpid()})"


@pytest.mark.anyio
async def test_an_evals_runs_never_take_another_evals_id(tmp_path: Path) -> None:
    await run_eval(config(), items(3), eval_id="k8nt", runs_dir=tmp_path)
    assert sorted([p.name async for p in anyio.Path(tmp_path).iterdir()]) == [
        "k8nt",
        "k8nt.0",
        "k8nt.1",
        "k8nt.2",
    ]
    two = await run_eval(config(), items(2), eval_id="k8nt-2", runs_dir=tmp_path)
    assert two.n == 2 and (tmp_path / "k8nt-2.1" / "events.jsonl").is_file()
    with pytest.raises(ConfigError, match=r"eval id 'k8nt\.2' ends like a question's run id"):
        await run_eval(config(), items(2), eval_id="k8nt.2", runs_dir=tmp_path)


@pytest.mark.anyio
async def test_an_eval_recorded_with_the_old_run_ids_goes_on_with_them(tmp_path: Path) -> None:
    await run_eval(config(), items(2), eval_id="old", runs_dir=tmp_path)
    manifest = tmp_path / "old" / "eval.json"
    raw = json.loads(manifest.read_text())
    assert raw.pop("run_ids") == "{eval_id}.{index}"
    manifest.write_text(json.dumps(raw))  # as an eval started before the rule records it
    for i in range(2):
        shutil.rmtree(tmp_path / f"old.{i}")
    (tmp_path / "old" / "results.jsonl").unlink()
    summary = await run_eval(config(), items(2), eval_id="old", runs_dir=tmp_path)
    assert summary.n == 2
    rows = read_results(tmp_path / "old" / "results.jsonl").values()
    assert sorted(row.run_id for row in rows) == ["old-0", "old-1"]
    assert (tmp_path / "old-1" / "events.jsonl").is_file() and not (tmp_path / "old.0").exists()


def test_eval_resume_with_a_larger_limit_grows_the_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sim.toml").write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n')
    write_jsonl(tmp_path / "q.jsonl", [{"question": f"Q{i}?", "answer": "391"} for i in range(9)])
    assert eval_cli("sim.toml", "--dataset", "q.jsonl", "--limit", "3", "--eval-id", "g", "--json") == 0
    assert eval_cli("--resume", "g", "--limit", "7", "--json") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["n"] == 7
    assert eval_cli("sim.toml", "--dataset", "q.jsonl", "--eval-id", "g", "--json") == 0
    assert json.loads(capsys.readouterr().out)["n"] == 9, "no --limit: the whole dataset"


def test_tail_and_show_take_an_eval_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sim.toml").write_text(
        '[loop]\nk = 2\nseed = 1\n[backend]\nkind = "simulated"\naccuracy = 0.7\n'
    )
    write_jsonl(tmp_path / "q.jsonl", [{"question": f"Q{i}?", "answer": "391"} for i in range(5)])
    assert eval_cli("sim.toml", "--dataset", "q.jsonl", "--eval-id", "ev", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert cli.main(["tail", "ev"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 and all(line.startswith("#") and "run=ev." in line for line in lines)
    assert cli.main(["tail", "ev", "--follow", "--json"]) == 0, "all there: it ends"
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(row["index"] for row in rows) == list(range(5))
    assert cli.main(["show", "ev", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {k: shown[k] for k in summary} == summary
    assert (shown["questions"], shown["running"]) == (5, False)
    # An eval cut off: show gives the rows so far and says how many are left.
    results = tmp_path / "runs" / "ev" / "results.jsonl"
    results.write_text("".join(results.read_text().splitlines(keepends=True)[:3]))
    assert cli.main(["show", "ev"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 of 5 questions finished"


def test_the_simulated_backend_on_a_dataset_says_once_it_is_not_a_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run(lambda: run_eval(config(), items(6), eval_id="sim", runs_dir=tmp_path))
    said = [r for r in caplog.records if r.name == "lanefold.simulated"]
    assert len(said) == 1 and "test double, not a model" in said[0].getMessage()
    caplog.clear()
    listed = config(backend={"answers": {f"Question number {i}?": "391" for i in range(6)}})
    run(lambda: run_eval(listed, items(6), eval_id="listed", runs_dir=tmp_path))
    assert not [r for r in caplog.records if r.name == "lanefold.simulated"]


def test_cli_prints_the_summary_table_or_its_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sim.toml").write_text(
        '[loop]\nk = 2\nseed = 1\n[backend]\nkind = "simulated"\naccuracy = 0.7\n'
    )
    write_jsonl(tmp_path / "q.jsonl", [{"q": f"Q{i}?", "a": "391"} for i in range(5)])
    code = eval_cli(
        "sim.toml",
        "--dataset",
        "q.jsonl",
        "--question-field",
        "q",
        "--answer-field",
        "a",
        "--eval-id",
        "t",
        "--json",
    )
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["eval_id"] == "t" and summary["n"] == 5
    assert summary == json.loads((tmp_path / "runs" / "t" / "summary.json").read_text())
    manifest = read_manifest("runs", "t")
    assert (manifest.dataset, manifest.question_field, manifest.scorer) == ("q.jsonl", "q", "exact")
    assert eval_cli("--resume", "t") == 0  # nothing left: the table again
    out = capsys.readouterr().out
    assert "eval t" in out and "accuracy" in out and "95% CI" in out
    assert (
        eval_cli(
            "sim.toml",
            "--dataset",
            "q.jsonl",
            "--question-field",
            "q",
            "--answer-field",
            "a",
            "--limit",
            "2",
            "--json",
        )
        == 0
    )
    made = json.loads(capsys.readouterr().out)["eval_id"]
    assert made != "t" and (tmp_path / "runs" / made / "eval.json").is_file()


def test_progress_counts_done_accuracy_and_spend() -> None:
    out = io.StringIO()
    row = QuestionResult(
        index=0,
        run_id="e-0",
        question="q",
        answer="1",
        gold="1",
        correct=True,
        score=1.0,
        status="answered",
        lanes=1,
        tokens={},
        cost=0.5,
        seconds=0.1,
    )
    with EvalProgress(Console(file=out, force_terminal=True, width=120)) as progress:
        progress.start(3, [row])
        progress.add(row.model_copy(update={"index": 1, "correct": False}))
    assert (progress.done, progress.correct, progress.spend) == (2, 1, 1.0)


@pytest.mark.slow
def test_a_humaneval_eval_scores_by_the_tests_and_hands_them_to_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lanefold.evaluate._packaged import load_humaneval

    problems = load_humaneval()[:3]
    script = [
        {
            "purpose": "sample",
            "match": f"def {p.meta['entry_point']}\\(",
            "output": f"```python\n{p.meta['prompt']}{p.meta['canonical_solution']}```",
        }
        for p in problems[:2]
    ]  # the third gets the simulated number: fails its tests
    cfg = config(
        k=2,
        loop={"reducer": "any_pass"},
        prompt={"template": "{question}"},
        extract={"regex": r"(?s)(.+)"},
        backend={"script": script, "accuracy": 1.0},
    )
    summary = run(lambda: run_eval(cfg, problems, eval_id="he", runs_dir=tmp_path))
    assert summary.scorer == "humaneval:10"
    rows = read_results(tmp_path / "he" / "results.jsonl")
    assert [rows[i].correct for i in range(3)] == [True, True, False]
    assert rows[2].status == "no_answer"  # any_pass ran the tests: no lane passed
    assert summary.pass_at_k == {"1": pytest.approx(2 / 3), "2": pytest.approx(2 / 3)}


# -- interrupts and crashes (subprocesses) ----------------------------------------------------

ORCHESTRATOR = [sys.executable, "-m", "orchestrator"]


def _slow_eval(tmp: Path, questions: int) -> list[str]:
    (tmp / "slow.toml").write_text(
        '[loop]\nk = 4\nseed = 5\n[backend]\nkind = "simulated"\naccuracy = 0.7\n'
        f'latency_ms = [20, 60]\ncall_log = "{tmp / "calls.log"}"\n'
    )
    write_jsonl(tmp / "q.jsonl", [{"question": f"Question {i}?", "answer": "391"} for i in range(questions)])
    return [
        "eval",
        str(tmp / "slow.toml"),
        "--dataset",
        str(tmp / "q.jsonl"),
        "--eval-id",
        "e",
        "--runs-dir",
        str(tmp / "runs"),
        "--concurrency",
        "4",
        "--json",
    ]


def _wait_for_rows(process: subprocess.Popen[bytes], results: Path, count: int) -> None:
    deadline = time.monotonic() + 60  # a guard against a hang, not an assertion on timing
    while time.monotonic() < deadline and process.poll() is None:
        if results.exists() and results.read_bytes().count(b"\n") >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"the eval did not record {count} rows: {process.poll()}")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_resume_after_sigkill_skips_finished_questions_and_finishes_the_rest(tmp_path: Path) -> None:
    argv = ORCHESTRATOR + _slow_eval(tmp_path, 80)
    results = tmp_path / "runs" / "e" / "results.jsonl"
    process = subprocess.Popen(
        argv, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _wait_for_rows(process, results, 8)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    finished = read_results(results)
    assert 8 <= len(finished) < 80
    logs = {i: (tmp_path / "runs" / f"e.{i}" / "events.jsonl").read_bytes() for i in finished}
    calls_before = (tmp_path / "calls.log").read_text().count("\n")

    resume = ["eval", "--resume", "e", "--runs-dir", str(tmp_path / "runs"), "--json"]
    done = subprocess.run(
        [*ORCHESTRATOR, *resume], cwd=tmp_path, env=_env(), capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["n"] == 80
    rows = read_results(results)
    assert sorted(rows) == list(range(80))
    assert len(results.read_text().splitlines()) == 80  # one row each, no torn line
    for index, log in logs.items():  # finished runs were read, not run again
        assert (tmp_path / "runs" / f"e.{index}" / "events.jsonl").read_bytes() == log
        assert rows[index] == finished[index]
    calls_after = (tmp_path / "calls.log").read_text().count("\n")
    assert calls_after - calls_before <= 4 * (80 - len(finished))


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_a_resume_hint(tmp_path: Path) -> None:
    argv = ORCHESTRATOR + _slow_eval(tmp_path, 80)
    results = tmp_path / "runs" / "e" / "results.jsonl"
    process = subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for_rows(process, results, 4)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert out == b""
    assert err.decode().splitlines()[-1] == (
        f"orchestrator eval: interrupted by SIGINT; continue with: orchestrator eval --resume e "
        f"--runs-dir {tmp_path / 'runs'}"
    )
    interrupted = [
        path
        for path in (tmp_path / "runs").glob("e.*/events.jsonl")
        if b'"run.interrupted"' in path.read_bytes()
    ]
    finished = read_results(results)
    assert all(int(path.parent.name.split(".")[1]) not in finished for path in interrupted)
    assert eval_cli("--resume", "e", "--runs-dir", str(tmp_path / "runs"), "--json") == 0
    assert sorted(read_results(results)) == list(range(80))
