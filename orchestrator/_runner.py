"""Run and resume: build the backend, open the log, drive the coordinator, record the result."""

from __future__ import annotations

import copy
import functools
import importlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import structlog

from backends.engine import EngineConfig
from backends.openai import OpenAIBackend, OpenAIConfig
from backends.simulated import SimulatedBackend, SimulatedConfig
from coordinators import ParallelSample, Verifier
from orchestrator._config import BackendConfig, LoopConfig, config_hash, load_config
from orchestrator._result import RunResult, result_from_state
from orchestrator._store import RunStore
from primitives import (
    Backend,
    ConfigError,
    EventLog,
    LanefoldError,
    Ledger,
    SamplingParams,
)
from primitives._dispatch import Dispatcher, RetryPolicy
from primitives._eventlog import JsonlEventLog, TornTail
from primitives._events import (
    AnyEvent,
    RunCompleted,
    RunCompletedData,
    RunFailed,
    RunFailedData,
    RunResumed,
    RunResumedData,
    RunStarted,
    RunStartedData,
)
from primitives._record import Recorder
from primitives._state import RunState, fold

__all__ = ("build_backend", "resume", "resume_sync", "run", "run_sync")

VERSION = "0.1.0"
Observer = Callable[[AnyEvent], None]


def build_backend(config: BackendConfig) -> Backend:
    """A Backend for a `[backend]` section. Optional extras are imported only when used."""
    if isinstance(config, SimulatedConfig):
        return SimulatedBackend(config)
    if isinstance(config, OpenAIConfig):
        return OpenAIBackend(config)
    if isinstance(config, EngineConfig):
        try:
            from backends.engine import EngineBackend  # torch: only when the engine is used
        except ImportError as exc:
            raise ConfigError(f"backend.kind: 'engine' needs the engine extra "
                              f"(pip install 'lanefold[engine]'): {exc}") from None
        return EngineBackend(config)
    raise ConfigError(f"backend.kind: {config.kind!r} is not available")  # pragma: no cover


async def run(config: LoopConfig | str | Path, question: str, *, runs_dir: str | Path = "runs",
              run_id: str | None = None, backend: Backend | None = None,
              judge_backend: Backend | None = None, limiter: anyio.CapacityLimiter | None = None,
              observer: Observer | None = None, log: EventLog | None = None) -> RunResult:
    """Run a loop on one question; the event log lands in `runs_dir/<run_id>/events.jsonl`.

    `backend`, `judge_backend`, `limiter` (shared across runs) and `log` (any EventLog) replace
    what the config would build; `observer` sees every event as it is recorded.
    """
    if not isinstance(config, LoopConfig):
        config = load_config(config)
    if not question.strip():
        raise ConfigError("question: must not be empty")
    store = RunStore(runs_dir)
    run_id = store.check_id(run_id) if run_id is not None else store.new_id()
    log = log or JsonlEventLog.create(store.events_path(run_id), fsync=config.log.fsync)
    state = RunState(pricing=config.pricing)
    recorder = Recorder(log, run_id, state, observer=observer)
    backend = backend or build_backend(config.backend)
    recorder.emit(RunStarted, RunStartedData(
        config=config.model_dump(mode="json"), config_hash=config_hash(config),
        question=question, coordinator=config.loop.coordinator, backend=backend.name,
        library_version=VERSION))
    ledger = Ledger(config.budget, config.pricing)
    return await _drive(config, question, recorder, ledger, backend, judge_backend, limiter)


async def resume(run_id: str, *, runs_dir: str | Path = "runs", backend: Backend | None = None,
                 judge_backend: Backend | None = None,
                 limiter: anyio.CapacityLimiter | None = None,
                 observer: Observer | None = None, log: EventLog | None = None) -> RunResult:
    """Continue a run from its log. A finished run returns its recorded result, calling nothing.

    Completed lanes are kept; lanes in flight at the crash are charged their hold and
    dispatched again; a torn last line of the log is cut off and recorded.
    """
    if log is None:
        path = RunStore(runs_dir).existing(run_id)
    peek = fold((log or JsonlEventLog(path)).read())
    if peek.started is None:
        raise ConfigError(f"run {run_id}: the log has no run.started event")
    config = LoopConfig.model_validate(peek.started.config)
    if peek.result is not None:
        return RunResult.model_validate(peek.result)
    if peek.failure is not None:
        raise _recorded_failure(peek)
    if log is None:
        log = JsonlEventLog.open_for_resume(path, fsync=config.log.fsync)
    state = fold(log.read(), config.pricing)
    recorder = Recorder(log, state.run_id or run_id, state, observer=observer)
    torn: TornTail | None = getattr(log, "torn_tail", None)
    recorder.emit(RunResumed, RunResumedData(
        resumed_after_sequence=state.last_sequence,
        in_flight=[(wave, lane.lane) for wave, lane in state.in_flight()],
        torn_tail_bytes=torn.bytes if torn else 0, torn_tail_line=torn.line if torn else None,
        active_seconds_before=state.active_seconds()))
    ledger = Ledger(config.budget, config.pricing, spent=copy.deepcopy(state.spend),
                    elapsed_before=state.active_seconds_before)
    backend = backend or build_backend(config.backend)
    return await _drive(config, state.started.question if state.started else "", recorder,
                        ledger, backend, judge_backend, limiter)


