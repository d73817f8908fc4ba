"""Runs as files: a folder per run under a root (`./runs/<run_id>/events.jsonl`), the
embedded default; named budgets and gateway keys beside them (`./runs/.budgets/`, `./runs/.keys/`)."""

from __future__ import annotations

import contextlib
import os
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from lanefold.primitives import (
    AnyEvent,
    BudgetView,
    ConfigError,
    FsyncPolicy,
    KeyRecord,
    RateVerdict,
    RunNotFoundError,
    RunSummary,
    StoredKey,
    new_run_id,
    parse_event,
    register_store,
    select_runs,
    summarize_run,
    validate_run_id,
)
from lanefold.stores.files._budget import _KEEP, FileBudgets
from lanefold.stores.files._budget_pool import FileSharedPool
from lanefold.stores.files._evals import FileEvalRecord
from lanefold.stores.files._keys import FileKeys
from lanefold.stores.files._log import JsonlEventLog, RunLock

__all__ = ("RunStore",)

_ENDED = frozenset({"answered", "no_answer", "failed"})  # statuses a writer's lock cannot change
_TAIL_BYTES = 1 << 16  # read back from the end for the last line; a longer one reads more


@register_store("files")
class RunStore:
    """A folder of runs, one subfolder per run id: the store opened without a URL."""

    schemes: ClassVar[tuple[str, ...]] = ()  # no URL: `runs_dir`

    def __init__(self, root: str | Path = "runs") -> None:
        self.root = Path(root)
        # Summaries of ended runs by run id, with the (size, mtime) of the log they were read
        # from: a second `list_runs` (the view's pages, every second) stats an ended run's log
        # instead of reading it. A run that is appended to again (resumed) is read again.
        self._ended: dict[str, tuple[tuple[int, int], RunSummary]] = {}
        self._budgets: FileBudgets | None = None  # made at first use, not pickled (`__getstate__`)
        self._keys: FileKeys | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process starts from: the folder, not this process's keys'
        uses in flight (a lock) nor its summaries."""
        return {**self.__dict__, "_ended": {}, "_budgets": None, "_keys": None}

    @classmethod
    def from_url(
        cls, url: str | None, *, runs_dir: str | Path = "runs", password_env: str | None = None
    ) -> RunStore:
        """The folder `runs_dir`; this store serves no URL."""
        if url is not None:
            raise ConfigError("store.url: the files store takes no URL (runs_dir names its folder)")
        return cls(runs_dir)

    def portable(self) -> RunStore:
        """The same store for a worker in another directory: the folder made absolute."""
        return RunStore(self.root.resolve())

    def new_id(self) -> str:
        """A sortable, unique, plain run id: UTC time plus random hex."""
        return new_run_id()

    def check_id(self, run_id: str) -> str:
        return validate_run_id(run_id)

    def events_path(self, run_id: str) -> Path:
        return self.root / validate_run_id(run_id) / "events.jsonl"

    def writing(self, run_id: str) -> bool:
        return RunLock.holder(self.root / validate_run_id(run_id)) is not None

    def existing(self, run_id: str) -> Path:
        """The log of a run that must exist (resume, show)."""
        path = self.events_path(run_id)
        if not path.is_file():
            raise RunNotFoundError(f"{path}: no run {run_id!r} in {self.root}")
        return path

    def create_log(self, run_id: str, fsync: FsyncPolicy = "barrier") -> JsonlEventLog:
        return JsonlEventLog.create(self.events_path(run_id), fsync=fsync)

    def open_for_resume(self, run_id: str) -> JsonlEventLog:
        return JsonlEventLog.open_for_resume(self.existing(run_id), fsync="barrier")

    def reader(self, run_id: str) -> JsonlEventLog:
        return JsonlEventLog(self.events_path(run_id))

    def exists(self, run_id: str) -> bool:
        return self.events_path(run_id).is_file()

    def location(self, run_id: str) -> str:
        return str(self.events_path(run_id))

    @property
    def describe(self) -> str:
        return str(self.root)

    def eval_record(self, eval_id: str) -> FileEvalRecord:
        return FileEvalRecord(self.root, eval_id)

    def list_evals(self) -> list[str]:
        found = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(self.root):
                folder = Path(entry.path)
                manifest = folder / "eval.json"
                if manifest.is_file() and not (folder / "events.jsonl").exists():
                    with contextlib.suppress(OSError):
                        found.append((manifest.stat().st_mtime_ns, entry.name))
        return [name for _, name in sorted(found, reverse=True)]

    def missing(self) -> list[str]:
        return []

    # -- named budgets (BudgetStore) -------------------------------------------------------------

    @property
    def budgets(self) -> FileBudgets:
        if self._budgets is None:
            self._budgets = FileBudgets(self.root)
        return self._budgets

    async def open_shared_pool(self, name: str, run_id: str) -> FileSharedPool:
        return await FileSharedPool.open(self.budgets, name, run_id)

    def read_budget(self, name: str) -> BudgetView | None:
        return self.budgets.read_budget(name)

    def set_budget(
        self,
        name: str,
        *,
        max_tokens: int | None = _KEEP,
        max_cost_usd: float | None = _KEEP,
        max_requests: int | None = _KEEP,
    ) -> BudgetView:
        """Create the budget or change its limits (a limit not given keeps its value)."""
        return self.budgets.set_budget(
            name, max_tokens=max_tokens, max_cost_usd=max_cost_usd, max_requests=max_requests
        )

    def start_budget(self, name: str, spent: tuple[int, float, int]) -> BudgetView:
        return self.budgets.start_budget(name, spent)

    def note_refusal(self, name: str) -> None:
        self.budgets.note_refusal(name)

    # -- gateway keys (KeyStore) -----------------------------------------------------------------

    @property
    def keys(self) -> FileKeys:
        """The folder's keys: one object for the store's life, so that a key's use being recorded
        is seen by this process's other admissions (`UsesInFlight`)."""
        if self._keys is None:
            self._keys = FileKeys(self.root)
        return self._keys

    def create_key(self, record: KeyRecord) -> StoredKey:
        return self.keys.create_key(record)

    def replace_key(self, record: KeyRecord) -> StoredKey:
        return self.keys.replace_key(record)

    def read_key(self, name: str) -> StoredKey | None:
        return self.keys.read_key(name)

    def list_keys(self) -> list[StoredKey]:
        return self.keys.list_keys()

    def take_key_rate(self, name: str, tokens: int, requests: int, now: float) -> RateVerdict | None:
        return self.keys.take_key_rate(name, tokens, requests, now)

    def give_key_rate(self, name: str, tokens: int, now: float) -> None:
        self.keys.give_key_rate(name, tokens, now)

    def list_runs(
        self,
        *,
        status: str | None = None,
        loop: str | None = None,
        eval_id: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        model: str | None = None,
        caller: str | None = None,
        question: str | None = None,
        answer: str | None = None,
        until: datetime | None = None,
    ) -> list[RunSummary]:
        found = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for entry in os.scandir(self.root):
                if eval_id is not None and not entry.name.startswith(eval_id + "."):
                    continue
                summary = self._summary(entry.name, Path(entry.path))
                if summary is not None:
                    found.append(summary)
        return select_runs(
            found,
            status=status,
            loop=loop,
            eval_id=eval_id,
            since=since,
            limit=limit,
            model=model,
            caller=caller,
            question=question,
            answer=answer,
            until=until,
        )

    def _summary(self, run_id: str, folder: Path) -> RunSummary | None:
        try:
            stat = os.stat(folder / "events.jsonl")
        except OSError:
            return None
        seen = (stat.st_size, stat.st_mtime_ns)
        cached = self._ended.get(run_id)
        if cached is not None and cached[0] == seen:
            return cached[1]
        summary = _summary(folder)
        if summary is not None and summary.status in _ENDED:  # its lock no longer matters
            self._ended[run_id] = (seen, summary)
        return summary


def _summary(folder: Path) -> RunSummary | None:
    """A run folder's summary from its first and last whole lines; None for a folder that is
    not a readable run's (`show` names what is wrong with it)."""
    try:
        with (folder / "events.jsonl").open("rb") as f:
            first = f.readline()
            size = f.seek(0, os.SEEK_END)
            back = _TAIL_BYTES
            while True:
                f.seek(max(size - back, 0))
                lines = f.read().split(b"\n")
                whole = [line for line in lines[:-1] if line.strip()]  # a torn tail is no line
                if whole and (len(lines) > 2 or back >= size):
                    break
                if back >= size:
                    return None
                back *= 4
        head, tail = _event(first), _event(whole[-1])
    except (OSError, ValueError):
        return None
    if head is None or tail is None:
        return None
    return summarize_run(head, tail, writing=RunLock.holder(folder) is not None)


def _event(line: bytes) -> AnyEvent | None:
    try:
        return parse_event(line)
    except ValueError:
        return None
