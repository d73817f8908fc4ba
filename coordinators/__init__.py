"""The loops. Each receives a Dispatcher (and so a Backend); none builds a backend itself."""

from __future__ import annotations

from coordinators._audit import audit
from coordinators._parallel_sample import LoopOutcome, ParallelSample, Verifier

__all__ = ("LoopOutcome", "ParallelSample", "Verifier", "audit")
