"""`bench/evidence/report.py`, the evidence page's tables: exact McNemar with Holm's correction
stated, greedy as one lane at its real spend, pool points said and not tested, a budget a loop
cannot use said instead of a figure, the fit record kept beside the page; on the simulated
backend, so every figure is fixed by its seeds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from lanefold.evaluate import Item, run_eval, run_sweep

ROOT = Path(__file__).resolve().parent.parent
TAIL = '[backend]\nkind = "simulated"\naccuracy = 0.6\ndistractors = ["381"]\n[log]\nfsync = "never"\n'


def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "evidence_report", ROOT / "bench" / "evidence" / "report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def items(n: int) -> list[Item]:
    return [Item(i, f"Question number {i}?", "391") for i in range(n)]


def test_the_sweep_table_tests_real_runs_exactly_with_holm_and_keeps_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    greedy = tmp_path / "greedy.toml"
    greedy.write_text("[loop]\nk = 1\nseed = 2\n[sampling]\ntemperature = 0\n" + TAIL)
    vote = tmp_path / "vote.toml"
    vote.write_text("[loop]\nk = 3\nseed = 2\n" + TAIL)
    debate = tmp_path / "debate.toml"
    debate.write_text('[loop]\ncoordinator = "debate"\nagents = 3\nrounds = 1\nseed = 2\n' + TAIL)
    runs = tmp_path / "runs"

    async def go() -> None:
        await run_sweep(
            [str(greedy), str(vote), str(debate)],
            items(40),
            sweep_id="ev",
            budgets=[300, 900],
            runs_dir=runs,
            plot=False,
        )

    anyio.run(go)
    kept = tmp_path / "kept"
    kept.mkdir()
    report().sweep(runs, "ev", "--keep", str(kept))
    out = capsys.readouterr().out
    assert "greedy (greedy): " in out and "at 112.0 tokens paid a question, one lane" in out
    assert "never fitted" in out
    assert "McNemar's exact test" in out and "Holm-adjusted across 2 tests (holm)" in out
    assert "read from a pool: not a run, not tested" in out  # vote at 300, from its 900 pool
    assert "cannot run at this budget" in out  # debate at 300: no rebuttal round
    written = json.loads((kept / "ev.sweep.json").read_text())
    assert written == json.loads((runs / "ev" / "sweep.json").read_text())
    fit = written["configs"][0]["points"][1]["fit"]
    assert (
        fit["pilot"]["eval_id"] == "ev-vote.pilot" and fit["keys"]["k"] == 16
    )  # 17 would be two requests: 2 x 64 + 17 x 48 > 900


def test_the_humaneval_table_tests_the_whole_pool_against_greedy_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = tmp_path / "pool.toml"
    pool.write_text("[loop]\nk = 4\nseed = 5\n" + TAIL)
    greedy = tmp_path / "greedy.toml"
    greedy.write_text("[loop]\nk = 1\nseed = 5\n[sampling]\ntemperature = 0\n" + TAIL)
    runs = tmp_path / "runs"

    async def go() -> None:
        await run_eval(str(pool), items(30), eval_id="pool", runs_dir=runs)
        await run_eval(str(greedy), items(30), eval_id="greedy", runs_dir=runs)

    anyio.run(go)
    report().humaneval(runs, "pool", "greedy")
    out = capsys.readouterr().out
    assert "at k = 4 against greedy, McNemar's exact test, Holm-adjusted across 2 tests:" in out
    assert "majority " in out and "best-of-k " in out and "paired: p = " in out
