"""The run store: where runs live on disk (`./runs/<run_id>/events.jsonl` by default)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path

from coordinators import ParallelSampleParams, audit
from orchestrator._config import LoopConfig, recorded_config
from primitives import (
    AnyEvent,
    ConfigError,
    JsonlEventLog,
    LogCorruptError,
    RunNotFoundError,
    RunState,
    fold,
    validate_run_id,
)

__all__ = ("RunStore", "fold_record")


def fold_record(events: list[AnyEvent], source: str, run_id: str) -> tuple[RunState, LoopConfig]:
    """A run's state and recorded config from its events, every claim checked.

    Refuses (LogCorruptError, exit 2) a line that is not the run's own or a claim that does
    not follow from the log (an answer, the reduce, the result), and (ConfigError) a
    recorded config this version cannot validate. The config comes from `run.started`, so
    the log is folded once, at the config's prices.
    """
    head = fold(events[:1], source=source, run_id=run_id)
    if head.started is None:
        raise ConfigError(f"{source}: the log has no run.started event")
    config = recorded_config(head, source)
    state = fold(events, config.pricing, source=source, run_id=run_id)
    wrong = None
    params = config.loop_params
    if isinstance(params, ParallelSampleParams) and params.weighting != "verifier":
        wrong = audit(state, extract=config.extract, tie_break=params.tie_break,
                      weighting=params.weighting, seed=config.loop.seed)
    if wrong is not None:
        raise LogCorruptError(source, *wrong)
    return state, config


class RunStore:
    """A folder of runs, one subfolder per run id."""

    def __init__(self, root: str | Path = "runs") -> None:
        self.root = Path(root)

    def new_id(self) -> str:
        """A sortable, unique, plain run id: UTC time plus random hex."""
        return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)

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

    def read(self, run_id: str) -> tuple[list[AnyEvent], RunState, LoopConfig]:
        """A run's events, its state and the config it recorded (`fold_record`); no lock."""
        path = self.existing(run_id)
        events = list(JsonlEventLog(path).read())
        return (events, *fold_record(events, str(path), run_id))

    def read_state(self, run_id: str) -> RunState:
        """`read`'s state alone."""
        return self.read(run_id)[1]
