"""An eval on a disk that fills up: the machine's failure is never a question's result.

The disk is real: a small tmpfs the test mounts (as root; skipped with a line where mounting
is refused), filled ahead of time so the eval runs out of room at several points of its work.
Each time: one line, exit 1, `results.jsonl` holds only questions that finished, and once the
space is freed `eval --resume` gives the accuracy of the same eval run on a roomy disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SIZE = 1 << 20  # the tmpfs: 1 MiB
QUESTIONS = 12
CONFIG = """
[loop]
k = 4
seed = 3
max_concurrency = 4

[prompt]
template = "{{question}}"

[backend]
kind = "simulated"
accuracy = 0.6
distractors = ["1", "2"]
answers = {answers}
"""


def cli(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [sys.executable, "-m", "lanefold", *argv],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs at `tmp_path/disk`, unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs was refused: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(QUESTIONS)]
    (work / "q.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    answers = "{" + ", ".join(f'"{r["question"]}" = "{r["answer"]}"' for r in rows) + "}"
    (work / "loop.toml").write_text(CONFIG.format(answers=answers))
    return work


def evaluate(folder: Path, runs: Path) -> subprocess.CompletedProcess[str]:
    return cli(
        folder,
        "eval",
        "loop.toml",
        "--dataset",
        "q.jsonl",
        "--eval-id",
        "ev",
        "--runs-dir",
        str(runs),
        "--concurrency",
        "3",
        "--json",
    )


def used(mount: Path) -> int:
    stat = os.statvfs(mount)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def correct(runs: Path) -> dict[int, bool]:
    lines = (runs / "ev" / "results.jsonl").read_text().splitlines()
    return {row["index"]: row["correct"] for row in map(json.loads, lines)}


@pytest.mark.parametrize("level", [0.3, 0.55, 0.8, 0.97])
def test_a_full_disk_stops_the_eval_in_one_line_and_resume_gives_the_same_accuracy(
    level: float, disk: Path, folder: Path, tmp_path: Path
) -> None:
    roomy = evaluate(folder, tmp_path / "roomy")
    assert roomy.returncode == 0, roomy.stderr
    expected = json.loads(roomy.stdout)
    first = evaluate(folder, disk / "runs")  # what the whole eval takes on this disk
    assert first.returncode == 0, first.stderr
    needs = used(disk)
    shutil.rmtree(disk / "runs")

    # Fill the disk so only `level` of what the eval needs is left, then run it.
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (SIZE - used(disk) - int(needs * level)))
    stopped = evaluate(folder, disk / "runs")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    lines = [line for line in stopped.stderr.splitlines() if not line.startswith("WARNING ")]
    assert len(lines) == 1 and "Traceback" not in stopped.stderr, stopped.stderr
    assert os.strerror(28) in lines[0]  # ENOSPC: "No space left on device"
    assert lines[0].endswith(f"continue with: orchestrator eval --resume ev --runs-dir {disk / 'runs'}")
    results = disk / "runs" / "ev" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    assert all(row["status"] != "failed" for row in rows), "no machine failure as a result"
    assert len(rows) < QUESTIONS

    filler.unlink()
    resumed = cli(folder, "eval", "--resume", "ev", "--runs-dir", str(disk / "runs"), "--json")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert (summary["n"], summary["correct"], summary["failed"]) == (QUESTIONS, expected["correct"], 0)
    assert correct(disk / "runs") == correct(tmp_path / "roomy"), "question for question"