async def _drive(config: LoopConfig, question: str, recorder: Recorder, ledger: Ledger,
                 backend: Backend, judge_backend: Backend | None,
                 limiter: anyio.CapacityLimiter | None) -> RunResult:
    log = structlog.get_logger("lanefold").bind(run_id=recorder.run_id, backend=backend.name)
    if judge_backend is None and config.judge.backend is not None:
        judge_backend = build_backend(config.judge.backend)
    try:
        loop = _loop(config)
        dispatcher = _dispatcher(config, backend, recorder, ledger, limiter, log)
        judge = (_dispatcher(config, judge_backend, recorder, ledger, limiter, log)
                 if judge_backend is not None else None)
        outcome = await loop.run(dispatcher, question, judge)
        result = result_from_state(recorder.state, outcome, ledger.spent, ledger.elapsed(),
                                   recorder.log_path)
        recorder.emit(RunCompleted, RunCompletedData(result=result.model_dump(mode="json")))
        return result
    except Exception as exc:  # the record must end, whatever ended the run; then re-raise
        recorder.emit(RunFailed, RunFailedData(
            error=type(exc).__name__, message=str(exc),
            exit_code=exc.exit_code if isinstance(exc, LanefoldError) else 1))
        raise
    finally:
        with anyio.CancelScope(shield=True):
            recorder.log.close()
            await backend.aclose()
            if judge_backend is not None:
                await judge_backend.aclose()


def _dispatcher(config: LoopConfig, backend: Backend, recorder: Recorder, ledger: Ledger,
                limiter: anyio.CapacityLimiter | None,
                log: structlog.typing.FilteringBoundLogger) -> Dispatcher:
    retry = config.retry
    return Dispatcher(
        backend, recorder, ledger, run_seed=config.loop.seed,
        max_concurrency=config.loop.max_concurrency,
        retry=RetryPolicy(retry.max_attempts, retry.initial_backoff_s, retry.max_backoff_s,
                          retry.jitter),
        timeout_s=config.loop.timeout_s, limiter=limiter,
        rng=random.Random(config.loop.seed), logger=log)


def _loop(config: LoopConfig) -> ParallelSample:
    s, loop, judge = config.sampling, config.loop, config.judge
    return ParallelSample(
        k=loop.k, template=config.prompt.template,
        params=SamplingParams(s.temperature, s.top_p, s.top_k, s.max_tokens, tuple(s.stop),
                              s.logprobs or loop.weighting == "mean_logprob"),
        extract=config.extract, reducer=loop.reducer, min_quorum=loop.min_quorum,
        tie_break=loop.tie_break, weighting=loop.weighting, seed=loop.seed,
        judge_template=judge.template,
        judge_params=SamplingParams(temperature=judge.temperature, max_tokens=judge.max_tokens),
        verifier=_import_verifier(judge.verifier) if judge.verifier else None,
        verifier_name=judge.verifier)


def _import_verifier(spec: str) -> Verifier:
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"judge.verifier: cannot import {spec!r}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"judge.verifier: {spec!r} is not callable")
    return target  # type: ignore[no-any-return]


def _recorded_failure(state: RunState) -> LanefoldError:
    assert state.failure is not None
    error = LanefoldError(f"run {state.run_id} already failed: {state.failure.error}: "
                          f"{state.failure.message}")
    error.exit_code = state.failure.exit_code  # type: ignore[misc]  # carry the recorded code
    return error


def run_sync(config: LoopConfig | str | Path, question: str, **kwargs: Any) -> RunResult:
    """`run` for scripts and notebooks (starts its own event loop)."""
    return anyio.run(functools.partial(run, config, question, **kwargs))


def resume_sync(run_id: str, **kwargs: Any) -> RunResult:
    """`resume` for scripts and notebooks."""
    return anyio.run(functools.partial(resume, run_id, **kwargs))
