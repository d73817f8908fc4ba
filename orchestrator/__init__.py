"""lanefold's public facade: run and resume loops, load configs, read results and event logs.

    import orchestrator
    result = orchestrator.run_sync(orchestrator.load_config("loop.toml"), question="...")
"""

from __future__ import annotations

from orchestrator._config import LoopConfig, config_hash, load_config, parse_config
from orchestrator._result import CostBreakdown, LaneResult, RunResult, UsageBreakdown
from orchestrator._runner import build_backend, resume, resume_sync, run, run_sync
from orchestrator._store import RunStore
from primitives import (
    AnyEvent,
    Backend,
    BackendError,
    BudgetExhaustedError,
    ConfigError,
    EventLog,
    JsonlEventLog,
    LanefoldError,
    Limits,
    LogCorruptError,
    LogWriteError,
    MemoryEventLog,
    Pricing,
    QuorumNotMetError,
    RunError,
    RunInUseError,
    RunNotFoundError,
    RunState,
    Sample,
    SampleRequest,
    SamplingParams,
    Usage,
    fold,
    parse_event,
)

__all__ = (
    "AnyEvent",
    "Backend",
    "BackendError",
    "BudgetExhaustedError",
    "ConfigError",
    "CostBreakdown",
    "EventLog",
    "JsonlEventLog",
    "LaneResult",
    "LanefoldError",
    "Limits",
    "LogCorruptError",
    "LogWriteError",
    "LoopConfig",
    "MemoryEventLog",
    "Pricing",
    "QuorumNotMetError",
    "RunError",
    "RunInUseError",
    "RunNotFoundError",
    "RunResult",
    "RunState",
    "RunStore",
    "Sample",
    "SampleRequest",
    "SamplingParams",
    "Usage",
    "UsageBreakdown",
    "build_backend",
    "config_hash",
    "fold",
    "load_config",
    "parse_config",
    "parse_event",
    "resume",
    "resume_sync",
    "run",
    "run_sync",
)
