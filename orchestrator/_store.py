"""The run store: where runs live on disk (`./runs/<run_id>/events.jsonl` by default)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path

from coordinators import audit
from orchestrator._config import LoopConfig, recorded_config
from primitives import (
    ConfigError,
    JsonlEventLog,
    LogCorruptError,
    RunNotFoundError,
    RunState,
    fold,
    validate_run_id,
)

__all__ = ("RunStore", "check_claims")


def check_claims(state: RunState, config: LoopConfig, source: str) -> None:
    """Refuse a log whose answers, reduce or result do not follow from it, naming the line."""
    wrong = audit(state, extract=config.extract, tie_break=config.loop.tie_break,
                  weighting=config.loop.weighting, seed=config.loop.seed)
    if wrong is not None:
        raise LogCorruptError(source, *wrong)


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

    def read(self, run_id: str) -> tuple[RunState, LoopConfig]:
        """A run's state folded from its log, and the config it recorded; no lock is taken.

        Refuses (LogCorruptError, exit 2) a log with a bad line or a line that is not the
        run's own, and (ConfigError) a recorded config this version cannot validate.
        """
        path = self.existing(run_id)
        events = list(JsonlEventLog(path).read())
        state = fold(events, source=str(path), run_id=run_id)
        if state.started is None:
            raise ConfigError(f"{path}: the log has no run.started event")
        config = recorded_config(state, str(path))
        if config.pricing != state.pricing:
            state = fold(events, config.pricing, source=str(path), run_id=run_id)
        check_claims(state, config, str(path))
        return state, config

    def read_state(self, run_id: str) -> RunState:
        """`read` without the config."""
        return self.read(run_id)[0]
