"""The run's writer lock in one process: the holder's pid in a loser's error, read however
late it lands; the `lock` file gone after a clean release and kept after a death; and one
writer per run kept when the file is removed under a contender.

The process-level contention (two resumes racing, a SIGKILL) is in tests/cli/test_writer_lock.py.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lanefold.primitives import RunInUseError
from lanefold.primitives.events import WaveBarrier, WaveBarrierData
from lanefold.stores.files import JsonlEventLog, RunLock


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(proc.stdout)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A run folder whose `lock` file another descriptor holds the flock on, as a writer
    that won it but has not written its pid yet (the file is empty)."""
    folder = tmp_path / "r"
    folder.mkdir()
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    yield folder, fd
    os.close(fd)


def writes_after(fd: int, reads: int, content: bytes) -> Callable[[float], None]:
    """A `sleep` for `acquire` that lets the holder's pid land after `reads` failed reads."""
    calls = []

    def sleep(_: float) -> None:
        calls.append(1)
        if len(calls) == reads:
            os.pwrite(fd, content, 0)
            os.ftruncate(fd, len(content))

    return sleep


def test_a_second_writer_names_the_holders_pid(tmp_path: Path) -> None:
    lock = RunLock.acquire(tmp_path / "r", "r")
    try:
        with pytest.raises(
            RunInUseError,
            match=rf"^run r is being written by another process "
            rf"\(pid {os.getpid()}\)$",
        ) as caught:
            RunLock.acquire(tmp_path / "r", "r")
        assert caught.value.pid == os.getpid()
    finally:
        lock.release()


def test_a_loser_that_reads_an_empty_file_waits_for_the_pid(held: tuple[Path, int]) -> None:
    folder, fd = held
    with pytest.raises(RunInUseError, match=rf"\(pid {os.getpid()}\)$"):
        RunLock.acquire(folder, "r", sleep=writes_after(fd, 3, f"{os.getpid()}\n".encode()))


def test_a_dead_writers_pid_is_never_named(held: tuple[Path, int]) -> None:
    # A writer taking over from a killed one holds the flock before it overwrites the dead pid.
    folder, fd = held
    os.pwrite(fd, f"{dead_pid()}\n".encode(), 0)
    with pytest.raises(RunInUseError, match=rf"\(pid {os.getpid()}\)$"):
        RunLock.acquire(folder, "r", sleep=writes_after(fd, 5, f"{os.getpid()}\n".encode()))


@pytest.mark.parametrize("content", [b"", b"123", b"not a pid\n", "{pid}\n"])
def test_no_live_pid_after_the_rereads_says_pid_unknown(held: tuple[Path, int], content: bytes | str) -> None:
    folder, fd = held
    # A half-written pid (no newline) is not read as a pid; neither is a dead one.
    os.pwrite(fd, content.format(pid=dead_pid()).encode() if isinstance(content, str) else content, 0)
    naps: list[float] = []
    with pytest.raises(
        RunInUseError,
        match=r"^run r is being written by another process "
        r"\(pid unknown\)$",
    ) as caught:
        RunLock.acquire(folder, "r", sleep=naps.append)
    assert caught.value.pid is None
    assert 0 < len(naps) <= 100 and set(naps) == {0.01}  # bounded: about a second at most


def test_a_new_holder_writes_its_pid_over_a_longer_one_and_cuts_the_rest(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "lock").write_text("99999999999\nleft over\n")  # a dead writer's file
    lock = RunLock.acquire(folder, "r")
    assert (folder / "lock").read_text() == f"{os.getpid()}\n"
    lock.release()


def test_release_removes_the_lock_file_and_the_id_is_free_again(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    lock = RunLock.acquire(folder, "r")
    assert (folder / "lock").read_text() == f"{os.getpid()}\n"
    lock.release()
    lock.release()  # twice is harmless
    assert list(folder.iterdir()) == []
    RunLock.acquire(folder, "r").release()
    assert list(folder.iterdir()) == []


def test_a_contender_that_locks_the_removed_file_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B opens the lock file, then A (the holder) releases: the file is removed and its flock
    # dropped. B's flock now succeeds on a file that is no longer the run's lock; meanwhile C
    # takes the run's (new) lock file. B must notice and be refused by C, not write beside it.
    folder = tmp_path / "r"
    a = RunLock.acquire(folder, "r")
    c: list[RunLock] = []
    real_flock = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        if not c:
            c.append(a)  # once only: C's own acquire below takes the real path
            a.release()
            c.append(RunLock.acquire(folder, "r"))
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(RunInUseError, match=rf"\(pid {os.getpid()}\)$"):
        RunLock.acquire(folder, "r")  # B
    monkeypatch.undo()
    assert (folder / "lock").exists()  # C's, untouched by B
    c[1].release()
    assert not (folder / "lock").exists()


def test_a_contender_whose_file_went_with_no_new_holder_takes_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "r"
    a = RunLock.acquire(folder, "r")
    real_flock = fcntl.flock
    released: list[bool] = []

    def flock(fd: int, operation: int) -> None:
        if not released:
            released.append(True)
            a.release()  # gone between B's open and B's flock
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    b = RunLock.acquire(folder, "r")
    monkeypatch.undo()
    with pytest.raises(RunInUseError):  # B holds the file now at the path
        RunLock.acquire(folder, "r")
    assert b.path.read_text() == f"{os.getpid()}\n"
    b.release()
    assert list(folder.iterdir()) == []


def started(run_id: str) -> WaveBarrier:
    return WaveBarrier(
        id=f"{run_id}:1",
        source="test",
        time=datetime.now(UTC),
        sequence=1,
        run_id=run_id,
        wave=1,
        data=WaveBarrierData(completed=[0], failed=[]),
    )


def test_closing_a_log_removes_the_lock_file(tmp_path: Path) -> None:
    path = tmp_path / "r" / "events.jsonl"
    log = JsonlEventLog.create(path)
    assert (tmp_path / "r" / "lock").exists()
    log.append(started("r"))
    log.close()
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["events.jsonl"]
    resumed = JsonlEventLog.open_for_resume(path)
    assert (tmp_path / "r" / "lock").exists()
    resumed.close()
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["events.jsonl"]


def test_a_refused_create_removes_the_lock_it_took(tmp_path: Path) -> None:
    path = tmp_path / "r" / "events.jsonl"
    log = JsonlEventLog.create(path)
    log.append(started("r"))
    log.close()
    with pytest.raises(Exception, match="already exists"):
        JsonlEventLog.create(path)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["events.jsonl"]


def test_a_writer_that_dies_leaves_the_file_and_the_next_takes_it_over(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    code = (
        "import sys; from pathlib import Path; from lanefold.stores.files import RunLock;"
        "RunLock.acquire(Path(sys.argv[1]), 'r'); import os; os._exit(0)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder)], check=True, cwd=Path(__file__).resolve().parents[2]
    )
    assert proc.returncode == 0
    assert (folder / "lock").read_text().strip().isdigit()  # a death leaves the file...
    lock = RunLock.acquire(folder, "r")  # ...and no lock
    assert (folder / "lock").read_text() == f"{os.getpid()}\n"
    lock.release()
