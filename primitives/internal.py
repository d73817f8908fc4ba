"""The governed core the facade drives, not for extenders: it may change in any release.

A loop reaches all of it through its `LoopContext`; a backend, store, reducer or hook never needs
it. `lanefold.primitives` holds what extenders use.
"""

from __future__ import annotations

from lanefold.primitives._audit import run_extract
from lanefold.primitives._context import RunBudget, RunContext
from lanefold.primitives._dispatch import Dispatcher, WaveSpec, check_sendable
from lanefold.primitives._hooks import HookRunner
from lanefold.primitives._nesting import nests_deeper
from lanefold.primitives._record import Recorder
from lanefold.primitives._state import apply

__all__ = (
    "Dispatcher",
    "HookRunner",
    "Recorder",
    "RunBudget",
    "RunContext",
    "WaveSpec",
    "apply",
    "check_sendable",
    "nests_deeper",
    "run_extract",
)
