"""I/O faults: a full disk, a log that cannot be written or read, a question that cannot be encoded.

Each ends with one line on stderr and no traceback: exit 2 for a log that cannot be used,
exit 1 for a run that fails on I/O mid-way. Nothing recorded is lost (a full disk leaves at
most a torn last line, which resume cuts off), and a run id is never left unusable (the log
appears with its `run.started` line or not at all).

The full disk is real where it can be: a subprocess under a file-size limit (RLIMIT_FSIZE,
SIGXFSZ ignored) gets a short write and then EFBIG, as a filling disk gives a short write and
then ENOSPC. Permission errors are injected in-process: these tests run as root, whom file
modes do not stop (the real chmod test runs only for other users).
"""

from __future__ import annotations

import errno
import io
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_support import Outcome, cli

import lanefold
from lanefold.stores.files import JsonlEventLog

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "simulated.toml"  # 8 lanes: a log of about 12 kB
QUESTION = "What is 17 * 23?"


def command(*argv: str | bytes | Path, fsize: int | None = None) -> Outcome:
    """The `orchestrator` command in a subprocess, under a file-size limit if `fsize` is given."""

    def limit() -> None:
        assert fsize is not None
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not death, past the limit
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    done = subprocess.run(
        [sys.executable, "-m", "lanefold", *(a if isinstance(a, bytes) else str(a) for a in argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        preexec_fn=limit if fsize is not None else None,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def run_args(runs: Path, run_id: str) -> list[str | Path]:
    return ["run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", run_id]


def log_of(runs: Path, run_id: str) -> Path:
    return runs / run_id / "events.jsonl"


def check_repaired(log: Path, before: bytes) -> list[dict[str, Any]]:
    """After a resume: nothing recorded was lost, the torn tail (if any) was cut and recorded,
    sequences run 1..n and the run completed."""
    whole = before[: before.rfind(b"\n") + 1]
    torn = len(before) - len(whole)
    after = log.read_bytes()
    assert after.startswith(whole), "a line recorded before the fault was lost or changed"
    events = [json.loads(line) for line in after.splitlines()]
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "run.completed"
    resumed = [e["data"] for e in events if e["type"] == "run.resumed"]
    assert len(resumed) == 1
    assert resumed[0]["torn_tail_bytes"] == torn
    assert resumed[0]["torn_tail_line"] == (whole.count(b"\n") + 1 if torn else None)
    return events


# -- a full disk, as a real process sees it ---------------------------------------------------------


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[bytes]]:
    """An unlimited run of the example: its result and its log's lines (to place the limits)."""
    runs = tmp_path_factory.mktemp("baseline")
    done = command(*run_args(runs, "base"), "--json")
    assert done.code == 0, done.err
    return json.loads(done.out), log_of(runs, "base").read_bytes().splitlines(keepends=True)


@pytest.mark.slow
@pytest.mark.parametrize("torn_at", ["second", "middle", "last"])
def test_a_full_disk_mid_run_exits_1_in_one_line_and_resume_repairs_it(
    torn_at: str, baseline: tuple[dict[str, Any], list[bytes]], tmp_path: Path
) -> None:
    result, lines = baseline
    index = {"second": 1, "middle": len(lines) // 2, "last": len(lines) - 1}[torn_at]
    limit = sum(map(len, lines[:index])) + len(lines[index]) // 2  # halfway through that line
    runs = tmp_path / "runs"
    failed = command(*run_args(runs, "full"), "--json", fsize=limit)
    log = log_of(runs, "full")
    assert failed.code == 1, failed.err
    assert str(log) in failed.error_line
    assert failed.out == ""
    before = log.read_bytes()
    assert 0 < len(before) <= limit
    assert before.count(b"\n") == index, "the log must end where the limit fell"
    events = list(JsonlEventLog(log).read())  # every complete line parses
    assert [e.sequence for e in events] == list(range(1, index + 1))
    assert events[0].type == "run.started" and events[-1].type != "run.completed"

    resumed = command("resume", "full", "--runs-dir", runs, "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.err == ""
    again = json.loads(resumed.out)
    assert (again["answer"], again["votes"]) == (result["answer"], result["votes"])
    check_repaired(log, before)


@pytest.mark.slow
@pytest.mark.parametrize("limit", [0, 200])  # 0: not even the lock's pid fits
def test_a_disk_too_full_for_the_first_line_leaves_no_run(limit: int, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    failed = command(*run_args(runs, "tiny"), fsize=limit)
    assert failed.code in (1, 2), failed.err
    assert str(log_of(runs, "tiny")) in failed.error_line
    folder = runs / "tiny"
    assert not folder.exists() or {p.name for p in folder.iterdir()} <= {"lock"}, "no log, not even a draft"
    again = command(*run_args(runs, "tiny"), "--json")  # the run id is still free
    assert again.code == 0, again.err


def test_a_disk_that_fills_mid_write_in_process_exits_1_and_resume_repairs_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk fills halfway through the log's 6th line: a short write, then ENOSPC.
    real_write, lines_begun = os.write, []

    def write(fd: int, data: bytes) -> int:
        if bytes(data).startswith(b'{"specversion"'):
            lines_begun.append(fd)
            if len(lines_begun) == 6:
                return real_write(fd, data[: len(data) // 2])
        if len(lines_begun) >= 6 and fd == lines_begun[5]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    runs = tmp_path / "runs"
    monkeypatch.setattr(os, "write", write)
    failed = cli(capsys, *run_args(runs, "enospc"))
    monkeypatch.undo()
    assert failed.code == 1
    assert os.strerror(errno.ENOSPC) in failed.error_line
    log = log_of(runs, "enospc")
    before = log.read_bytes()
    assert before.count(b"\n") == 5 and not before.endswith(b"\n")
    assert cli(capsys, "resume", "enospc", "--runs-dir", runs).code == 0
    check_repaired(log, before)


# -- logs that cannot be written or read ------------------------------------------------------------


def deny(monkeypatch: pytest.MonkeyPatch, target: Path, code: int, *, writing: bool) -> None:
    """Make opening `target` (for writing, or for reading) fail with `code`, as the OS would."""

    def refused(path: Any, flags: int | str) -> bool:
        if not isinstance(path, str | bytes | os.PathLike):
            return False  # a file descriptor (os.fdopen): not a path we deny
        wants_write = (
            flags & (os.O_WRONLY | os.O_RDWR) if isinstance(flags, int) else any(c in flags for c in "wax+")
        )
        return Path(os.fsdecode(path)).resolve() == target.resolve() and (bool(wants_write) == writing)

    def guard(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, flags: Any = "r", *args: Any, **kwargs: Any) -> Any:
            if refused(path, flags):
                raise OSError(code, os.strerror(code), os.fsdecode(path))
            return real(path, flags, *args, **kwargs)

        return call

    monkeypatch.setattr(os, "open", guard(os.open))
    monkeypatch.setattr(io, "open", guard(io.open))  # what Path.open and Path.read_bytes call


@pytest.fixture
def unfinished(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A run killed halfway: 12 whole lines, then half of the 13th. Returns its log."""
    runs = tmp_path / "runs"
    assert cli(capsys, *run_args(runs, "half")).code == 0
    log = log_of(runs, "half")
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:12]) + lines[12][: len(lines[12]) // 2])
    return log


@pytest.mark.parametrize("code", [errno.EACCES, errno.EROFS])
def test_resume_of_a_log_that_cannot_be_written_exits_2_and_changes_nothing(
    code: int, unfinished: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    before = unfinished.read_bytes()
    deny(monkeypatch, unfinished, code, writing=True)
    refused = cli(capsys, "resume", "half", "--runs-dir", unfinished.parents[1])
    monkeypatch.undo()
    assert refused.code == 2
    assert str(unfinished) in refused.error_line and os.strerror(code) in refused.error_line
    assert refused.out == ""
    assert unfinished.read_bytes() == before, "a refused resume must not cut the torn tail"
    assert cli(capsys, "resume", "half", "--runs-dir", unfinished.parents[1]).code == 0
    check_repaired(unfinished, before)


@pytest.mark.parametrize("argv", [["show"], ["tail"], ["tail", "--follow", "--wait", "5"]])
def test_show_and_tail_of_an_unreadable_log_exit_2(
    argv: list[str], unfinished: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    deny(monkeypatch, unfinished, errno.EACCES, writing=False)
    refused = cli(capsys, argv[0], "half", "--runs-dir", unfinished.parents[1], *argv[1:])
    assert refused.code == 2
    assert str(unfinished) in refused.error_line
    assert refused.out == ""


def test_a_runs_dir_that_cannot_be_created_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    under_a_file = cli(capsys, *run_args(blocker / "runs", "r1"))
    assert under_a_file.code == 2
    assert str(blocker) in under_a_file.error_line and under_a_file.out == ""
    assert blocker.read_text() == "not a folder"

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))

    monkeypatch.setattr(os, "mkdir", mkdir)
    denied = cli(capsys, *run_args(tmp_path / "runs", "r1"))
    monkeypatch.undo()
    assert denied.code == 2
    assert os.strerror(errno.EACCES) in denied.error_line and denied.out == ""
    assert not (tmp_path / "runs").exists()


def test_a_log_that_cannot_be_created_leaves_the_run_id_usable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    deny(monkeypatch, runs / "r1" / ".events.jsonl.new", errno.EROFS, writing=True)
    refused = cli(capsys, *run_args(runs, "r1"))
    monkeypatch.undo()
    assert refused.code == 2
    assert os.strerror(errno.EROFS) in refused.error_line and refused.out == ""
    assert not log_of(runs, "r1").exists()
    assert cli(capsys, *run_args(runs, "r1")).code == 0


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file modes: chmod cannot deny it")
def test_a_read_only_log_by_its_mode(unfinished: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = unfinished.read_bytes()
    unfinished.chmod(0o444)
    try:
        refused = cli(capsys, "resume", "half", "--runs-dir", unfinished.parents[1])
        unfinished.chmod(0o000)
        shown = cli(capsys, "show", "half", "--runs-dir", unfinished.parents[1])
    finally:
        unfinished.chmod(0o644)
    assert refused.code == 2 and str(unfinished) in refused.error_line
    assert shown.code == 2 and str(unfinished) in shown.error_line
    assert unfinished.read_bytes() == before


# -- a question that cannot be encoded --------------------------------------------------------------


def test_a_question_with_a_lone_surrogate_is_refused_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    refused = cli(
        capsys, "run", EXAMPLE, "--question", "What is \ud800?", "--runs-dir", runs, "--run-id", "bad"
    )
    assert refused.code == 2
    assert "question" in refused.error_line and refused.out == ""
    assert not runs.exists()
    config = lanefold.load_config(EXAMPLE)
    with pytest.raises(lanefold.ConfigError, match="question"):
        lanefold.run_sync(config, "\ud800", runs_dir=runs, run_id="bad")
    assert not runs.exists()


@pytest.mark.slow
def test_a_question_of_invalid_bytes_is_refused_in_a_real_process(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    refused = command("run", EXAMPLE, "--question", b"What is \xff?", "--runs-dir", runs)
    assert refused.code == 2
    assert "question" in refused.error_line and refused.out == ""
    assert not runs.exists()


JUDGED = """
[loop]
k = 4
seed = 1
reducer = "judge_argmax"
[judge]
template = "Score it: {candidate}"
[backend]
kind = "simulated"
"""


@pytest.fixture
def judged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, int]:
    """A finished judge_argmax run `j`, and how many lines one re-reduction of it writes."""
    config = tmp_path / "judged.toml"
    config.write_text(JUDGED)
    runs = tmp_path / "runs"
    assert (
        cli(capsys, "run", str(config), "--question", QUESTION, "--runs-dir", runs, "--run-id", "j").code == 0
    )
    log = log_of(runs, "j")
    before = log.read_bytes().count(b"\n")
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "j").mkdir()
    (probe / "j" / "events.jsonl").write_bytes(log.read_bytes())
    assert cli(capsys, "reduce", "j", "--reducer", "judge_argmax", "--runs-dir", probe).code == 0
    return runs, log_of(probe, "j").read_bytes().count(b"\n") - before


def test_a_reduce_that_meets_a_full_disk_exits_1_in_one_line_at_every_write(
    judged: tuple[Path, int], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The disk fills at each line a re-reduction writes in turn (its start, its judge wave's
    # lanes, its end): one line, exit 1, nothing recorded lost, and the same command, with room
    # again, finishes that reduction.
    runs, writes = judged
    log = log_of(runs, "j")
    pristine = log.read_bytes()
    real_write = os.write
    for nth in range(1, writes + 1):
        log.write_bytes(pristine)
        begun = [0]

        def write(fd: int, data: bytes, nth: int = nth, begun: list[int] = begun) -> int:
            if bytes(data).startswith(b'{"specversion"'):
                begun[0] += 1
                if begun[0] >= nth:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", write)
        failed = cli(capsys, "reduce", "j", "--reducer", "judge_argmax", "--runs-dir", runs)
        monkeypatch.undo()
        assert failed.code == 1, (nth, failed.err)
        assert failed.err.count("\n") == 1 and os.strerror(errno.ENOSPC) in failed.error_line
        assert log.read_bytes().startswith(pristine), "nothing recorded is lost"
        again = cli(capsys, "reduce", "j", "--reducer", "judge_argmax", "--runs-dir", runs)
        assert again.code == 0, (nth, again.err)
        reductions = [
            json.loads(line)["data"]["reduction"]
            for line in log.read_text().splitlines()
            if '"reduce.completed"' in line
        ]
        assert reductions == [1, 2], "the cut-off reduction was finished, not opened anew"
