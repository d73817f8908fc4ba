"""SIGINT and SIGTERM at every moment of the command's life, in real processes with real signals.

Each process is held at a named moment by the command's test hook (`LANEFOLD_TEST_PAUSE=
<moment>:<gate>`: it creates `<gate>.reached`, then waits for `<gate>`), signalled there, then let
go; nothing here waits on a clock. Before anything is recorded, a signal ends the command with
130 or 143 and at most one line, never a traceback; once the record is complete (the run's
`run.completed` written, or the command's end decided) a signal changes nothing: the process
exits with the run's own code (0, 4 for no answer), where it used to be killed by the signal.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIMULATED = '[loop]\nk = 4\n[backend]\nkind = "simulated"\nlatency_ms = [1, 5]\n'
NO_ANSWER = SIMULATED + '[extract]\nregex = "NEVER(\\\\d+)"\n'  # every lane abstains: exit 4
SIGNALS = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143)}


SCRIPT = shutil.which("orchestrator", path=str(Path(sys.executable).parent))
ENTRIES = {
    "python -m orchestrator.cli._main": [sys.executable, "-m", "lanefold"],
    "python -m orchestrator": [sys.executable, "-m", "orchestrator"],
}
if SCRIPT is not None:  # the console script, as installed
    ENTRIES["the orchestrator script"] = [SCRIPT]


def held(entry: list[str], moment: str, argv: list[str], tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    """The command started and held at `moment`, and the gate that lets it go on."""
    gate = tmp / f"gate-{moment}"
    env = {
        **os.environ,
        "LANEFOLD_TEST_PAUSE": f"{moment}:{gate}",
        "PYTHONPATH": str(ROOT),
    }  # this checkout, whichever way the command is started
    proc = subprocess.Popen(
        [*entry, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120  # a hang guard only
    while not Path(f"{gate}.reached").exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the command ended before {moment}: {proc.returncode} {err}")
        assert time.monotonic() < deadline, f"the command never reached {moment}"
        time.sleep(0.005)
    return proc, gate


def signalled(
    entry: list[str], moment: str, argv: list[str], tmp: Path, signum: signal.Signals
) -> tuple[int, str, str]:
    """Hold the command at `moment`, signal it, let it go; its exit code, stdout, stderr."""
    proc, gate = held(entry, moment, argv, tmp)
    proc.send_signal(signum)
    gate.touch()  # a command the signal ended never looks; one it ignored goes on from here
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES.values(), ids=ENTRIES.keys())
@pytest.mark.parametrize("moment", ["import", "start", "command"])
@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_while_the_command_starts_exits_quietly(
    entry: list[str], moment: str, name: str, tmp_path: Path
) -> None:
    # "import": the command's modules half imported (pydantic, anyio, the store); "start":
    # main() entered, arguments not read; "command": the run's config about to be read.
    config = tmp_path / "loop.toml"
    config.write_text(SIMULATED)
    signum, code = SIGNALS[name]
    returncode, out, err = signalled(
        entry,
        moment,
        ["run", str(config), "--question", "q?", "--runs-dir", str(tmp_path / "r")],
        tmp_path,
        signum,
    )
    assert (returncode, out, err) == (code, "", "")
    assert not (tmp_path / "r").exists()  # nothing was created


@pytest.mark.slow
@pytest.mark.parametrize("name", SIGNALS)
@pytest.mark.parametrize(
    ("moment", "text", "code"),
    [
        pytest.param(moment, text, code, id=f"{moment}-exit-{code}")
        for moment in ("recorded", "end")
        for text, code in ((SIMULATED, 0), (NO_ANSWER, 4))
    ],
)
def test_a_signal_after_the_record_is_complete_leaves_the_runs_own_exit_code(
    moment: str, text: str, code: int, name: str, tmp_path: Path
) -> None:
    # "recorded": run.completed written, the session still closing; "end": the command done,
    # the process on its way out. The signal used to kill the process (rc -2, -15).
    config = tmp_path / "loop.toml"
    config.write_text(text)
    returncode, out, err = signalled(
        ENTRIES["python -m orchestrator.cli._main"],
        moment,
        [
            "run",
            str(config),
            "--question",
            "q?",
            "--runs-dir",
            str(tmp_path / "r"),
            "--run-id",
            "done",
            "--json",
        ],
        tmp_path,
        SIGNALS[name][0],
    )
    assert (returncode, err) == (code, "")
    result = json.loads(out)
    assert result["status"] == ("answered" if code == 0 else "no_answer")
    last = (tmp_path / "r" / "done" / "events.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["type"] == "run.completed"


@pytest.mark.slow
@pytest.mark.parametrize("name", SIGNALS)
def test_a_signal_after_a_resumed_record_is_complete_leaves_exit_0(name: str, tmp_path: Path) -> None:
    config = tmp_path / "loop.toml"
    config.write_text(SIMULATED.replace("[1, 5]", "[200, 600]"))
    runs, log = tmp_path / "r", tmp_path / "r" / "again" / "events.jsonl"
    # A run interrupted once a lane has landed, then resumed: resume writes run.completed.
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lanefold",
            "run",
            str(config),
            "--question",
            "q?",
            "--runs-dir",
            str(runs),
            "--run-id",
            "again",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120  # a hang guard only
    while not (log.exists() and '"lane.completed"' in log.read_text()):
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.005)
    first.send_signal(signal.SIGINT)
    first.communicate(timeout=120)
    assert first.returncode == 130
    returncode, out, err = signalled(
        ENTRIES["python -m orchestrator.cli._main"],
        "recorded",
        ["resume", "again", "--runs-dir", str(runs), "--json"],
        tmp_path,
        SIGNALS[name][0],
    )
    assert (returncode, err) == (0, "")
    assert json.loads(out)["run_id"] == "again"
    assert json.loads(log.read_text().splitlines()[-1])["type"] == "run.completed"


def test_importing_orchestrator_runs_none_of_its_modules() -> None:
    # The facade resolves its names on first use: the command's imports all happen where the
    # command answers a Ctrl-C (orchestrator.cli._main), none before it.
    code = (
        "import sys, orchestrator; "
        "print(sorted(m for m in sys.modules if m.startswith(('orchestrator.', 'pydantic', "
        "'primitives', 'anyio'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    # ... and every public name is still there, found on first use.
    import lanefold

    assert all(getattr(lanefold, name) is not None for name in lanefold.__all__)
    assert set(lanefold.__all__) <= set(dir(lanefold))
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = lanefold.no_such_name  # type: ignore[attr-defined]
