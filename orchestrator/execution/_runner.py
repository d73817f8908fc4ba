"""One run, driven: its loop through a LoopContext, its end recorded whatever it is.

An interrupt (Ctrl-C, SIGTERM, a caller's cancellation) records the lanes in flight as
interrupted and ends the log with `run.interrupted`; any other error ends it with
`run.failed` and reaches the caller as a `LanefoldError`. The Session opens the logs and owns
the backends.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence

import anyio
import structlog

from lanefold.config import LoopConfig
from lanefold.primitives import (
    Backend,
    BackendSpec,
    ConfigError,
    EventLog,
    ExtractSpec,
    LanefoldError,
    Ledger,
    Loadable,
    LogWriteError,
    NonDeterminismError,
    Outcome,
    PromptForm,
    RunError,
    RunResult,
    RunState,
    ToolSpec,
    Verifier,
    check_tool_choice,
    get_logger,
    parse_tools,
)
from lanefold.primitives.events import (
    AnyEvent,
    LaneInterrupted,
    LaneInterruptedData,
    RunCompleted,
    RunCompletedData,
    RunFailed,
    RunFailedData,
    RunInterrupted,
    RunInterruptedData,
    Turn,
    UsageData,
)
from lanefold.primitives.internal import (
    Dispatcher,
    Recorder,
    RetryPolicy,
    RunContext,
    result_from_state,
    run_extract,
)

__all__ = (
    "Observer",
    "build_backend",
    "check_calls",
    "check_question",
    "close",
    "close_log",
    "context",
    "drive",
    "events_of",
    "lanefold_error",
    "load",
    "question_of",
    "record_interrupt",
    "recorded_failure",
    "run_tools",
    "set_fsync",
    "source_of",
)

Observer = Callable[[AnyEvent], None]


def build_backend(config: BackendSpec) -> Backend:
    """A Backend for a `[backend]` section, built by its registered model (which imports an
    optional extra only when it is used, and says which one is missing)."""
    return config.build()


def run_tools(tools: object, choice: str | None) -> tuple[ToolSpec, ...]:
    """A run's tools as given (`Session.run(tools=..., tool_choice=...)`, `--tools FILE`),
    checked before any run is created: ConfigError naming `tools[i]` or `tool_choice`."""
    parsed = () if tools is None else parse_tools(tools)
    check_tool_choice(choice, parsed)
    return parsed


def check_calls(extract: ExtractSpec, tools: Sequence[ToolSpec]) -> None:
    """`[extract] method = "tool_call"` reads calls of the run's tools: a run without tools
    could never answer, so it is refused before it is recorded."""
    if extract.resolved_method == "tool_call" and not tools:
        raise ConfigError(
            'extract.method: "tool_call" reads calls of the run\'s tools, and this run has none: '
            "give them (Session.run(tools=...), orchestrator run --tools FILE)"
        )


def check_question(question: str) -> str:
    """A question must have text and be encodable (no lone surrogates): refused before any
    run is created, so a run id is never left with a log that cannot hold its question."""
    if not isinstance(question, str) or not question.strip():
        raise ConfigError("question: must not be empty")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"question: not encodable as UTF-8 (character {exc.start}: {question[exc.start]!r})"
        ) from None
    return question


async def drive(
    config: LoopConfig,
    question: str,
    recorder: Recorder,
    ledger: Ledger,
    backend: Backend,
    judge_backend: Backend | None,
    *,
    limiter: anyio.CapacityLimiter | None,
    verifier: Verifier | None,
    stop_reason: Callable[[], str],
) -> RunResult:
    """Drive the loop to its end and record that end, whatever it is; always closes the log."""
    log = get_logger("lanefold.run", run_id=recorder.run_id, backend=backend.name)
    try:
        ctx = context(
            config,
            question,
            recorder,
            ledger,
            backend,
            judge_backend,
            limiter=limiter,
            verifier=verifier,
            log=log,
        )
        loop_class = config.loop_class()
        outcome = await loop_class(config.loop_params).run(ctx, question)
        if not isinstance(outcome, Outcome):
            raise RunError(f"loop {loop_class.name!r} returned {type(outcome).__name__}, not an Outcome")
        result = result_from_state(
            recorder.state, outcome, ledger.spent, ledger.elapsed(), events_of(recorder)
        )
        recorder.emit(RunCompleted, RunCompletedData(result=result.model_dump(mode="json")))
        return result
    except anyio.get_cancelled_exc_class():
        record_interrupt(recorder, ledger, stop_reason())
        raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        error = lanefold_error(exc)
        if isinstance(error, NonDeterminismError):
            raise error from exc  # nothing ran: the log stays resumable by the code that wrote it
        if error.machine_failure:  # the disk or the store failed, not the run: left resumable
            if error is exc:
                raise
            raise error from exc
        if not recorder.broken:
            try:  # the record must end, whatever ended the run
                recorder.emit(
                    RunFailed,
                    RunFailedData(error=type(error).__name__, message=str(error), exit_code=error.exit_code),
                )
            except LanefoldError:
                pass  # the log cannot take it: what is written stands, resume reads it
        log.debug("run.failed", error=type(error).__name__)
        if error is exc:
            raise
        raise error from exc
    finally:
        await close_log(recorder)


async def close_log(recorder: Recorder) -> None:
    """End a run's segment: its end forced down in a worker thread (the loop serves other runs
    meanwhile), shielded so an interrupted segment's end is forced too; then the log closed,
    with nothing left to force."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(LogWriteError):  # what is written stands; close says no more
            await recorder.sync()
    recorder.log.close()


