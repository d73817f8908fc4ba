"""lanefold's public facade: run and resume loops, load configs, read results and event logs,
and plug in loops, reducers, backends, stores, executors, hooks, scorers and verifiers.

    import lanefold
    result = lanefold.run_sync(lanefold.load_config("loop.toml"), question="...")

    async with lanefold.Session("loop.toml") as session:   # one model load, many runs
        async for result in session.run_many(questions, concurrency=8):
            ...

    with lanefold.SyncSession("loop.toml") as session:     # the same, for sync code
        result = session.run("...")

Extenders import the layers: `lanefold.primitives` (protocols, events, errors, registries),
`lanefold.backends`, `lanefold.coordinators`. `import orchestrator`, this package's name before
0.2, still works for one minor release and warns.
"""

from __future__ import annotations

import contextlib

if __name__ == "orchestrator":  # the package's name before 0.2 (a repository checkout, a shim)
    import warnings

    warnings.warn(
        "the package `orchestrator` is now `lanefold`: import lanefold (the `orchestrator` name goes in 0.3)",
        DeprecationWarning,
        stacklevel=2,
    )

TYPE_CHECKING = False  # not typing's: `import orchestrator` imports nothing before it is used
if TYPE_CHECKING:
    from typing import Any

    from lanefold.config import LoopConfig, config_hash, load_config, parse_config
    from lanefold.evaluate import register_scorer
    from lanefold.execution import (
        Executor,
        RayExecutor,
        Session,
        Store,
        SyncSession,
        build_backend,
        open_store,
        read_run,
        read_state,
        resume,
        resume_sync,
        run,
        run_sync,
    )
    from lanefold.primitives import (
        AnyEvent,
        Backend,
        BackendError,
        BudgetExhaustedError,
        ConfigError,
        CostBreakdown,
        EventLog,
        Hook,
        Lane,
        LanefoldError,
        LaneJob,
        LaneResult,
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
        RunFailure,
        RunInUseError,
        RunNotFoundError,
        RunResult,
        RunState,
        Sample,
        SampleRequest,
        SamplingParams,
        ToolCall,
        ToolSpec,
        Usage,
        UsageBreakdown,
        Verdict,
        Verifier,
        fold,
        parse_event,
        register_backend,
        register_executor,
        register_hook,
        register_loop,
        register_reducer,
        register_store,
        register_verifier,
    )
    from lanefold.stores.files import JsonlEventLog, RunStore
    from lanefold.stores.postgres import PgStore

# Each public name and the module it comes from, imported on first use (PEP 562): `import
# orchestrator` costs nothing until a name is used, so the `orchestrator` command starts in
# a few milliseconds and a Ctrl-C while it imports the rest is its own to answer.
_HOMES: dict[str, tuple[str, ...]] = {
    "lanefold.config": ("LoopConfig", "config_hash", "load_config", "parse_config"),
    "lanefold.execution": (
        "Executor",
        "RayExecutor",
        "Session",
        "Store",
        "SyncSession",
        "build_backend",
        "open_store",
        "read_run",
        "read_state",
        "resume",
        "resume_sync",
        "run",
        "run_sync",
    ),
    "lanefold.stores.files": ("JsonlEventLog", "RunStore"),
    "lanefold.stores.postgres": ("PgStore",),
    "lanefold.evaluate": ("register_scorer",),
    "lanefold.primitives": (
        "AnyEvent",
        "CostBreakdown",
        "LaneResult",
        "RunFailure",
        "RunResult",
        "UsageBreakdown",
        "Backend",
        "BackendError",
        "BudgetExhaustedError",
        "ConfigError",
        "EventLog",
        "Lane",
        "LaneJob",
        "LanefoldError",
        "Limits",
        "LogCorruptError",
        "LogWriteError",
        "Loop",
        "LoopContext",
        "MemoryEventLog",
        "NonDeterminismError",
        "Outcome",
        "Pricing",
        "QuorumNotMetError",
        "ReduceOptions",
        "Reducer",
        "Reduction",
        "RunError",
        "RunInUseError",
        "RunNotFoundError",
        "RunState",
        "Sample",
        "SampleRequest",
        "SamplingParams",
        "ToolCall",
        "ToolSpec",
        "Usage",
        "Verdict",
        "Verifier",
        "fold",
        "parse_event",
        "register_backend",
        "register_executor",
        "register_hook",
        "register_loop",
        "register_reducer",
        "register_store",
        "register_verifier",
        "Hook",
    ),
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
    "Hook",
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
    "ToolCall",
    "ToolSpec",
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
    "read_run",
    "read_state",
    "register_backend",
    "register_executor",
    "register_hook",
    "register_loop",
    "register_reducer",
    "register_scorer",
    "register_store",
    "register_verifier",
    "resume",
    "resume_sync",
    "run",
    "run_sync",
)


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import version

        globals()[name] = found = version("lanefold")  # written once, in pyproject.toml
        return found
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    if getattr(value, "__module__", "").startswith("lanefold.") and not isinstance(value, str):
        # As httpx and anyio do: a public name says it is the facade's (where users find it).
        with contextlib.suppress(AttributeError, TypeError):
            value.__module__ = "lanefold"
    globals()[name] = value  # found once; later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
