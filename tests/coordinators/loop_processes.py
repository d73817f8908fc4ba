"""`orchestrator` in a fresh process, for the tests that kill a loop's run and resume it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli(folder: Path, *args: str) -> subprocess.Popen[str]:
    """`orchestrator ARGS` started from `folder` (which `-m` puts on sys.path, so a plug-in
    beside a config is found); no bytecode cache, so an edited module is read as edited."""
    env = {
        **os.environ,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "lanefold", *args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def completed_in(log: Path, wave: int) -> int:
    """Lanes of `wave` the log holds as completed so far (a half-written last line skipped)."""
    if not log.exists():
        return 0
    count = 0
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the line being written
            continue
        count += event["type"] == "lane.completed" and event.get("wave") == wave
    return count
