"""Run and resume: build the backend, open the log, drive the coordinator, record the result.

One writer per run (the log's lock); an interrupt (Ctrl-C, SIGTERM, a caller's cancellation)
records the lanes in flight as interrupted and ends the log with `run.interrupted`; any other
error ends it with `run.failed` and reaches the caller as a `LanefoldError`.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import sniffio
import structlog

from backends.engine import EngineConfig
from backends.openai import OpenAIBackend, OpenAIConfig
from backends.simulated import SimulatedBackend, SimulatedConfig
from coordinators import ParallelSample
from orchestrator._config import (
    VERSION,
    BackendConfig,
    LoopConfig,
    config_hash,
    import_verifier,
    load_config,
    preflight,
)
from orchestrator._result import RunResult, result_from_state
from orchestrator._store import RunStore, fold_record
from primitives import (
    Backend,
    ConfigError,
    EventLog,
    JsonlEventLog,
    LanefoldError,
    Ledger,
    LogWriteError,
    Recorder,
    RetryPolicy,
    RunError,
    RunState,
    SamplingParams,
    get_logger,
)
from primitives._dispatch import Dispatcher
from primitives._events import (
    AnyEvent,
    LaneInterrupted,
    LaneInterruptedData,
    RunCompleted,
    RunCompletedData,
    RunFailed,
    RunFailedData,
    RunInterrupted,
    RunInterruptedData,
    RunResumed,
    RunResumedData,
    RunStarted,
    RunStartedData,
    UsageData,
)

__all__ = ("build_backend", "check_question", "resume", "resume_sync", "run", "run_sync")

Observer = Callable[[AnyEvent], None]
T = TypeVar("T")


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


def check_question(question: str) -> str:
    """A question must have text and be encodable (no lone surrogates): refused before any
    run is created, so a run id is never left with a log that cannot hold its question."""
    if not isinstance(question, str) or not question.strip():
        raise ConfigError("question: must not be empty")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"question: not encodable as UTF-8 (character {exc.start}: "
                          f"{question[exc.start]!r})") from None
    return question


async def run(config: LoopConfig | str | Path, question: str, *, runs_dir: str | Path = "runs",
              run_id: str | None = None, backend: Backend | None = None,
              judge_backend: Backend | None = None, limiter: anyio.CapacityLimiter | None = None,
              observer: Observer | None = None, log: EventLog | None = None) -> RunResult:
    """Run a loop on one question; the event log lands in `runs_dir/<run_id>/events.jsonl`.

    `backend`, `judge_backend`, `limiter` (shared across runs) and `log` (any EventLog) replace
    what the config would build; what is given is never closed here. `observer` sees every
    event as it is recorded. Cancelling the call records the run as interrupted (resumable)
    and re-raises the cancellation.
    """
    return await _run(config, question, runs_dir=runs_dir, run_id=run_id, backend=backend,
                      judge_backend=judge_backend, limiter=limiter, observer=observer, log=log)


async def _run(config: LoopConfig | str | Path, question: str, *, runs_dir: str | Path = "runs",
               run_id: str | None = None, backend: Backend | None = None,
               judge_backend: Backend | None = None,
               limiter: anyio.CapacityLimiter | None = None, observer: Observer | None = None,
               log: EventLog | None = None,
               stop_reason: Callable[[], str] = lambda: "cancelled") -> RunResult:
    source = "<config>"
    if not isinstance(config, LoopConfig):
        source, config = str(config), load_config(config)
    check_question(question)
    preflight(config, source)
    store = RunStore(runs_dir)
    run_id = store.check_id(run_id) if run_id is not None else store.new_id()
    owned: list[Backend] = []
    try:
        backend, judge_backend = _backends(config, backend, judge_backend, owned)
        log = log or JsonlEventLog.create(store.events_path(run_id), fsync=config.log.fsync)
        recorder = Recorder(log, run_id, RunState(pricing=config.pricing), observer=observer)
        try:
            recorder.emit(RunStarted, RunStartedData(
                config=config.model_dump(mode="json"), config_hash=config_hash(config),
                question=question, coordinator=config.loop.coordinator, backend=backend.name,
                library_version=VERSION))
        except BaseException:
            log.close()
            raise
        ledger = Ledger(config.budget, config.pricing)
        return await _drive(config, question, recorder, ledger, backend, judge_backend,
                            limiter, stop_reason)
    finally:
        await _close(owned)


async def resume(run_id: str, *, runs_dir: str | Path = "runs", backend: Backend | None = None,
                 judge_backend: Backend | None = None,
                 limiter: anyio.CapacityLimiter | None = None,
                 observer: Observer | None = None, log: EventLog | None = None) -> RunResult:
    """Continue a run from its log. A finished run returns its recorded result, calling nothing.

    Completed lanes are kept; lanes in flight at a crash are charged their hold and, with the
    lanes an interrupt cut off, dispatched again; a torn last line is cut off and recorded.
    Another process writing the run raises RunInUseError before anything is touched.
    """
    return await _resume(run_id, runs_dir=runs_dir, backend=backend, judge_backend=judge_backend,
                         limiter=limiter, observer=observer, log=log)


async def _resume(run_id: str, *, runs_dir: str | Path = "runs", backend: Backend | None = None,
                  judge_backend: Backend | None = None,
                  limiter: anyio.CapacityLimiter | None = None, observer: Observer | None = None,
                  log: EventLog | None = None,
                  stop_reason: Callable[[], str] = lambda: "cancelled") -> RunResult:
    store = RunStore(runs_dir)
    if log is None:
        # A finished run needs no writer (nor a writable disk): its record stands as read.
        peek = store.read_state(run_id)
        if peek.result is not None:
            return RunResult.model_validate(peek.result)
        if peek.failure is not None:
            raise _recorded_failure(peek)
        log = JsonlEventLog.open_for_resume(store.existing(run_id), fsync="barrier")
    owned: list[Backend] = []
    try:
        # Read again under the lock: another writer may have moved on since the peek.
        state, config = fold_record(list(log.read()), _source(log), run_id)
        if state.result is not None:
            log.close()
            return RunResult.model_validate(state.result)
        if state.failure is not None:
            log.close()
            raise _recorded_failure(state)
        _set_fsync(log, config)
        backend, judge_backend = _backends(config, backend, judge_backend, owned)
        recorder = Recorder(log, state.run_id or run_id, state, observer=observer)
        torn = getattr(log, "torn_tail", None)
        recorder.emit(RunResumed, RunResumedData(
            resumed_after_sequence=state.last_sequence,
            in_flight=[(wave, lane.lane) for wave, lane in state.in_flight()],
            torn_tail_bytes=torn.bytes if torn else 0, torn_tail_line=torn.line if torn else None,
            active_seconds_before=state.active_seconds()))
        ledger = Ledger(config.budget, config.pricing, spent=copy.deepcopy(state.spend),
                        elapsed_before=state.active_seconds_before)
        return await _drive(config, question_of(state), recorder, ledger, backend,
                            judge_backend, limiter, stop_reason)
    except BaseException:
        log.close()
        raise
    finally:
        await _close(owned)


async def _drive(config: LoopConfig, question: str, recorder: Recorder, ledger: Ledger,
                 backend: Backend, judge_backend: Backend | None,
                 limiter: anyio.CapacityLimiter | None, stop_reason: Callable[[], str]) -> RunResult:
    """Drive the loop to its end and record that end, whatever it is; always closes the log."""
    log = get_logger("lanefold.run", run_id=recorder.run_id, backend=backend.name)
    try:
        for each in (backend, judge_backend):
            await _load(each)  # model loading is not sampling time (max_seconds)
        loop = _loop(config)
        dispatcher = _dispatcher(config, backend, recorder, ledger, limiter, log)
        judge = (_dispatcher(config, judge_backend, recorder, ledger, limiter, log)
                 if judge_backend is not None else None)
        outcome = await loop.run(dispatcher, question, judge)
        result = result_from_state(recorder.state, outcome, ledger.spent, ledger.elapsed(),
                                   recorder.log_path)
        recorder.emit(RunCompleted, RunCompletedData(result=result.model_dump(mode="json")))
        return result
    except anyio.get_cancelled_exc_class():
        _record_interrupt(recorder, ledger, stop_reason())
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        error = _lanefold_error(exc)
        if not recorder.broken:
            try:  # the record must end, whatever ended the run
                recorder.emit(RunFailed, RunFailedData(
                    error=type(error).__name__, message=str(error), exit_code=error.exit_code))
            except LanefoldError:
                pass  # the log cannot take it: what is written stands, resume reads it
        log.debug("run.failed", error=type(error).__name__)
        if error is exc:
            raise
        raise error from exc
    finally:
        recorder.log.close()


def _record_interrupt(recorder: Recorder, ledger: Ledger, reason: str) -> None:
    """Lanes in flight are interrupted, not failed: charged their hold, run again on resume."""
    if recorder.broken or recorder.state.finished:
        return
    flying = recorder.state.in_flight()
    try:
        for wave, lane in flying:
            hold = lane.hold
            assert hold is not None
            ledger.charge_cut_off(hold)
            recorder.emit(LaneInterrupted, LaneInterruptedData(
                reason=reason, billed=UsageData.of(hold.usage), billed_cost_usd=hold.cost_usd),
                wave=wave, lane=lane.lane, attempt=lane.attempts)
        recorder.emit(RunInterrupted, RunInterruptedData(
            reason=reason, in_flight=[(wave, lane.lane) for wave, lane in flying]))
    except LogWriteError:
        pass  # the log cannot take it: resume treats what was in flight as a crash would


def _lanefold_error(exc: BaseException) -> LanefoldError:
    """The error a caller sees: a LanefoldError, never a bare ExceptionGroup or a bug's class."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if isinstance(e, LanefoldError | BaseExceptionGroup)]
        exc = (inner or list(exc.exceptions))[0]
    if isinstance(exc, LanefoldError):
        return exc
    return RunError(f"internal error: {type(exc).__name__}: {exc}")


