"""The loops, reducers and built-in verifiers, each registered by name. A loop receives a
LoopContext (and so the governed dispatch path); none builds a backend itself."""

from __future__ import annotations

from lanefold.coordinators._adaptive_sample import AdaptiveSample
from lanefold.coordinators._command_verifier import CommandVerifier, as_verifier
from lanefold.coordinators._configured import configured_reducer
from lanefold.coordinators._debate import Debate
from lanefold.coordinators._field_vote import FieldVote
from lanefold.coordinators._parallel_sample import ParallelSample, ParallelSampleParams, outcome_of
from lanefold.coordinators._plan_verify_replan import PlanRejectedError, PlanVerifyReplan
from lanefold.coordinators._reducers import (
    AnyPass,
    JudgeArgmax,
    MajorityVote,
    UniversalSelfConsistency,
    WeightedVote,
    vote,
)
from lanefold.coordinators._schema_valid import SchemaValid
from lanefold.coordinators._sequential_refine import SequentialRefine

__all__ = (
    "AdaptiveSample",
    "AnyPass",
    "CommandVerifier",
    "Debate",
    "FieldVote",
    "JudgeArgmax",
    "MajorityVote",
    "ParallelSample",
    "ParallelSampleParams",
    "PlanRejectedError",
    "PlanVerifyReplan",
    "SchemaValid",
    "SequentialRefine",
    "UniversalSelfConsistency",
    "WeightedVote",
    "as_verifier",
    "configured_reducer",
    "outcome_of",
    "vote",
)
