"""The LoopContext a run hands its loop: waves, reductions, verdicts and records, governed.

Waves are numbered in the order the loop asks for them (1, 2, ...) and each carries a
fingerprint of its spec. On resume the loop runs again from the top: a wave the log already
holds is returned from the record (its missing lanes finished), a record already written is
returned instead of written twice, and a wave asked for with another spec than the recorded
one is refused (NonDeterminismError), as Temporal refuses a workflow that takes another step.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal

import anyio

from lanefold.primitives._answers import ExtractSpec, read_answer
from lanefold.primitives._backend import Backend, Sample, SamplingParams
from lanefold.primitives._budget import Ledger, Spend
from lanefold.primitives._dispatch import Dispatcher, LaneJob, WaveSpec
from lanefold.primitives._errors import ConfigError, NonDeterminismError, RunError
from lanefold.primitives._judge import render_prompt
from lanefold.primitives._loop import (
    JudgeSettings,
    Lane,
    ReduceOptions,
    Reducer,
    Reduction,
    Remaining,
)
from lanefold.primitives._nesting import nests_deeper
from lanefold.primitives._record import Recorder
from lanefold.primitives._registry import resolve_reducer
from lanefold.primitives._state import RunState
from lanefold.primitives._structured import AnswerRead
from lanefold.primitives._verifier import Verdict, Verifier
from lanefold.primitives.events import (
    Bill,
    JudgeCompleted,
    JudgeCompletedData,
    LoopEvent,
    ReduceCompleted,
    ReduceCompletedData,
    bill_of,
    hash_config,
)

__all__ = ("RunBudget", "RunContext", "wave_fingerprint")

_NOUN = re.compile(r"[a-z][a-z0-9_]*")
# How deep a loop's own record may nest: a log's reader (pydantic's JSON parser) refuses lines
# nested past about 200 levels, and an event's envelope adds two.
RECORD_DEPTH = 64


def wave_fingerprint(
    purpose: str,
    bill: Bill,
    jobs: Sequence[LaneJob],
    params: SamplingParams,
    *,
    quorum: int,
    share_prefix: bool,
    extract: ExtractSpec | None,
    backend: str,
) -> str:
    """sha256 of what a wave asks for: its lanes' prompts, sampling, extractor and quorum."""
    sampling = asdict(params)
    if not sampling["top_logprobs"]:  # added later: left out at its default, so that logs
        del sampling["top_logprobs"]  # recorded before it keep their fingerprints
    return hash_config(
        {
            "purpose": purpose,
            "bill": bill,
            "backend": backend,
            "quorum": quorum,
            "share_prefix": share_prefix,
            "params": sampling,
            "extract": extract.model_dump(mode="json") if extract is not None else None,
            "lanes": [[job.lane, job.prompt] for job in jobs],
        }
    )


class RunBudget:
    """The ledger as a loop sees it: what is left, and whether a wave would fit."""

    def __init__(self, ledger: Ledger, dispatcher: Dispatcher) -> None:
        self._ledger, self._dispatcher = ledger, dispatcher

    def remaining(self) -> Remaining:
        ledger, limits = self._ledger, self._ledger.limits
        spent = ledger.spent
        return Remaining(
            tokens=None
            if limits.max_tokens is None
            else limits.max_tokens - spent.tokens - ledger.reserved_tokens,
            cost_usd=None
            if limits.max_cost_usd is None
            else limits.max_cost_usd - spent.cost_usd - ledger.reserved_cost_usd,
            requests=None
            if limits.max_requests is None
            else limits.max_requests - spent.requests - ledger.reserved_requests,
            seconds=ledger.seconds_left(),
        )

    def can_afford(
        self, n: int, max_tokens: int, *, prompt: str = "", bill: Bill = "sample", share_prefix: bool = True
    ) -> bool:
        if n <= 0:
            return True
        seconds = self._ledger.seconds_left()
        if seconds is not None and seconds <= 0:
            return False
        tokens = self._dispatcher.prompt_tokens(prompt, bill=bill)
        if share_prefix:  # one request of n lanes (as many as the backend takes at once)
            shared = self._dispatcher.backend.shares_prefix
            holds = self._ledger.holds_for_request(tokens, [max_tokens] * n, share_prefix=shared, bill=bill)
        else:  # lanes of their own prompts: a request each
            holds = [
                hold
                for _ in range(n)
                for hold in self._ledger.holds_for_request(
                    tokens, [max_tokens], share_prefix=False, bill=bill
                )
            ]
        pool = self._ledger.shared  # as of this run's last look: a loop stops in time
        return self._ledger.fit(holds, pool.room if pool is not None else None).k == n

    @property
    def spent(self) -> Spend:
        return copy.copy(self._ledger.spent)


