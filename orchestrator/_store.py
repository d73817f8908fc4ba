"""The run store: where runs live on disk (`./runs/<run_id>/events.jsonl` by default)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path

from primitives import RunNotFoundError
from primitives._eventlog import validate_run_id

__all__ = ("RunStore",)


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
