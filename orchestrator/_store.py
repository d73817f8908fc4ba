"""The run store: where runs live. Files on disk (`./runs/<run_id>/events.jsonl`) by default;
a PostgreSQL database (`orchestrator/_pgstore.py`) when `[store] url` or `--store` names one.

Every command reaches a run through the `Store` seam, never a path, so both stores keep one
contract: one writer per run, sequence strictly increasing, the same refusals on read.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from lanefold._config import LoopConfig, recorded_config
from lanefold.coordinators import ParallelSampleParams, audit, configured_reducer
from lanefold.primitives import (
    AnyEvent,
    ConfigError,
    EventLog,
    FsyncPolicy,
    JsonlEventLog,
    LogCorruptError,
    Pricing,
    RunNotFoundError,
    RunState,
    fold,
    plugin_folders,
    validate_run_id,
    without_plugin_imports,
)

__all__ = ("RunStore", "Store", "fold_readable", "fold_record", "new_run_id", "open_store")


class Store(Protocol):
    """Where runs live: the one way the orchestrator opens, reads and follows a run's log."""

    def new_id(self) -> str: ...

    def check_id(self, run_id: str) -> str: ...

    def create_log(self, run_id: str, fsync: FsyncPolicy = "barrier") -> EventLog:
        """A new run's log, holding the run's writer lock until closed."""
        ...

    def open_for_resume(self, run_id: str) -> EventLog:
        """An existing run's log to append to (RunInUseError while another writer holds it)."""
        ...

    def reader(self, run_id: str) -> EventLog:
        """The run's log to read or follow, without a lock."""
        ...

    def exists(self, run_id: str) -> bool: ...

    def read(self, run_id: str) -> tuple[list[AnyEvent], RunState, LoopConfig | None]:
        """A run's events, state and recorded config (`fold_readable`); no lock, no plug-in
        imported."""
        ...

    def read_state(self, run_id: str) -> RunState: ...

    def location(self, run_id: str) -> str:
        """Where the run's log is, for messages (never holds a password)."""
        ...

    @property
    def describe(self) -> str:
        """The store itself, for messages and for the `--store`/`--runs-dir` a hint repeats."""
        ...


def new_run_id() -> str:
    """A sortable, unique, plain run id: UTC time plus random hex."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def open_store(url: str | None, runs_dir: str | Path = "runs",
               password_env: str | None = None) -> Store:
    """The store a command or Session writes to: `url` a `postgresql://` URL (its password
    from the environment variable `password_env`, if named), else files under `runs_dir`."""
    if url is None:
        return RunStore(runs_dir)
    from lanefold._pgstore import PgStore

    return PgStore.from_url(url, password_env=password_env)


def fold_record(events: list[AnyEvent], source: str, run_id: str) -> tuple[RunState, LoopConfig]:
    """A run's state and recorded config from its events, every claim checked.

    Refuses (LogCorruptError, exit 2) a line that is not the run's own or a claim that does
    not follow from the log (an answer, a bill, the reducer, the reduce, the result), naming
    the first such line, and (ConfigError) a recorded config this version cannot validate.
    The config comes from `run.started`, so the log is folded once, at the config's prices
    and with the reducer it names.
    """
    head = fold(events[:1], source=source, run_id=run_id)
    if head.started is None:
        raise ConfigError(f"{source}: the log has no run.started event")
    config = recorded_config(head, source)
    with plugin_folders(config.folder):
        reducer = configured_reducer(config.loop_params)
    try:
        state = fold(events, config.pricing, source=source, run_id=run_id, reducer=reducer)
    except LogCorruptError as refused:
        # A claim the loop's audit refuses on an earlier line is the first wrong line (an
        # edited answer, say, that the result repeats further down).
        before = fold(events[:refused.line - 1], config.pricing, source=source, run_id=run_id,
                      reducer=reducer)
        wrong = _audit(before, config)
        if wrong is not None and wrong[0] < refused.line:
            raise LogCorruptError(source, *wrong) from None
        raise
    wrong = _audit(state, config)
    if wrong is not None:
        raise LogCorruptError(source, *wrong)
    return state, config


def _audit(state: RunState, config: LoopConfig) -> tuple[int, str] | None:
    """What only the loop knows: a parallel-sample log's answers, reduce and result."""
    params = config.loop_params
    if isinstance(params, ParallelSampleParams) and params.weighting != "verifier":
        return audit(state, extract=config.extract, tie_break=params.tie_break,
                     weighting=params.weighting, seed=config.loop.seed)
    return None


def fold_readable(events: list[AnyEvent], source: str,
                  run_id: str) -> tuple[RunState, LoopConfig | None]:
    """`fold_record` for a reader (`tail`, `show`), which imports no plug-in: where the
    recorded config names a `module:attr` not imported here, the events are folded at the
    recorded prices, every line still checked as the run's own, and the config is None."""
    with without_plugin_imports() as skipped:
        try:
            return fold_record(events, source, run_id)
        except ConfigError:
            if not skipped:
                raise
    started = fold(events[:1], source=source, run_id=run_id).started
    assert started is not None  # fold_record refused a log without one
    try:
        pricing = Pricing.model_validate(started.config.get("pricing", {}))
    except ValidationError as exc:
        raise ConfigError(f"{source}:1: recorded config: pricing: "
                          f"{exc.errors()[0]['msg']}") from None
    return fold(events, pricing, source=source, run_id=run_id), None


class RunStore:
    """A folder of runs, one subfolder per run id."""

    def __init__(self, root: str | Path = "runs") -> None:
        self.root = Path(root)

    def new_id(self) -> str:
        """A sortable, unique, plain run id: UTC time plus random hex."""
        return new_run_id()

    def check_id(self, run_id: str) -> str:
        return validate_run_id(run_id)

    def events_path(self, run_id: str) -> Path:
        return self.root / validate_run_id(run_id) / "events.jsonl"

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

    def read(self, run_id: str) -> tuple[list[AnyEvent], RunState, LoopConfig | None]:
        """A run's events, its state and the config it recorded (`fold_readable`); no lock."""
        path = self.existing(run_id)
        events = list(JsonlEventLog(path).read())
        return (events, *fold_readable(events, str(path), run_id))

    def read_state(self, run_id: str) -> RunState:
        """`read`'s state alone."""
        return self.read(run_id)[1]
