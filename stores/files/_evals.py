"""An eval's record as files, in its folder beside its questions' run folders:

    runs/<eval_id>/eval.json       the manifest, written first
    runs/<eval_id>/results.jsonl   one row per question, appended as each finishes
    runs/<eval_id>/results.csv     the same rows, flat, rewritten when the eval ends
    runs/<eval_id>/summary.json    the summary

One writer per eval by the run lock (`RunLock`) on the folder.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from lanefold.primitives import ConfigError, LogWriteError, validate_run_id
from lanefold.stores.files._log import RunLock

__all__ = ("FileEvalRecord",)

R = TypeVar("R")


class FileEvalRecord:
    """The files of one eval: `root/<eval_id>/` and what it holds."""

    def __init__(self, root: str | Path, eval_id: str) -> None:
        self.eval_id = eval_id
        self.folder = Path(root) / validate_run_id(eval_id)
        self.manifest = self.folder / "eval.json"
        self.results = self.folder / "results.jsonl"
        self.csv = self.folder / "results.csv"
        self.summary = self.folder / "summary.json"

    @classmethod
    def of_results(cls, path: Path) -> FileEvalRecord:
        """The record whose rows are the file `path` (a `results.jsonl` read as it is)."""
        record = cls(path.parent.parent, path.parent.name)
        record.results = path
        return record

    @property
    def location(self) -> str:
        return str(self.folder)

    @property
    def manifest_location(self) -> str:
        return str(self.manifest)

    @property
    def results_location(self) -> str:
        return str(self.results)

    def exists(self) -> bool:
        return self.manifest.is_file()

    def is_run(self) -> bool:
        return (self.folder / "events.jsonl").exists()

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        lock = RunLock.acquire(self.folder, self.eval_id)  # creates the folder
        try:
            yield
        finally:
            lock.release()

    def running(self) -> bool:
        return RunLock.holder(self.folder) is not None

    def read_manifest(self) -> bytes | None:
        return _read(self.manifest)

    def write_manifest(self, body: bytes) -> None:
        _replace(self.manifest, body)

    def read_summary(self) -> bytes | None:
        return _read(self.summary)

    def write_summary(self, body: bytes, *, table: str) -> None:
        _replace(self.csv, table.encode())
        _replace(self.summary, body)

    def read_rows(self, parse: Callable[[bytes], R], *, repair: bool = False) -> list[R]:
        path = self.results
        data = _read(path)
        if data is None:
            return []
        lines = data.split(b"\n")
        rows: list[R] = []
        offset = 0
        for number, line in enumerate(lines, start=1):
            last = number == len(lines)
            if line.strip():
                try:
                    row = parse(line)
                except ValueError as exc:
                    if last:  # no newline after it: the append was cut short
                        if repair:  # a torn tail: cut it, as resume cuts an event log's
                            with _writing(path, "cut its torn last line"), path.open("r+b") as fh:
                                fh.truncate(offset)
                        break
                    raise ConfigError(f"{path}:{number}: not a result row: {exc}") from None
                if last and repair:  # whole, but its newline never landed
                    with _writing(path, "end its last line"), path.open("ab") as fh:
                        fh.write(b"\n")
                rows.append(row)
            offset += len(line) + 1
        return rows

    def append_row(self, body: bytes) -> None:
        """One write (O_APPEND), so a crash leaves whole rows and at most a torn last one."""
        line = body + b"\n"
        path = self.results
        with _writing(path, "append"):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                written = os.write(fd, line)
                if written != len(line):  # a full disk may take part of it: cut it, refuse
                    os.ftruncate(fd, os.fstat(fd).st_size - written)
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            finally:
                os.close(fd)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


@contextlib.contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Every write of an eval's files fails the same way: one line, LogWriteError (exit 1),
    the machine's failure and never a question's."""
    try:
        yield
    except OSError as exc:
        raise LogWriteError(f"{path}: cannot {what}: {exc.strerror or exc}") from None


def _replace(path: Path, data: bytes) -> None:
    """Written beside, then renamed: whole or not at all."""
    draft = path.with_name(f".{path.name}.new")
    with _writing(path, "write"):
        try:
            draft.write_bytes(data)
            os.replace(draft, path)
        finally:
            draft.unlink(missing_ok=True)