def _backends(config: LoopConfig, backend: Backend | None, judge_backend: Backend | None,
              owned: list[Backend]) -> tuple[Backend, Backend | None]:
    """The caller's backends, else built from the config; what is built joins `owned` (the
    run closes those, never the caller's)."""
    if backend is None:
        backend = build_backend(config.backend)
        owned.append(backend)
    if judge_backend is None and config.judge.backend is not None:
        judge_backend = build_backend(config.judge.backend)
        owned.append(judge_backend)
    return backend, judge_backend


async def _load(backend: Backend | None) -> None:
    load: Callable[[], Awaitable[None]] | None = getattr(backend, "load", None)
    if load is not None:
        await load()


async def _close(owned: list[Backend]) -> None:
    with anyio.CancelScope(shield=True):
        for backend in owned:
            await backend.aclose()


def _set_fsync(log: EventLog, config: LoopConfig) -> None:
    if isinstance(log, JsonlEventLog):
        log.fsync = config.log.fsync


def _source(log: EventLog) -> str:
    path = getattr(log, "path", None)
    return str(path) if path is not None else "<log>"


def _dispatcher(config: LoopConfig, backend: Backend, recorder: Recorder, ledger: Ledger,
                limiter: anyio.CapacityLimiter | None,
                log: structlog.stdlib.BoundLogger) -> Dispatcher:
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
        verifier=import_verifier(judge.verifier) if judge.verifier else None,
        verifier_name=judge.verifier)


def question_of(state: RunState) -> str:
    assert state.started is not None
    return state.started.question


def _recorded_failure(state: RunState) -> LanefoldError:
    assert state.failure is not None
    error = LanefoldError(f"run {state.run_id} already failed: {state.failure.error}: "
                          f"{state.failure.message}")
    error.exit_code = state.failure.exit_code  # type: ignore[misc]  # carry the recorded code
    return error


def _sync(call: Callable[[], Awaitable[T]]) -> T:
    """Run `call` to the end from synchronous code, even where an event loop already runs in
    this thread (a notebook): then on a fresh loop in a worker thread."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return anyio.run(call)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lanefold-sync") as pool:
        return pool.submit(anyio.run, call).result()


def run_sync(config: LoopConfig | str | Path, question: str, **kwargs: Any) -> RunResult:
    """`run` for scripts and notebooks (works inside a running event loop too)."""
    return _sync(functools.partial(run, config, question, **kwargs))


def resume_sync(run_id: str, **kwargs: Any) -> RunResult:
    """`resume` for scripts and notebooks."""
    return _sync(functools.partial(resume, run_id, **kwargs))
