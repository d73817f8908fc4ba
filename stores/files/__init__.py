"""Runs as files (the embedded default): `runs/<run_id>/events.jsonl`, one writer per run by an
OS lock that dies with its process; named budgets beside them, in `runs/.budgets/`."""

from lanefold.stores.files._budget import FileBudgets
from lanefold.stores.files._budget_pool import FileSharedPool
from lanefold.stores.files._evals import FileEvalRecord
from lanefold.stores.files._keys import FileKeys
from lanefold.stores.files._log import JsonlEventLog, RunLock
from lanefold.stores.files._store import RunStore

__all__ = (
    "FileBudgets",
    "FileEvalRecord",
    "FileKeys",
    "FileSharedPool",
    "JsonlEventLog",
    "RunLock",
    "RunStore",
)
