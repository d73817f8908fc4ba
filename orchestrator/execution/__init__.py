"""Running loops: the Session (one config, its backends loaded once, questions run through the
governed path), its sync twin, re-reduction, the executors that send questions to workers, the
store a command opens, and the result a run gives back.

The folder below the CLI and `evaluate`, above `config`: nothing here parses a command line or
scores a dataset.
"""

from __future__ import annotations

from lanefold.execution._executor import (
    Executor,
    Job,
    JobOutcome,
    WorkerSpec,
    import_paths,
    local,
    portable_hooks,
    resolve_executor,
)
from lanefold.execution._fleet_budget import budget_store
from lanefold.execution._job_session import JobSession
from lanefold.execution._ray_connect import CONNECT_TIMEOUT_S
from lanefold.execution._ray_executor import RayExecutor
from lanefold.execution._runner import build_backend, check_question, lanefold_error
from lanefold.execution._session import Session, resume, resume_sync, run, run_sync
from lanefold.execution._store import (
    Store,
    new_run_id,
    open_store,
    read_run,
    read_state,
    resume_command,
    run_record,
)
from lanefold.execution._sync_session import SyncSession
from lanefold.primitives import CostBreakdown, LaneResult, RunFailure, RunResult, UsageBreakdown

__all__ = (
    "CONNECT_TIMEOUT_S",
    "CostBreakdown",
    "Executor",
    "Job",
    "JobOutcome",
    "JobSession",
    "LaneResult",
    "RayExecutor",
    "RunFailure",
    "RunResult",
    "Session",
    "Store",
    "SyncSession",
    "UsageBreakdown",
    "WorkerSpec",
    "budget_store",
    "build_backend",
    "check_question",
    "import_paths",
    "lanefold_error",
    "local",
    "new_run_id",
    "open_store",
    "portable_hooks",
    "read_run",
    "read_state",
    "resolve_executor",
    "resume",
    "resume_command",
    "resume_sync",
    "run",
    "run_record",
    "run_sync",
)
