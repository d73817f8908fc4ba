"""lanefold's public facade: run and resume loops, load configs, read results and event logs,
and plug in loops, reducers and verifiers.

    import orchestrator
    result = orchestrator.run_sync(orchestrator.load_config("loop.toml"), question="...")

    async with orchestrator.Session("loop.toml") as session:   # one model load, many runs
        async for result in session.run_many(questions, concurrency=8):
            ...

    with orchestrator.SyncSession("loop.toml") as session:     # the same, for sync code
        result = session.run("...")
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: `import orchestrator` imports nothing before it is used
if TYPE_CHECKING:
    from typing import Any

    from orchestrator._config import LoopConfig, config_hash, load_config, parse_config
    from orchestrator._executor import Executor
    from orchestrator._pgstore import PgStore
    from orchestrator._ray_executor import RayExecutor
    from orchestrator._result import CostBreakdown, LaneResult, RunFailure, RunResult, UsageBreakdown
    from orchestrator._runner import build_backend
    from orchestrator._session import Session, resume, resume_sync, run, run_sync
    from orchestrator._store import RunStore, Store, open_store
    from orchestrator._sync_session import SyncSession
    from primitives import (
        AnyEvent,
        Backend,
        BackendError,
        BudgetExhaustedError,
        ConfigError,
        EventLog,
        JsonlEventLog,
        Lane,
        LanefoldError,
        LaneJob,
        Limits,
        LogCorruptError,
        LogWriteError,
        Loop,
        LoopContext,
        MemoryEventLog,
        NonDeterminismError,
        Outcome,
        Pricing,
        QuorumNotMetError,
        ReduceOptions,
        Reducer,
        Reduction,
        RunError,
        RunInUseError,
        RunNotFoundError,
        RunState,
        Sample,
        SampleRequest,
        SamplingParams,
        Usage,
        Verdict,
        Verifier,
        fold,
        parse_event,
        register_loop,
        register_reducer,
    )

# Each public name and the module it comes from, imported on first use (PEP 562): `import
# orchestrator` costs nothing until a name is used, so the `orchestrator` command starts in
# a few milliseconds and a Ctrl-C while it imports the rest is its own to answer.
_HOMES: dict[str, tuple[str, ...]] = {
    "orchestrator._config": ("LoopConfig", "config_hash", "load_config", "parse_config"),
    "orchestrator._executor": ("Executor",),
    "orchestrator._pgstore": ("PgStore",),
    "orchestrator._ray_executor": ("RayExecutor",),
    "orchestrator._result": ("CostBreakdown", "LaneResult", "RunFailure", "RunResult",
        "UsageBreakdown"),
    "orchestrator._runner": ("build_backend",),
    "orchestrator._session": ("Session", "resume", "resume_sync", "run", "run_sync"),
    "orchestrator._store": ("RunStore", "Store", "open_store"),
    "orchestrator._sync_session": ("SyncSession",),
    "primitives": ("AnyEvent", "Backend", "BackendError", "BudgetExhaustedError", "ConfigError",
        "EventLog", "JsonlEventLog", "Lane", "LaneJob", "LanefoldError", "Limits",
        "LogCorruptError", "LogWriteError", "Loop", "LoopContext", "MemoryEventLog",
        "NonDeterminismError", "Outcome", "Pricing", "QuorumNotMetError", "ReduceOptions",
        "Reducer", "Reduction", "RunError", "RunInUseError", "RunNotFoundError", "RunState",
        "Sample", "SampleRequest", "SamplingParams", "Usage", "Verdict", "Verifier", "fold",
        "parse_event", "register_loop", "register_reducer"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = (
    "AnyEvent",
    "Backend",
    "BackendError",
    "BudgetExhaustedError",
    "ConfigError",
    "CostBreakdown",
    "EventLog",
    "Executor",
    "JsonlEventLog",
    "Lane",
    "LaneJob",
    "LaneResult",
    "LanefoldError",
    "Limits",
    "LogCorruptError",
    "LogWriteError",
    "Loop",
    "LoopConfig",
    "LoopContext",
    "MemoryEventLog",
    "NonDeterminismError",
    "Outcome",
    "PgStore",
    "Pricing",
    "QuorumNotMetError",
    "RayExecutor",
    "ReduceOptions",
    "Reducer",
    "Reduction",
    "RunError",
    "RunFailure",
    "RunInUseError",
    "RunNotFoundError",
    "RunResult",
    "RunState",
    "RunStore",
    "Sample",
    "SampleRequest",
    "SamplingParams",
    "Session",
    "Store",
    "SyncSession",
    "Usage",
    "UsageBreakdown",
    "Verdict",
    "Verifier",
    "build_backend",
    "config_hash",
    "fold",
    "load_config",
    "open_store",
    "parse_config",
    "parse_event",
    "register_loop",
    "register_reducer",
    "resume",
    "resume_sync",
    "run",
    "run_sync",
)


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
