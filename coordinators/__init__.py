"""The loops and reducers, each registered by name. A loop receives a LoopContext (and so the
governed dispatch path); none builds a backend itself."""

from __future__ import annotations

from coordinators._audit import audit
from coordinators._parallel_sample import ParallelSample, ParallelSampleParams, outcome_of
from coordinators._reducers import (
    AnyPass,
    JudgeArgmax,
    MajorityVote,
    UniversalSelfConsistency,
    WeightedVote,
    vote,
)

__all__ = (
    "AnyPass",
    "JudgeArgmax",
    "MajorityVote",
    "ParallelSample",
    "ParallelSampleParams",
    "UniversalSelfConsistency",
    "WeightedVote",
    "audit",
    "outcome_of",
    "vote",
)