def context(
    config: LoopConfig,
    question: str,
    recorder: Recorder,
    ledger: Ledger,
    backend: Backend,
    judge_backend: Backend | None,
    *,
    limiter: anyio.CapacityLimiter | None,
    verifier: Verifier | None,
    log: structlog.stdlib.BoundLogger,
    reduction: int = 1,
    first_wave: int = 1,
    extract: ExtractSpec | None = None,
) -> RunContext:
    """The LoopContext of a run: its dispatchers over one ledger and one recorder; answers
    read by `extract` (a re-reduction's `--extract`), else the config's, bound to the run's
    tools."""
    started = recorder.state.started
    conversation = started.conversation if started is not None else None
    after = (started.turns_after if started is not None else None) or ()
    form = config.prompt_form()
    extract = run_extract(extract or config.extract, recorder.state)  # bound to the run's tools
    dispatcher = _dispatcher(
        config, backend, recorder, ledger, limiter, log, form, conversation, extract, turns_after=after
    )
    judge = (
        _dispatcher(
            config, judge_backend, recorder, ledger, limiter, log, config.prompt_form(config.judge.backend)
        )
        if judge_backend is not None
        else None
    )
    return RunContext(
        loop_name=config.loop_class().name,
        question=question,
        seed=config.loop.seed,
        recorder=recorder,
        dispatcher=dispatcher,
        judge_dispatcher=judge,
        sampling=config.sampling_params(),
        extract=extract,
        template=config.prompt.template,
        judge=config.judge_settings(),
        verifier=verifier,
        reduction=reduction,
        first_wave=first_wave,
    )


def record_interrupt(recorder: Recorder, ledger: Ledger, reason: str, *, lanes_only: bool = False) -> None:
    """Lanes in flight are interrupted, not failed: charged their hold, run again on resume.
    `lanes_only`: a re-reduction of an ended run records its lanes, not a run.interrupted."""
    if recorder.broken or (recorder.state.finished and not lanes_only):
        return
    flying = recorder.state.in_flight()
    try:
        for wave, lane in flying:
            hold = lane.hold
            assert hold is not None
            ledger.charge_cut_off(hold)
            recorder.emit(
                LaneInterrupted,
                LaneInterruptedData(
                    reason=reason, billed=UsageData.of(hold.usage), billed_cost_usd=hold.cost_usd
                ),
                wave=wave,
                lane=lane.lane,
                attempt=lane.attempts,
            )
        if not lanes_only:
            recorder.emit(
                RunInterrupted,
                RunInterruptedData(reason=reason, in_flight=[(wave, lane.lane) for wave, lane in flying]),
            )
    except LogWriteError:
        pass  # the log cannot take it: resume treats what was in flight as a crash would


def lanefold_error(exc: BaseException) -> LanefoldError:
    """The error a caller sees: a LanefoldError, never a bare ExceptionGroup or a bug's class."""
    while isinstance(exc, BaseExceptionGroup):
        inner = [e for e in exc.exceptions if isinstance(e, LanefoldError | BaseExceptionGroup)]
        exc = (inner or list(exc.exceptions))[0]
    if isinstance(exc, LanefoldError):
        return exc
    return RunError(f"internal error: {type(exc).__name__}: {exc}")


async def load(backend: Backend | None) -> None:
    if isinstance(backend, Loadable):
        await backend.load()


async def close(owned: list[Backend]) -> None:
    with anyio.CancelScope(shield=True):
        for backend in owned:
            await backend.aclose()


def set_fsync(log: EventLog, config: LoopConfig) -> None:
    log.fsync = config.log.fsync


def source_of(log: EventLog) -> str:
    """Where a log is, for messages: its path, or its store's URL (no password) and run."""
    return log.location


def events_of(recorder: Recorder) -> str | None:
    """What a result names as its log: the file's path, or the run in its database."""
    return recorder.log_path or recorder.log.location


def _dispatcher(
    config: LoopConfig,
    backend: Backend,
    recorder: Recorder,
    ledger: Ledger,
    limiter: anyio.CapacityLimiter | None,
    log: structlog.stdlib.BoundLogger,
    form: PromptForm | None,
    conversation: Sequence[tuple[str, str] | Turn] | None = None,
    extract: ExtractSpec | None = None,
    *,
    turns_after: Sequence[tuple[str, str] | Turn] = (),
) -> Dispatcher:
    retry = config.retry
    return Dispatcher(
        backend,
        recorder,
        ledger,
        run_seed=config.loop.seed,
        max_concurrency=config.loop.max_concurrency,
        retry=RetryPolicy(
            max_attempts=retry.max_attempts,
            initial_backoff_s=retry.initial_backoff_s,
            max_backoff_s=retry.max_backoff_s,
            jitter=retry.jitter,
        ),
        timeout_s=config.loop.timeout_s,
        limiter=limiter,
        rng=random.Random(config.loop.seed),
        logger=log,
        conversation=conversation,
        form=form,
        extract=extract,
        turns_after=turns_after,
    )


def question_of(state: RunState) -> str:
    assert state.started is not None
    return state.started.question


def recorded_failure(state: RunState) -> LanefoldError:
    assert state.failure is not None
    error = LanefoldError(
        f"run {state.run_id} already failed: {state.failure.error}: {state.failure.message}"
    )
    error.exit_code = state.failure.exit_code  # type: ignore[misc]  # carry the recorded code
    return error
