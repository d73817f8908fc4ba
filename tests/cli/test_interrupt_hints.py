"""Every interrupt hint is a command that finishes what was interrupted, run as printed.

Each command is started in a real process on the slow simulated backend, sent SIGINT once its
log shows work under way, and the line it prints ("... continue with: <command>") is run as
is, from the same folder: it must exit 0 and leave the work finished.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

SLOW = """
[loop]
k = 6
max_concurrency = 2
seed = 4
{extra}
[backend]
kind = "simulated"
latency_ms = [150, 300]
lanes_per_request = 1
"""
JUDGED = 'reducer = "judge_argmax"\n[judge]\ntemplate = "Score it: {candidate}"\n'


def cli(folder: Path, *argv: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "lanefold", *argv],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def count(path: Path, marker: str) -> int:
    return path.read_text().count(marker) if path.exists() else 0


def interrupt(proc: subprocess.Popen[str], ready: Callable[[], bool]) -> str:
    """SIGINT once `ready()`; the command the process says continues its work."""
    deadline = time.monotonic() + 120  # a bound on a hang, not a measured time
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the work never got under way"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    # One line from the command (the simulated backend may warn once that it is no model).
    [line] = [line for line in err.splitlines() if not line.startswith("WARNING ")]
    assert "Traceback" not in err
    head, _, hint = line.partition("; continue with: ")
    assert head.endswith("interrupted by SIGINT") and hint, line
    return hint


def finish(folder: Path, hint: str) -> str:
    """Run the hint exactly as printed (`orchestrator` is the console script)."""
    words = shlex.split(hint)
    assert words[0] == "orchestrator"
    proc = cli(folder, *words[1:])
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "slow.toml").write_text(SLOW.format(extra=""))
    (tmp_path / "judged.toml").write_text(SLOW.format(extra=JUDGED))
    (tmp_path / "q.jsonl").write_text(
        "".join(
            json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(6)
        )
    )
    return tmp_path


def test_run_and_resume_hints_finish_the_run(folder: Path) -> None:
    runs = folder / "my runs"  # a space: the hint must quote it
    log = runs / "r" / "events.jsonl"
    hint = interrupt(
        cli(folder, "run", "slow.toml", "--question", "17*23?", "--runs-dir", str(runs), "--run-id", "r"),
        lambda: count(log, '"lane.completed"') >= 1,
    )
    assert hint == f"orchestrator resume r --runs-dir '{runs}'"
    before = count(log, '"lane.completed"')
    again = interrupt(cli(folder, *shlex.split(hint)[1:]), lambda: count(log, '"lane.completed"') > before)
    assert again == hint, "a resume interrupted says the same"
    finish(folder, again)
    assert json.loads(log.read_text().splitlines()[-1])["type"] == "run.completed"


def test_a_reduce_hint_finishes_the_reduction_not_a_resume(folder: Path) -> None:
    assert finish(folder, "orchestrator run judged.toml --question 17*23? --run-id j")
    log = folder / "runs" / "j" / "events.jsonl"
    judged = count(log, '"judge.completed"') + count(log, '"lane.completed"')
    hint = interrupt(
        cli(folder, "reduce", "j", "--reducer", "judge_argmax", "--extract", "last_number"),
        lambda: count(log, '"lane.completed"') + count(log, '"judge.completed"') > judged + 1,
    )
    assert hint == "orchestrator reduce j --reducer judge_argmax --extract last_number"
    finish(folder, hint)
    reductions = [json.loads(line) for line in log.read_text().splitlines() if '"reduce.completed"' in line]
    assert [r["data"]["reduction"] for r in reductions] == [1, 2], "the cut-off one finished"


def test_eval_and_compare_hints_finish_them(folder: Path) -> None:
    results = folder / "runs" / "e" / "results.jsonl"
    hint = interrupt(
        cli(folder, "eval", "slow.toml", "--dataset", "q.jsonl", "--eval-id", "e", "--concurrency", "2"),
        lambda: count(results, '"index"') >= 1,
    )
    assert hint == "orchestrator eval --resume e"
    assert json.loads(finish(folder, hint + " --json"))["n"] == 6

    compared = folder / "runs"
    hint = interrupt(
        cli(
            folder,
            "compare",
            "slow.toml",
            "judged.toml",
            "--dataset",
            "q.jsonl",
            "--limit",
            "3",
            "--concurrency",
            "2",
        ),
        lambda: any(count(p, '"index"') >= 1 for p in compared.glob("*-slow/results.jsonl")),
    )
    words = shlex.split(hint)
    assert words[:3] == ["orchestrator", "compare", "slow.toml"] and "--compare-id" in words
    finish(folder, hint)
    compare_id = words[words.index("--compare-id") + 1]
    assert (compared / compare_id / "compare.json").is_file()