class RunContext:
    """The LoopContext of one run (or of one re-reduction of a finished run)."""

    def __init__(
        self,
        *,
        loop_name: str,
        question: str,
        seed: int,
        recorder: Recorder,
        dispatcher: Dispatcher,
        judge_dispatcher: Dispatcher | None = None,
        sampling: SamplingParams | None = None,
        extract: ExtractSpec | None = None,
        template: str = "{question}",
        judge: JudgeSettings | None = None,
        verifier: Verifier | None = None,
        reduction: int = 1,
        first_wave: int = 1,
    ) -> None:
        self.loop_name, self.question, self.seed = loop_name, question, seed
        self.sampling = sampling or SamplingParams()
        self.extract = extract or ExtractSpec()
        self.judge = judge or JudgeSettings()
        self.verifier = verifier
        self.judge_backend: Backend | None = (
            judge_dispatcher.backend if judge_dispatcher is not None else None
        )
        self.reduction = reduction
        self._recorder, self._dispatcher, self._judge_dispatcher = (recorder, dispatcher, judge_dispatcher)
        self._template = template
        self._next_wave = first_wave
        self._records = 0  # loop events this run of the loop has asked to record
        self._budget = RunBudget(dispatcher.ledger, dispatcher)
        self._reduced: Reduction | None = None

    @property
    def state(self) -> RunState:
        return self._recorder.state

    @property
    def budget(self) -> RunBudget:
        return self._budget

    def prompt(self, question: str | None = None) -> str:
        return render_prompt(self._template, question=self.question if question is None else question)

    # -- waves --------------------------------------------------------------------------------

    async def wave(
        self,
        prompts: Sequence[str | LaneJob],
        *,
        params: SamplingParams | None = None,
        purpose: str = "sample",
        bill: Bill | None = None,
        quorum: int = 1,
        share_prefix: bool = True,
        extract: ExtractSpec | bool | None = True,
        backend: Literal["main", "judge"] = "main",
    ) -> list[Lane]:
        if isinstance(prompts, str):
            raise ConfigError("ctx.wave: give a list of prompts, not one string")
        jobs = tuple(p if isinstance(p, LaneJob) else LaneJob(i, p) for i, p in enumerate(prompts))
        if not jobs:
            return []
        if len({job.lane for job in jobs}) != len(jobs):
            raise ConfigError("ctx.wave: two jobs with one lane number")
        if not 0 <= quorum <= len(jobs):
            raise ConfigError(f"ctx.wave: quorum {quorum} for {len(jobs)} lanes")
        spec_extract = self.extract if extract is True else None if extract is False else extract
        if spec_extract is not None and not spec_extract.tools and self.extract.tools:
            # a loop's own extractor reads calls of the run's tools too
            spec_extract = spec_extract.with_tools(self.extract.tools, self.extract.tool_choice)
        params = params or self.sampling
        dispatcher = (self._judge_dispatcher or self._dispatcher) if backend == "judge" else self._dispatcher
        bill = bill or bill_of(purpose)
        number = self._next_wave
        self._next_wave += 1
        fingerprint = wave_fingerprint(
            purpose,
            bill,
            jobs,
            params,
            quorum=quorum,
            share_prefix=share_prefix,
            extract=spec_extract,
            backend=backend,
        )
        recorded = self.state.waves.get(number)
        if recorded is not None and recorded.info.fingerprint not in (None, fingerprint):
            raise NonDeterminismError(
                f"wave {number} ({recorded.info.purpose}) was recorded with another spec "
                f"({recorded.info.fingerprint} in the log, {fingerprint} now): the loop or its "
                f"config changed since the run started; resume it with the code that started it"
            )
        if recorded is not None and recorded.info.fingerprint is None and recorded.info.purpose != purpose:
            raise NonDeterminismError(
                f"wave {number} was recorded as {recorded.info.purpose!r}, the loop now asks for {purpose!r}"
            )

        def annotate(sample: Sample) -> AnswerRead | None:
            return read_answer(sample.text, spec_extract) if spec_extract else None

        state = await dispatcher.run_wave(
            WaveSpec(
                number,
                purpose,
                jobs,
                params,
                min_quorum=quorum,
                share_prefix=share_prefix,
                annotate=annotate if spec_extract is not None else None,
                extract=spec_extract,
                bill=bill,
                fingerprint=fingerprint,
            )
        )
        prompts_by_lane = {job.lane: job.prompt for job in jobs}
        return [
            Lane.of(number, state.lanes[job.lane], prompts_by_lane[job.lane])
            for job in jobs
            if job.lane in state.lanes
        ]

    # -- reduce and verify --------------------------------------------------------------------

    async def reduce(
        self,
        lanes: Sequence[Lane],
        reducer: str | Reducer = "majority_vote",
        *,
        options: ReduceOptions | None = None,
    ) -> Reduction:
        if self._reduced is not None:
            raise RunError("a loop reduces once per run: ctx.reduce was called twice")
        options = options or ReduceOptions(seed=self.seed)
        chosen: Reducer = resolve_reducer(reducer)(options) if isinstance(reducer, str) else reducer
        recorded = self.state.reductions.get(self.reduction)
        result = await chosen.reduce(self, lanes)
        self._reduced = result
        if recorded is None:
            waves = sorted({lane.wave for lane in lanes})
            self._recorder.emit(
                ReduceCompleted,
                ReduceCompletedData(
                    reducer=result.reducer,
                    winner=result.winner,
                    winner_lane=result.winner_lane,
                    votes=dict(result.votes),
                    scores=dict(result.scores),
                    tie_break=result.tie_break,
                    tied=list(result.tied),
                    abstentions=result.abstentions,
                    reduction=self.reduction,
                    agreement=_finite(result.agreement),
                    margin=_finite(result.margin),
                    detail=_jsonable(dict(result.detail)),
                    candidate_waves=waves if len(waves) > 1 else [],
                    winner_wave=result.winner_wave if len(waves) > 1 else None,
                ),
                wave=waves[0] if len(waves) == 1 else None,
            )
        return result

    def verdict(self, lane: Lane) -> JudgeCompletedData | None:
        """The recorded verdict on a lane in this reduction, if there is one."""
        return self.state.verdicts.get((self.reduction, lane.wave, lane.lane))

    def record_verdict(
        self,
        lane: Lane,
        score: float | None,
        judge: str,
        *,
        detail: str = "",
        passed: bool | None = None,
        error: str | None = None,
        wave: int | None = None,
    ) -> None:
        """Record a verdict on a lane (`judge.completed`), once per lane and reduction."""
        if self.verdict(lane) is not None:
            return
        self._recorder.emit(
            JudgeCompleted,
            JudgeCompletedData(
                candidate_lane=lane.lane,
                score=score,
                judge=judge,
                detail=detail,
                candidate_wave=lane.wave,
                reduction=self.reduction,
                passed=passed,
                error=error,
            ),
            wave=wave if wave is not None else lane.wave,
            lane=lane.lane,
        )

    async def verify(self, lanes: Sequence[Lane]) -> dict[int, Verdict]:
        verifier = self.verifier
        if verifier is None:
            raise ConfigError("judge.verifier: this loop needs a verifier and none is configured")
        numbers = [lane.lane for lane in lanes]
        if len(set(numbers)) != len(numbers):  # lanes of several waves numbered alike
            raise ConfigError(
                "ctx.verify: two lanes share a lane number (verdicts are returned by lane "
                "number): give the lanes of one wave at a time, or number them apart"
            )
        verdicts: dict[int, Verdict] = {}
        todo = []
        for lane in lanes:
            if not lane.completed:
                continue
            known = self.verdict(lane)
            if known is not None:
                verdicts[lane.lane] = Verdict(known.score, known.passed, known.detail, known.error)
            else:
                todo.append(lane)

        async def judge_one(lane: Lane) -> None:
            verdict = await verifier.verify(self.question, lane.text or "", lane.answer)
            verdicts[lane.lane] = verdict
            self.record_verdict(
                lane,
                verdict.score,
                verifier.name,
                detail=verdict.detail,
                passed=verdict.passed,
                error=verdict.error,
            )

        async with anyio.create_task_group() as tg:
            for lane in todo:
                tg.start_soon(judge_one, lane)
        return dict(sorted(verdicts.items()))

    # -- the loop's own events ----------------------------------------------------------------

    def record(
        self, noun: str, data: Mapping[str, Any], *, wave: int | None = None, lane: int | None = None
    ) -> Mapping[str, Any]:
        if not _NOUN.fullmatch(noun):
            raise ConfigError(
                f"ctx.record: {noun!r} must be lower case letters, digits and '_' "
                f"(the event is loop.{self.loop_name}.<noun>)"
            )
        kind = f"loop.{self.loop_name}.{noun}"
        index = self._records
        self._records += 1
        mine = [e for e in self.state.loop_events if e.type.startswith(f"loop.{self.loop_name}.")]
        if index < len(mine):
            recorded = mine[index]
            if recorded.type != kind:
                raise NonDeterminismError(
                    f"record {index + 1} of loop {self.loop_name!r} was {recorded.type!r} in "
                    f"the log, the loop now records {kind!r}"
                )
            return recorded.data
        payload = _jsonable(dict(data))
        self._recorder.emit(LoopEvent, payload, wave=wave, lane=lane, event_type=kind)
        return payload


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    """The data as JSON will give it back on resume (tuples become lists, keys strings), no
    deeper than a log's reader parses (`RECORD_DEPTH`): a record written is a record read."""
    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ctx.record: data must be JSON (finite numbers): {exc}") from None
    except RecursionError:
        text = None
    if text is None or nests_deeper(text, RECORD_DEPTH):
        raise ConfigError(f"ctx.record: data nests deeper than {RECORD_DEPTH} levels")
    result: dict[str, Any] = json.loads(text)
    return result
