"""The embedded default log: JSON Lines on disk (`runs/<run_id>/events.jsonl`), one writer per
run by an OS lock that dies with its process.

Appends write a whole line in one `write`; the fsync policy decides when the line is forced to
disk: every append (`always`), at barriers and run end (`barrier`), or never. A `sync` may run
in a worker thread while appends go on (the recorder awaits it there): it forces what was
written before it began, and one that finds nothing new since the last forces nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio

from lanefold.primitives import (
    END_TYPES,
    AnyEvent,
    ConfigError,
    Event,
    FsyncPolicy,
    LogCorruptError,
    LogWriteError,
    RunInUseError,
    RunNotFoundError,
    TornTail,
    check_next_sequence,
    os_failure,
    read_event,
)

__all__ = ("JsonlEventLog", "RunLock")

# How a losing writer waits for the holder's pid to appear: 100 reads, 10 ms apart.
_PID_READS = 100
_PID_PAUSE_S = 0.01


class RunLock:
    """The one writer's lock on a run: `flock` on the `lock` file in the run's folder.

    The OS releases it when the process dies, so a SIGKILL never leaves a stale lock (the file
    stays, holding the dead pid, and the next writer takes it over). The holder's pid is written
    in the file for the error a second writer gets. A holder that gives the lock back (`release`)
    removes the file while it still holds the flock, so a run folder keeps no `lock` after its
    writer is done; a contender that opened the file just before it went notices (the inode it
    locked is no longer the one at the path) and starts again.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def acquire(cls, folder: Path, run_id: str, *, sleep: Callable[[float], None] = time.sleep) -> RunLock:
        """Take the run's lock now or raise RunInUseError naming the holder's pid.

        Never waits for the lock itself. A holder writes its pid just after it wins the flock,
        so a loser that reads too early (an empty file, or the dead pid of a killed writer the
        holder is taking over from) re-reads, `_PID_READS` times at most `_PID_PAUSE_S` apart;
        if no live pid shows up it says `(pid unknown)`.
        """
        path = folder / "lock"
        for _ in range(_PID_READS):
            try:  # (again each time: a run refused before its first line takes its folder away)
                folder.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise os_failure(f"{folder}: cannot create the run folder", exc) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                current = _names(fd, path)
                holder = _holder(fd) if current else None
                os.close(fd)
                if holder is not None:
                    raise RunInUseError(run_id, holder) from None
                if current:  # its pid is not down yet: read again shortly
                    sleep(_PID_PAUSE_S)
                continue  # (else its holder removed it as it let go: try the new one)
            if not _names(fd, path):  # locked a file its holder removed as it let go: again
                os.close(fd)
                continue
            _write_pid(fd)
            return cls(fd, path)
        raise RunInUseError(run_id, None)

    @contextlib.contextmanager
    def kept_on_success(self, what: str) -> Iterator[None]:
        """Give the lock back if the block fails; an OSError becomes `ConfigError("what: ...")`."""
        try:
            yield
        except OSError as exc:
            self.release()
            raise os_failure(what, exc) from None
        except BaseException:
            self.release()
            raise

    @staticmethod
    def holder(folder: Path) -> int | None:
        """The live pid holding the lock on `folder`, read without locking (None: no writer,
        or one whose pid is not down yet). For readers that follow a writer's progress."""
        try:
            fd = os.open(folder / "lock", os.O_RDONLY)
        except OSError:
            return None
        try:
            return _holder(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the lock back and remove the `lock` file: the writer is done with the run
        (completed, failed, interrupted or refused). Only a process that dies leaves the file."""
        if self._fd is not None:
            # Removed while the flock is still held, so no other writer can be holding it now.
            with contextlib.suppress(OSError):
                if _names(self._fd, self.path):
                    os.unlink(self.path)
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _names(fd: int, path: Path) -> bool:
    """Whether `path` is still the file open as `fd` (not removed, not replaced)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _write_pid(fd: int) -> None:
    """Write this process's pid over the file's start, then cut what follows: the file never
    passes through empty, and its first line is always one whole pid."""
    line = f"{os.getpid()}\n".encode()
    # The pid only names the holder in a second writer's error; the flock is the lock. A full
    # disk (or a file-size limit) must not turn into a traceback here: the run goes on and
    # fails at its first append with one line, leaving no log behind.
    with contextlib.suppress(OSError):
        os.pwrite(fd, line, 0)
        os.ftruncate(fd, len(line))


def _holder(fd: int) -> int | None:
    """The pid on the lock file's first whole line, if that process is alive: a dead one's
    pid is what a killed writer left, about to be overwritten by the one taking over."""
    with contextlib.suppress(OSError):
        first, newline, _ = os.pread(fd, 64, 0).partition(b"\n")
        if newline and first.isdigit() and _alive(int(first)):
            return int(first)
    return None


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: it holds no locks any more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, alive
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True  # no /proc here: the signal said it exists
    return stat.rpartition(b")")[2].split()[:1] not in ([b"Z"], [b"X"])


class JsonlEventLog:
    """The embedded default: an append-only JSON Lines file per run.

    Use `create` for a new run and `open_for_resume` to continue one (which repairs a torn
    tail and refuses a log corrupt anywhere else); both hold the run's `RunLock` until `close`.
    `read`/`follow` only read and take no lock.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        fsync: FsyncPolicy = "barrier",
        _fd: int | None = None,
        _last: int = 0,
        torn_tail: TornTail | None = None,
        _lock: RunLock | None = None,
        _unpublished: Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._fd = _fd
        self._last = _last
        self.torn_tail = torn_tail
        self._lock = _lock
        self._unpublished = _unpublished  # a new log lives here until its first line is down
        self._broken: str | None = None
        self._cut_at: int | None = None
        self._synced = 0  # the last sequence a sync (or the first line's publish) forced down

    @property
    def location(self) -> str:
        return str(self.path)

    @classmethod
    def create(cls, path: Path, *, fsync: FsyncPolicy = "barrier") -> JsonlEventLog:
        """Start a new log; refuses to overwrite an existing one.

        The log appears at `path` with its first line or not at all: that line is written to
        a file beside it, forced to disk and renamed into place (under the run's lock).
        """
        lock = RunLock.acquire(path.parent, path.parent.name)
        with lock.kept_on_success(f"{path}: cannot create the run log"):
            if path.exists():
                raise ConfigError(f"{path}: a run with this id already exists")
            draft = path.with_name(f".{path.name}.new")
            fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        return cls(path, fsync=fsync, _fd=fd, _lock=lock, _unpublished=draft)

    @classmethod
    def open_for_resume(cls, path: Path, *, fsync: FsyncPolicy = "barrier") -> JsonlEventLog:
        """Open an existing log to append to it; a torn last line is cut off and reported.

        Takes the run's lock first (RunInUseError if another process writes the run), so
        nothing is touched while another writer is live.
        """
        if not path.is_file():
            raise RunNotFoundError(f"{path}: no event log for this run id")
        lock = RunLock.acquire(path.parent, path.parent.name)
        with lock.kept_on_success(f"{path}: cannot open the run log for writing"):
            data = path.read_bytes()
            last, good_end, torn = _scan(path, data)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        log = cls(path, fsync=fsync, _fd=fd, _last=last, torn_tail=torn, _lock=lock)
        log._cut_at = good_end if torn is not None else None  # the torn tail goes at the first write
        return log

    @property
    def last_sequence(self) -> int:
        return self._last

    def publishes(self, event: Event) -> bool:
        """Whether appending `event` forces the disk before the run appears: a new log's first
        line under `barrier` or `always` (the recorder then appends it in a worker thread)."""
        return self._unpublished is not None and self.fsync != "never"

    def append(self, event: Event) -> None:
        """Write one whole line. An I/O failure (disk full) raises LogWriteError and leaves at
        most a torn last line, which resume cuts off."""
        if self._fd is None:
            raise RuntimeError(f"{self.path}: log is not open for writing")
        if self._broken is not None:
            raise LogWriteError(self._broken)
        check_next_sequence(self._last, event)
        line = event.model_dump_json(by_alias=True).encode() + b"\n"
        try:
            if self._cut_at is not None:  # a refused resume changes nothing: cut only to write
                os.ftruncate(self._fd, self._cut_at)
                os.fsync(self._fd)
                self._cut_at = None
            # O_APPEND and one write: a reader never sees half of two lines.
            written = os.write(self._fd, line)
            while written < len(line):  # a short write (disk filling up): finish or fail
                written += os.write(self._fd, line[written:])
            if self.fsync == "always" or (self._unpublished is not None and self.fsync != "never"):
                os.fsync(self._fd)
                self._synced = event.sequence
            if self._unpublished is not None:
                os.rename(self._unpublished, self.path)
                self._unpublished = None
        except OSError as exc:
            self._broken = f"{self.path}: cannot append to the run log: {exc.strerror}"
            if self._unpublished is not None:  # the run never appeared: leave nothing behind
                with contextlib.suppress(OSError):
                    os.unlink(self._unpublished)
            raise LogWriteError(self._broken) from None
        self._last = event.sequence

    def sync(self) -> None:
        """A durability point (barrier, run end): fsync unless the policy is `never`."""
        # Read before forcing: a line appended meanwhile (another thread) may not be covered.
        last = self._last
        if self._fd is not None and self.fsync != "never" and self._broken is None and last > self._synced:
            try:
                os.fsync(self._fd)
                self._synced = max(self._synced, last)
            except OSError as exc:
                self._broken = f"{self.path}: cannot sync the run log: {exc.strerror}"
                raise LogWriteError(self._broken) from None

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        """Every complete event from `from_sequence` on; a partial last line is not yet an event."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            raise RunNotFoundError(f"{self.path}: no event log for this run id") from None
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the run log: {exc.strerror}") from None
        for _, event in _lines(self.path, data, tolerate_partial_tail=True):
            if event.sequence >= from_sequence:
                yield event

    async def follow(self, from_sequence: int = 1, *, poll_s: float = 0.05) -> AsyncIterator[AnyEvent]:
        """Yield events as they land; waits for the file to appear; ends after the run's end
        (completed, failed or interrupted).

        It reads on from the end of the last whole line each time, so a torn tail that a
        resume cuts off under it is never taken for a line.
        """
        # Another process creates the file: there is no in-process event to wait on.
        while not self.path.exists():  # noqa: ASYNC110
            await anyio.sleep(poll_s)
        offset, lineno, last = 0, 0, 0
        while True:
            try:
                with self.path.open("rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except OSError as exc:
                raise ConfigError(f"{self.path}: cannot read the run log: {exc.strerror}") from None
            whole = chunk.rfind(b"\n") + 1
            for raw in chunk[:whole].split(b"\n")[:-1]:
                lineno += 1
                event = _parse(self.path, lineno, raw)
                if event.sequence != last + 1:
                    raise LogCorruptError(str(self.path), lineno, f"sequence {event.sequence} after {last}")
                last = event.sequence
                if event.sequence >= from_sequence:
                    yield event
                if event.type in END_TYPES:
                    return
            offset += whole
            await anyio.sleep(poll_s)

    def close(self) -> None:
        """Force what was written to disk, stop writing and release the run's lock."""
        if self._fd is not None:
            with contextlib.suppress(LogWriteError):
                self.sync()
            os.close(self._fd)
            self._fd = None
        unpublished, self._unpublished = self._unpublished, None
        if unpublished is not None:  # closed before its first line: no run appears
            with contextlib.suppress(OSError):
                os.unlink(unpublished)
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if unpublished is not None:  # nor its folder (unless something else is in it)
            with contextlib.suppress(OSError):
                os.rmdir(self.path.parent)


def _parse(path: Path, lineno: int, raw: bytes) -> AnyEvent:
    return read_event(raw, str(path), lineno)


def _lines(path: Path, data: bytes, *, tolerate_partial_tail: bool) -> Iterator[tuple[int, AnyEvent]]:
    """(end offset, event) per complete line, checking sequence order."""
    start, lineno, last = 0, 0, 0
    while start < len(data):
        end = data.find(b"\n", start)
        if end == -1:
            if tolerate_partial_tail:
                return
            end = len(data)
        lineno += 1
        event = _parse(path, lineno, data[start:end])
        if event.sequence != last + 1:
            raise LogCorruptError(str(path), lineno, f"sequence {event.sequence} after {last}")
        last = event.sequence
        start = end + 1
        yield start, event


def _scan(path: Path, data: bytes) -> tuple[int, int, TornTail | None]:
    """Validate a whole log; return (last sequence, end of the good part, torn tail if any)."""
    torn: TornTail | None = None
    body = data
    if data and not data.endswith(b"\n"):
        # A last line without its newline is a write cut short: the crash we must survive.
        tail_start = data.rfind(b"\n") + 1
        body = data[:tail_start]
        torn = TornTail(line=body.count(b"\n") + 1, bytes=len(data) - tail_start)
    last = 0
    for _, event in _lines(path, body, tolerate_partial_tail=False):
        last = event.sequence
    return last, len(body), torn
