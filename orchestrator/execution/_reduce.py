"""Re-reduction: reduce a finished run's lanes again, from its log, without sampling.

`orchestrator reduce RUN_ID --reducer NAME` and `Session.reduce`. The next reduction number
is opened with `reduce.started` and closed with `reduce.completed`, appended under the run's
lock. A reducer that needs a model (an LLM judge, usc) runs its own governed wave on the
run's judge backend (or its backend); no other reducer builds a backend at all. A
re-reduction cut off by a crash is continued by the same command (its waves replayed); asking
for another reducer while one is unfinished is refused.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import anyio

from lanefold.config import LoopConfig
from lanefold.coordinators import outcome_of
from lanefold.execution._fleet_budget import (
    StandingPools,
    close_pools,
    open_pools,
    recorded_pools,
    refuse_if_spent,
)
from lanefold.execution._runner import (
    Observer,
    close_log,
    context,
    events_of,
    lanefold_error,
    question_of,
    record_interrupt,
    set_fsync,
    source_of,
)
from lanefold.execution._store import fold_record
from lanefold.primitives import (
    Backend,
    ConfigError,
    ExtractSpec,
    Lane,
    LaneFailure,
    Ledger,
    Outcome,
    ReduceOptions,
    RunError,
    RunResult,
    RunState,
    Sample,
    SampleRequest,
    Store,
    Verifier,
    get_logger,
    loop_reducer,
    reducer_traits,
    resolve_reducer,
)
from lanefold.primitives.events import ReduceStarted, ReduceStartedData, RunResumed, RunResumedData
from lanefold.primitives.internal import HookRunner, Recorder, plugin_folders, reread_lanes, result_from_state

__all__ = ("ReduceHost", "reduce_run")


class ReduceHost(Protocol):
    """What a re-reduction needs of the Session it runs in: its store, the backends and
    verifier a run's config names (built as the session would), its limiter, its hooks and its
    standing segments of budgets, if it keeps them."""

    store: Store
    limiter: anyio.CapacityLimiter | None
    standing: StandingPools | None

    async def backends_for(self, config: LoopConfig) -> tuple[Backend, Backend | None]: ...

    def verifier_for(self, config: LoopConfig) -> Verifier | None: ...

    def hook_runner(self, config: LoopConfig, run_id: str) -> HookRunner: ...


class _NoSampling:
    """Stands where a backend would for a reducer that needs none: sampling is refused."""

    name = "none"
    shares_prefix = False
    max_lanes_per_request = None

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        return None

    def sample(self, request: SampleRequest) -> AsyncIterator[Sample | LaneFailure]:
        raise RunError("this reduction may not sample: its reducer needs no model")

    async def aclose(self) -> None:
        return None


async def reduce_run(
    session: ReduceHost,
    run_id: str,
    *,
    reducer: str,
    extract: ExtractSpec | None = None,
    observer: Observer | None = None,
    stop_reason: Callable[[], str] = lambda: "cancelled",
) -> RunResult:
    async with contextlib.AsyncExitStack() as hooks:  # the session's and the run's config's
        result, runner = await _reduce(session, run_id, reducer, extract, observer, stop_reason, hooks)
        await runner.end(result)
        return result


async def _reduce(
    session: ReduceHost,
    run_id: str,
    reducer: str,
    extract: ExtractSpec | None,
    observer: Observer | None,
    stop_reason: Callable[[], str],
    hooks: contextlib.AsyncExitStack,
) -> tuple[RunResult, HookRunner]:
    if ":" not in reducer:
        resolve_reducer(reducer, key="--reducer")  # a name not registered: before the lock
    log = session.store.open_for_resume(run_id)
    pool = None
    recorder: Recorder | None = None
    try:
        state, config = fold_record(list(log.read()), source_of(log), run_id)
        with plugin_folders(config.folder):  # `module:Class` beside the run's config first
            cls = resolve_reducer(reducer, key="--reducer")
        if state.result is None:
            raise ConfigError(f"run {run_id} has not completed: resume it before reducing it again")
        set_fsync(log, config)
        runner = await hooks.enter_async_context(session.hook_runner(config, state.run_id or run_id))
        recorder = Recorder(log, state.run_id or run_id, state, observer=runner.tapping(observer))
        spec = extract.model_dump(mode="json") if extract is not None else None
        opened = state.open_reduction
        if opened is not None and (opened.reducer, opened.extract) != (reducer, spec):
            raise ConfigError(
                f"run {run_id}: reduction {opened.reduction} ({opened.reducer}) "
                f"was cut off; finish it first with --reducer {opened.reducer}"
            )
        # Everything that can refuse is checked before the log is touched.
        verifier = session.verifier_for(config)
        # The tie-break and weighting the run's loop reduced with (defaults where it says none).
        choice = loop_reducer(config.loop_class(), config.loop_params)
        configured = choice.options if choice is not None else ReduceOptions()
        traits = reducer_traits(cls)
        if verifier is None and traits.wants_verifier(configured.weighting):
            raise ConfigError(
                f"--reducer: {reducer} needs a verifier, and run {run_id}'s config "
                f"has none (judge.verifier or judge.verifier_command)"
            )
        # A reducer says whether it calls a model (a plug-in that does not say might).
        needs_model = traits.uses_model and not (traits.needs_judge and verifier is not None)
        if needs_model:  # its judge wave spends from the budgets the run was started under too
            names = recorded_pools(state, config)
            pool = await open_pools(
                session.store, names, state.run_id or run_id, recorded=True, standing=session.standing
            )
            await refuse_if_spent(session.store, pool, f"run {run_id} was not reduced again")
        if opened is None:
            number = max(state.reductions, default=1) + 1
            opened = recorder.emit(
                ReduceStarted,
                ReduceStartedData(
                    reduction=number,
                    reducer=reducer,
                    extract=spec,
                    candidate_waves=state.reduction_waves.get(1) or [1],
                    first_wave=max(state.waves, default=0) + 1,
                ),
            ).data
        else:
            flying = state.in_flight()
            if flying:  # a crash cut the last try: charge what it had in flight
                recorder.emit(
                    RunResumed,
                    RunResumedData(
                        resumed_after_sequence=state.last_sequence,
                        in_flight=[(wave, lane.lane) for wave, lane in flying],
                        active_seconds_before=state.active_seconds(),
                    ),
                )
        backend: Backend
        judge: Backend | None = None
        if needs_model:
            backend, judge = await session.backends_for(config)
        else:
            backend = _NoSampling()
        ledger = Ledger(
            limits=config.budget, pricing=config.pricing, spent=copy.deepcopy(state.spend), shared=pool
        )
        ctx = context(
            config,
            question_of(state),
            recorder,
            ledger,
            backend,
            judge,
            limiter=session.limiter,
            verifier=verifier,
            log=get_logger("lanefold.reduce", run_id=run_id),
            reduction=opened.reduction,
            first_wave=opened.first_wave,
            extract=extract,
        )
        lanes = _candidates(state, opened.candidate_waves, extract)
        options = dataclasses.replace(configured, seed=config.loop.seed)
        try:
            reduction = await ctx.reduce(lanes, cls(options))
        except anyio.get_cancelled_exc_class():
            record_interrupt(recorder, ledger, stop_reason(), lanes_only=True)
            raise
        except BaseExceptionGroup as group:  # a judge wave's lanes: the caller gets one error
            if not group.subgroup(Exception):
                raise
            raise lanefold_error(group) from None
    finally:
        if recorder is not None:
            await close_log(recorder)
        else:
            log.close()
        await close_pools(pool)
    outcome: Outcome = outcome_of(reduction, lanes)
    # The run's own sampling time plus this reduction's (its judge wave, if any): not the idle
    # time between the run and now.
    elapsed = float(state.result.get("elapsed_s", 0.0)) + ledger.elapsed()
    return result_from_state(state, outcome, ledger.spent, elapsed, events_of(recorder)), runner


def _candidates(state: RunState, waves: list[int], extract: ExtractSpec | None) -> list[Lane]:
    """The lanes the run's own reduce read (every wave of them), answers read again with
    `extract` if given: `reread_lanes`, the rule a reader checks the reduction by."""
    missing = [wave for wave in waves if wave not in state.waves]
    if missing:
        raise ConfigError(f"run {state.run_id}: no wave {missing[0]} to reduce")
    return reread_lanes(state, waves, extract)
