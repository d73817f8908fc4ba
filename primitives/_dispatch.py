"""The one dispatch path every loop uses.

A wave of K lanes goes through it: the budget fits K (shrinking it, never below the quorum)
and carves the wave's reservation into per-lane holds; lanes that share a prompt travel as
one backend request; bounded concurrency (a CapacityLimiter counted in lanes), retries with
exponential backoff and jitter (tenacity) that honour a backend's `retry_after`, a per-request
timeout, failure isolation per lane, cancellation of the rest on a fatal error, and resume of
the lanes a crash left unfinished. The barrier closes the wave.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio
import structlog
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from lanefold.primitives._answers import ExtractSpec
from lanefold.primitives._backend import (
    Backend,
    ChatMessage,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    Usage,
    estimate_prompt_tokens,
)
from lanefold.primitives._backend_spec import PromptForm
from lanefold.primitives._barrier import close_wave
from lanefold.primitives._budget import Hold, Ledger, Room, WaveFit, cost_of
from lanefold.primitives._errors import (
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    BudgetExhaustedError,
    ConfigError,
)
from lanefold.primitives._logging import get_logger
from lanefold.primitives._record import Recorder
from lanefold.primitives._retry import Backoff, LaneSlots, RetryLanes, RetryPolicy
from lanefold.primitives._state import LaneState, WaveState
from lanefold.primitives._structured import AnswerRead
from lanefold.primitives.events import (
    BackendNoted,
    BackendNotedData,
    Bill,
    BudgetExhausted,
    BudgetExhaustedData,
    BudgetOverrun,
    BudgetOverrunData,
    BudgetWaveShrunk,
    BudgetWaveShrunkData,
    LaneCompleted,
    LaneCompletedData,
    LaneDispatched,
    LaneDispatchedData,
    LaneFailed,
    LaneFailedData,
    ReservationData,
    Turn,
    UsageData,
    WaveStarted,
    WaveStartedData,
    bill_of,
    turn_message,
)

__all__ = ("Dispatcher", "LaneJob", "RetryPolicy", "WaveSpec", "check_sendable", "lane_seed", "request_size")

# A wave refused by the shared pool this often (other runs keep taking the room between our
# look and our ask) stops as exhausted rather than spinning.
_MAX_REFUSALS = 50


def check_sendable(form: PromptForm | None, conversation: Sequence[object] | None) -> None:
    """A chat's earlier turns need the "chat" form: a raw prompt has nowhere to put them, and
    dropping them would answer another question than the one asked. ConfigError if so."""
    if form == "raw" and conversation:
        raise ConfigError(
            'prompt.form: "raw" sends the prompt as text, so a chat\'s earlier turns have nowhere '
            'to go: send the question alone, or serve a config with form = "chat"'
        )


def lane_seed(run_seed: int, wave: int, lane: int) -> int:
    """A lane's seed from (run seed, wave, lane): stable across processes and resumes."""
    digest = hashlib.blake2b(f"{run_seed}:{wave}:{lane}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def request_size(max_concurrency: int, lanes_per_request: int | None, slots: float = math.inf) -> int:
    """The most lanes of one prompt that travel in one request: `[loop] max_concurrency`, the
    backend's `max_lanes_per_request` and the lane slots there are (a request takes its lanes'
    slots at once). The dispatcher groups a wave by it, and an equal budget's fit prices a
    wave's requests by it."""
    size = max_concurrency
    if lanes_per_request is not None:
        size = min(size, lanes_per_request)
    if math.isfinite(slots):
        size = max(1, min(size, int(slots)))
    return size


@dataclass(frozen=True, slots=True)
class LaneJob:
    """One lane of a wave to dispatch: its number and the prompt it is sent."""

    lane: int
    prompt: str


@dataclass(frozen=True, slots=True)
class WaveSpec:
    """One wave: its lanes (each with its prompt), sampling settings and quorum."""

    wave: int
    purpose: str  # what the loop calls it: "sample", "judge", "critique", ...
    jobs: tuple[LaneJob, ...]
    params: SamplingParams
    min_quorum: int = 1
    share_prefix: bool = True
    # e.g. answer extraction: the answer, or what the extractor read (the answer, or why none)
    annotate: Callable[[Sample], str | AnswerRead | None] | None = None
    # The wave's extractor: a sampled wave's requests carry the tools bound to it and the
    # schema its answers are held to (`ExtractSpec.output_schema`)
    extract: ExtractSpec | None = None
    bill: Bill | None = None  # the bill line; by default judges are verifier passes
    fingerprint: str | None = None  # recorded in wave.started, checked on resume

    def __post_init__(self) -> None:
        if self.bill is None:
            object.__setattr__(self, "bill", bill_of(self.purpose))


@dataclass(slots=True)
class _Group:
    """Lanes that travel in one backend request: `request` is that request less its lanes, as
    counted (what is held is what is sent). `waiting`: the lanes whose hold in `holds` is
    reserved and not yet dispatched, given back if the wave ends before they go."""

    number: int
    request: SampleRequest
    prompt_tokens: int
    jobs: list[LaneJob]
    holds: list[Hold] | None = None
    last: dict[int, BackendError] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)

    @property
    def prompt(self) -> str:
        return self.request.prompt

    def reserved(self) -> None:
        """The group's holds are reserved now, for every one of its lanes."""
        self.waiting = {job.lane for job in self.jobs}


class Dispatcher:
    """Runs waves for one run. Policy lives here; the backend only makes attempts.

    Three jobs, one object each: plan (group the lanes, carve and fit the holds, record the
    wave's start), attempt (requests, landing, retries) and settle (record each outcome and
    settle its hold). The dispatcher runs a wave through them and closes it at the barrier.
    """

    def __init__(
        self,
        backend: Backend,
        recorder: Recorder,
        ledger: Ledger,
        *,
        run_seed: int,
        max_concurrency: int,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        sleep: Callable[[float], object] = anyio.sleep,
        rng: random.Random | None = None,
        logger: structlog.stdlib.BoundLogger | None = None,
        conversation: Sequence[tuple[str, str] | Turn] | None = None,
        form: PromptForm | None = None,
        extract: ExtractSpec | None = None,
        turns_after: Sequence[tuple[str, str] | Turn] = (),
    ) -> None:
        self.backend, self.recorder, self.ledger = backend, recorder, ledger
        self.extract = extract  # the run's: what a sampled request is held for (its tools)
        self.run_seed, self.retry, self.timeout_s = run_seed, retry or RetryPolicy(), timeout_s
        self.max_concurrency = max_concurrency
        slots = LaneSlots(limiter or anyio.CapacityLimiter(max_concurrency))
        log = logger or get_logger("lanefold.dispatch")
        self._plan = _Planner(
            backend,
            recorder,
            ledger,
            max_concurrency=max_concurrency,
            slots=slots,
            conversation=None if conversation is None else tuple(map(turn_message, conversation)),
            form=form,
            turns_after=tuple(map(turn_message, turns_after)),
        )
        self._settle = _Settler(recorder, ledger, log)
        self._attempts = _Attempts(
            backend,
            recorder,
            ledger,
            run_seed=run_seed,
            retry=self.retry,
            timeout_s=timeout_s,
            slots=slots,
            sleep=sleep,
            rng=rng or random.Random(run_seed),
            logger=log,
            plan=self._plan,
            settle=self._settle,
        )

    def prompt_tokens(self, prompt: str, *, bill: Bill = "sample") -> int:
        """The prompt tokens a request of `prompt` on a wave billed `bill` is held for: counted
        by the backend as it will be sent (a chat's conversation through its template), a
        conservative estimate where it cannot count."""
        purpose = "sample" if bill == "sample" else "judge"
        spec = WaveSpec(0, purpose, (), SamplingParams(), bill=bill, extract=self.extract)
        return self._plan.prompt_tokens(self._plan.request(spec, prompt))

    # -- the wave -------------------------------------------------------------------------------

    async def run_wave(self, spec: WaveSpec) -> WaveState:
        """Dispatch a wave (or finish one a crash interrupted), close it at the barrier.

        A cancellation from outside (an interrupt) leaves the lanes in flight as they are, for
        the caller to record as interrupted; the deadline and a fatal error fail them for good.
        """
        state = self.recorder.state.waves.get(spec.wave)
        if state is not None and state.barrier:
            return state
        self.ledger.start()
        if state is None:
            groups = await self._plan.start(spec)
        else:  # a wave a crash interrupted: its first k jobs, less the lanes already done
            groups = self._plan.groups(
                spec, [j for j in spec.jobs[: state.info.k] if not _done(state.lanes.get(j.lane))]
            )
        deadline = self.ledger.seconds_left()
        queue = iter(groups)

        self._attempts.open_groups = len(groups)

        async def worker() -> None:
            for group in queue:  # shared: each group is taken by exactly one worker
                try:
                    await self._attempts.run_group(spec, group)
                finally:
                    self._attempts.open_groups -= 1

        try:
            with anyio.move_on_after(math.inf if deadline is None else max(deadline, 0.0)) as scope:
                try:
                    async with anyio.create_task_group() as tg:
                        # No more tasks than lanes may run at once: memory stays flat as K grows.
                        for _ in range(min(len(groups), self.max_concurrency)):
                            tg.start_soon(worker)
                except* BackendError as eg:
                    fatal = eg.exceptions[0]
                    reason = f"wave cancelled by {type(fatal).__name__}"
                    self._settle.cut_off(spec, reason)
                    self._settle.abandon(spec, groups, reason)
                    raise fatal from None
        except BaseException:
            # Cancelled (an interrupt) or broken (the log, the store): holds reserved for lanes
            # that never went out come back, in the ledger and every pool, so only what was
            # sent is charged. The lanes go out on resume.
            self._settle.give_back(groups)
            raise
        if scope.cancelled_caught:
            self._settle.cut_off(spec, "max_seconds reached")
        self._settle.abandon(spec, groups, "max_seconds reached before dispatch")
        state = self.recorder.state.waves[spec.wave]
        await self._close(state, spec.min_quorum, deadline_hit=scope.cancelled_caught)
        return state

    async def _close(self, state: WaveState, min_quorum: int, *, deadline_hit: bool) -> None:
        """Close the wave at its barrier, and write its settlements to the pools the run
        spends from at the same time: the two are forced writes to different places (the log,
        the budget), neither waits for the other. Whichever order a crash leaves them in, no
        spend is lost: settlements not yet down leave the lanes' holds, charged whole; a
        barrier not yet down has the wave run again, and charged again, on resume. A pool that
        failed is the run's error first, as when it was written before the barrier."""
        shared = self.ledger.shared
        if shared is None:
            await close_wave(self.recorder, state, min_quorum=min_quorum, deadline_hit=deadline_hit)
            return
        flush_failed: list[Exception] = []
        closing: Exception | None = None

        async def flush() -> None:
            with anyio.CancelScope(shield=True):  # a change under way is seen through, never half-undone
                try:
                    await shared.flush()
                except Exception as exc:  # raised below, after the barrier's own outcome
                    flush_failed.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(flush)
            try:
                await close_wave(self.recorder, state, min_quorum=min_quorum, deadline_hit=deadline_hit)
            except Exception as exc:  # the quorum's or the log's: raised once the flush is done
                closing = exc
        if flush_failed:
            raise flush_failed[0]
        if closing is not None:
            raise closing


class _Planner:
    """Plan: a wave's lanes grouped into requests, their holds carved from the budget (fitted
    to what the ledger and the fleet's pool have), the wave's start recorded."""

    def __init__(
        self,
        backend: Backend,
        recorder: Recorder,
        ledger: Ledger,
        *,
        max_concurrency: int,
        slots: LaneSlots,
        conversation: tuple[ChatMessage, ...] | None = None,
        form: PromptForm | None = None,
        turns_after: tuple[ChatMessage, ...] = (),
    ) -> None:
        check_sendable(form, (*(conversation or ()), *turns_after))
        self.backend, self.recorder, self.ledger = backend, recorder, ledger
        self.max_concurrency, self._slots = max_concurrency, slots
        self.conversation, self.form, self.turns_after = conversation, form, turns_after
        self._token_cache: dict[SampleRequest, int] = {}

    def messages(self, spec: WaveSpec, prompt: str) -> tuple[ChatMessage, ...] | None:
        """What a lane sends besides its prompt, the one rule for every entry: in the "chat"
        form the prompt as the user's turn (a sampled lane of a chat's run after the chat's
        earlier turns; a judge's prompt alone), which the backend renders through the model's
        chat template; None in the "raw" form (the prompt is sent as it is).

        `form` None is the rule of a run recorded before the form was a config key, kept so
        it resumes as it ran: a chat's sampled lanes sent the chat, the rest a raw prompt the
        backend's own settings rendered (an engine's `chat_template`, an OpenAI `api`)."""
        if self.form == "raw":
            return None
        sampled = spec.bill == "sample"
        chat = self.conversation if sampled else None
        if self.form is None and chat is None:
            return None
        # an agent's calls and their results after the question go after it, in their order
        return (*(chat or ()), ChatMessage("user", prompt), *(self.turns_after if sampled else ()))

    def request(self, spec: WaveSpec, prompt: str) -> SampleRequest:
        """The request a group of `spec`'s lanes sharing `prompt` sends, less its lanes: what
        the backend counts is what it is sent. A sampled wave's request carries the tools
        bound to its extractor and the schema its answers are held to (the one rule for every
        entry: a judge's or a plan's wave, with no extractor or another bill, carries none)."""
        extract = spec.extract if spec.bill == "sample" else None
        return SampleRequest(
            prompt,
            spec.params,
            (),
            share_prefix=self.shared(spec),
            purpose=spec.purpose,
            wave=spec.wave,
            messages=self.messages(spec, prompt),
            tools=extract.tools if extract is not None else (),
            tool_choice=extract.tool_choice if extract is not None else None,
            schema=extract.output_schema() if extract is not None else None,
        )

    async def start(self, spec: WaveSpec) -> list[_Group]:
        (groups, fit), refusals = self.fitted(spec, None, None), 0
        kept = [h for g in groups for h in g.holds or ()]
        refused = self.ledger.try_reserve(kept)
        assert refused is None, "fit() and try_reserve() disagree"
        shared = self.ledger.shared
        while shared is not None:  # the fleet's pool: one transaction, all or nothing
            try:
                refusal = await shared.reserve(kept)
            except BaseException:
                self.ledger.unreserve(kept)
                raise
            if refusal is None:
                break
            self.ledger.unreserve(kept)
            refusals += 1
            # Another run took the room between our look and our ask: look again, fit again.
            room = refusal.room if refusals < _MAX_REFUSALS else Room(0, 0.0, 0)
            groups, fit = self.fitted(spec, room, refusal.pool or shared.name)
            kept = [h for g in groups for h in g.holds or ()]
            refused = self.ledger.try_reserve(kept)
            assert refused is None, "fit() and try_reserve() disagree"
        try:
            await self._record_start(spec, groups, fit, kept)
        except BaseException:  # not recorded, so not sent: every pool gets its holds back
            for hold in kept:
                self.ledger.release(hold)
            raise
        for group in groups:
            group.reserved()
        return groups

    async def _record_start(
        self, spec: WaveSpec, groups: list[_Group], fit: WaveFit, kept: list[Hold]
    ) -> None:
        k = sum(len(g.jobs) for g in groups)
        if k < len(spec.jobs):
            self.recorder.emit(
                BudgetWaveShrunk,
                BudgetWaveShrunkData(
                    k_requested=len(spec.jobs), k=k, limit=fit.limit or "", shared=fit.shared
                ),
                wave=spec.wave,
            )
        # A held run's first funded wave puts it in the store: that write may be forced.
        await self.recorder.emit_first(
            WaveStarted,
            WaveStartedData(
                purpose=spec.purpose,
                k=k,
                k_requested=len(spec.jobs),
                lane_max_tokens=spec.params.max_tokens,
                prompt_tokens=groups[0].prompt_tokens if groups else None,
                share_prefix=self.shared(spec),
                bill=spec.bill or "sample",
                fingerprint=spec.fingerprint,
                lanes=sorted(j.lane for g in groups for j in g.jobs),
                reservation=ReservationData(
                    tokens=sum(h.tokens for h in kept),
                    cost_usd=math.fsum(h.cost_usd for h in kept),
                    requests=sum(h.requests for h in kept),
                ),
            ),
            wave=spec.wave,
        )

    def fitted(self, spec: WaveSpec, room: Room | None, pool: str | None) -> tuple[list[_Group], WaveFit]:
        """The wave's groups and holds for as many lanes as fit (the ledger and, given its
        `room`, the shared pool `pool` that refused); below the quorum the run stops with a
        budget error."""
        groups = self.groups(spec, list(spec.jobs))
        for group in groups:
            group.holds = self.holds(spec, group, len(group.jobs))
        fit = self.ledger.fit([h for g in groups for h in g.holds or ()], room, pool)
        k = fit.k
        if fit.limit is not None and k < len(spec.jobs):
            # The shared prefix rides on a request's first lane: keep whole prefixes only.
            if k < spec.min_quorum:
                self.recorder.emit(
                    BudgetExhausted,
                    BudgetExhaustedData(
                        limit=fit.limit,
                        needed=fit.needed,
                        available=fit.available,
                        k_fit=k,
                        min_quorum=spec.min_quorum,
                        shared=fit.shared,
                    ),
                    wave=spec.wave,
                )
                where = f"shared budget {fit.shared!r} " if fit.shared is not None else "budget "
                raise BudgetExhaustedError(
                    f"{where}{fit.limit}: wave {spec.wave} can fund {k} of {len(spec.jobs)} "
                    f"lanes, below the quorum of {spec.min_quorum}"
                )
            groups = self.groups(spec, list(spec.jobs[:k]))
            for group in groups:
                group.holds = self.holds(spec, group, len(group.jobs))
        return groups, fit

    def groups(self, spec: WaveSpec, jobs: list[LaneJob]) -> list[_Group]:
        """Lanes with one prompt share a request, up to the backend's and the limiter's size."""
        size = request_size(
            self.max_concurrency, self.backend.max_lanes_per_request, self._slots.limiter.total_tokens
        )
        if not spec.share_prefix:
            size = 1
        by_prompt: dict[str, list[LaneJob]] = {}
        for job in sorted(jobs, key=lambda j: j.lane):
            by_prompt.setdefault(job.prompt, []).append(job)
        groups: list[_Group] = []
        for prompt, lanes in by_prompt.items():
            request = self.request(spec, prompt)
            tokens = self.prompt_tokens(request)
            for start in range(0, len(lanes), size):
                groups.append(_Group(len(groups), request, tokens, lanes[start : start + size]))
        return groups

    def shared(self, spec: WaveSpec) -> bool:
        """Lanes of one request share the prefill only where both loop and backend say so."""
        return spec.share_prefix and self.backend.shares_prefix

    def prompt_tokens(self, request: SampleRequest) -> int:
        """The prompt tokens `request` is held for, the one rule every hold follows: the
        backend's own count of the request as it will be sent (its chat template included),
        else the conservative estimate (`estimate_prompt_tokens`)."""
        tokens = self._token_cache.get(request)
        if tokens is None:
            counted = self.backend.count_prompt_tokens(request)
            if counted is None:
                counted = estimate_prompt_tokens(request)
            tokens = self._token_cache[request] = counted
        return tokens

    def holds(self, spec: WaveSpec, group: _Group, n: int) -> list[Hold]:
        return self.ledger.holds_for_request(
            group.prompt_tokens,
            [spec.params.max_tokens] * n,
            share_prefix=self.shared(spec),
            bill=spec.bill or "sample",
        )


class _Attempts:
    """Attempt: one backend request for a group's pending lanes, each lane's outcome landed the
    moment it arrives, retryable failures retried with backoff (tenacity)."""

    def __init__(
        self,
        backend: Backend,
        recorder: Recorder,
        ledger: Ledger,
        *,
        run_seed: int,
        retry: RetryPolicy,
        timeout_s: float | None,
        slots: LaneSlots,
        sleep: Callable[[float], object],
        rng: random.Random,
        logger: structlog.stdlib.BoundLogger,
        plan: _Planner,
        settle: _Settler,
    ) -> None:
        self.backend, self.recorder, self.ledger = backend, recorder, ledger
        self.run_seed, self.retry, self.timeout_s = run_seed, retry, timeout_s
        self._slots, self._sleep, self._rng, self._log = slots, sleep, rng, logger
        self._plan, self._settle = plan, settle
        self.open_groups = 0  # the wave's groups not yet done, this one included (run_wave counts)

    async def run_group(self, spec: WaveSpec, group: _Group) -> None:
        """The first attempt goes straight out; only lanes that failed retryably meet tenacity."""
        again: list[LaneJob] | None = await self._attempt(spec, group)
        if not again:
            return
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.retry.max_attempts + 1),  # lanes also count their own
            wait=Backoff(self.retry, self._rng),
            retry=retry_if_exception_type(RetryLanes),
            sleep=self._sleep,  # type: ignore[arg-type]  # anyio.sleep is awaitable
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if again is not None:
                    # Tenacity's first attempt stands for the one already made: it fails, so
                    # tenacity waits its backoff before the real second attempt.
                    group.jobs, group.holds, again = again, None, None
                    raise RetryLanes(max((e.retry_after or 0.0) for e in group.last.values()) or None)
                retry_lanes = await self._attempt(spec, group)
                if retry_lanes:
                    group.jobs, group.holds = retry_lanes, None
                    raise RetryLanes(max((e.retry_after or 0.0) for e in group.last.values()) or None)

    async def _attempt(self, spec: WaveSpec, group: _Group) -> list[LaneJob]:
        """One backend request for the group's pending lanes; returns the lanes to retry."""
        wave = self.recorder.state.waves[spec.wave]
        if group.holds is None:
            group.holds = self._plan.holds(spec, group, len(group.jobs))
            refused = self.ledger.try_reserve(group.holds)
            shared = self.ledger.shared
            if refused is None and shared is not None:
                try:
                    refusal = await shared.reserve(group.holds)
                except BaseException:
                    self.ledger.unreserve(group.holds)
                    raise
                if refusal is not None:
                    self.ledger.unreserve(group.holds)
                    refused = (
                        f"shared budget {(refusal.pool or shared.name)!r} {refusal.limit}",
                        refusal.needed,
                        refusal.available,
                    )
            if refused is None:
                group.reserved()
            else:
                for job in group.jobs:
                    self._settle.fail(
                        spec,
                        wave.lane(job.lane),
                        None,
                        "BudgetExhausted",
                        f"{refused[0]}: cannot fund another attempt",
                        final=True,
                    )
                return []
        holds = dict(zip((j.lane for j in group.jobs), group.holds, strict=True))
        borrowers = await self._slots.acquire(len(group.jobs))
        group.last = {}
        again: list[LaneJob] = []
        try:
            lanes = []
            for job in group.jobs:
                lane = wave.lane(job.lane)
                attempt = lane.attempts + 1
                seed = lane_seed(self.run_seed, spec.wave, job.lane)
                hold = holds[job.lane]
                self.recorder.emit(
                    LaneDispatched,
                    LaneDispatchedData(
                        seed=seed,
                        max_tokens=spec.params.max_tokens,
                        request=group.number,
                        reserved=UsageData.of(hold.usage),
                        reserved_cost_usd=hold.cost_usd,
                        reserved_requests=hold.requests,
                    ),
                    wave=spec.wave,
                    lane=job.lane,
                    attempt=attempt,
                )
                group.waiting.discard(job.lane)  # recorded as sent: the lane's hold is its own now
                lanes.append(LaneRequest(job.lane, seed, spec.params.max_tokens, attempt))
            request = dataclasses.replace(group.request, lanes=tuple(lanes))
            jobs = {job.lane: job for job in group.jobs}
            fatal: list[BackendError] = []

            def land(lane_no: int, outcome: Sample | BackendError) -> bool:
                """Record one lane's outcome the moment it arrives (synchronous); False once
                a fatal error means the rest of the request is not worth waiting for."""
                job = jobs.pop(lane_no)
                lane = wave.lane(lane_no)
                if isinstance(outcome, Sample):
                    try:  # a count the log cannot hold (negative, not finite) is a bad answer
                        usage = UsageData.of(outcome.usage)
                    except ValidationError as exc:
                        outcome = BadResponseError(f"usage {outcome.usage}: {exc.errors()[0]['msg']}")
                    else:
                        self._settle.complete(spec, lane, outcome, usage)
                        return True
                final = (not outcome.retryable) or lane.failures + 1 >= self.retry.max_attempts
                self._settle.fail(
                    spec,
                    lane,
                    outcome,
                    type(outcome).__name__,
                    str(outcome),
                    final=final,
                    cut_off=isinstance(outcome, BackendTimeoutError),
                )
                if outcome.fatal:
                    fatal.append(outcome)
                elif not final:
                    group.last[lane_no] = outcome
                    again.append(job)
                return not fatal

            await self._call(request, jobs, land)
        finally:
            self._slots.release(borrowers)
        # The lanes' settlements reach the fleet's pool as they land, while other groups of the
        # wave are out or before a retry; a wave's last group leaves them to the wave's end,
        # which writes them beside the barrier (`_close`) rather than before it.
        if self.ledger.shared is not None and (again or self.open_groups > 1):
            await self.ledger.shared.flush(wait=False)
        if fatal:
            raise fatal[0]  # the wave stops: no lane can succeed
        return sorted(again, key=lambda j: j.lane)

    async def _call(
        self,
        request: SampleRequest,
        jobs: dict[int, LaneJob],
        land: Callable[[int, Sample | BackendError], bool],
    ) -> None:
        """Feed each lane's outcome to `land` as the backend hands it over.

        Lanes the backend never answered fail with the error that ended the request (a
        timeout, a request-sinking error) or as a short response. A cancellation leaves the
        lanes still in flight dispatched, for the wave or the run to record.
        """
        ended: BackendError | None = None
        try:
            with anyio.fail_after(self.timeout_s) if self.timeout_s is not None else contextlib.nullcontext():
                outcomes = self.backend.sample(request)
                try:
                    async for outcome in outcomes:
                        if outcome.lane not in jobs:  # a lane twice, or one never asked for
                            self._log.warning("backend.unexpected_lane", lane=outcome.lane)
                            continue
                        landed = outcome if isinstance(outcome, Sample) else outcome.error
                        if not land(outcome.lane, landed):
                            ended = landed if isinstance(landed, BackendError) else None
                            break  # closing the iterator cancels the rest of the request
                finally:  # `closing()` inlined: this runs once per request
                    aclose = getattr(outcomes, "aclose", None)
                    if aclose is not None:
                        await aclose()
        except TimeoutError:
            ended = BackendTimeoutError(f"no answer within {self.timeout_s} s")
        except BackendError as exc:
            ended = exc
        finally:
            self._drain_backend_events(request.wave)
        if not jobs:
            return
        if ended is None:
            ended = BadResponseError(
                f"backend returned {len(request.lanes) - len(jobs)} of {len(request.lanes)} lanes"
            )
        for lane_no in sorted(jobs):
            land(lane_no, ended)

    def _drain_backend_events(self, wave: int) -> None:
        """Record what a backend learnt about its server (e.g. that `n > 1` is refused)."""
        drain = getattr(self.backend, "drain_events", None)
        if drain is None:
            return
        for note in drain():
            if note.type == "backend.n_unsupported":
                self.recorder.emit(
                    BackendNoted, BackendNotedData(note=note.type, detail=dict(note.data)), wave=wave
                )


class _Settler:
    """Settle: each attempt's outcome recorded and its hold settled, released or charged whole
    (an attempt cut off: no answer came, so the ledger assumes the worst)."""

    def __init__(self, recorder: Recorder, ledger: Ledger, logger: structlog.stdlib.BoundLogger) -> None:
        self.recorder, self.ledger, self._log = recorder, ledger, logger

    def complete(self, spec: WaveSpec, lane: LaneState, sample: Sample, recorded: UsageData) -> None:
        hold = lane.hold
        assert hold is not None
        usage = sample.usage
        logprob_mean = math.fsum(sample.logprobs) / len(sample.logprobs) if sample.logprobs else None
        read = spec.annotate(sample) if spec.annotate else None
        answer, answer_error = (read.answer, read.reason) if isinstance(read, AnswerRead) else (read, None)
        # Recorded first, settled after: a landing the log could not take stays held (charged
        # whole, as the log's fold charges a lane it saw dispatched and never land).
        self.recorder.emit(
            LaneCompleted,
            LaneCompletedData(
                text=sample.text,
                answer=answer,
                answer_error=answer_error,
                finish_reason=sample.finish_reason,
                usage=recorded,
                cost_usd=_cost(self.ledger, usage, hold),
                logprob_mean=logprob_mean,
                backend=dict(sample.extra),
            ),
            wave=spec.wave,
            lane=lane.lane,
            attempt=lane.attempts,
        )
        overruns = self.ledger.settle(hold, usage)
        for over in overruns:
            self.recorder.emit(
                BudgetOverrun,
                BudgetOverrunData(limit=over.limit, reserved=over.reserved, actual=over.actual),
                wave=spec.wave,
                lane=lane.lane,
                attempt=lane.attempts,
            )

    def fail(
        self,
        spec: WaveSpec,
        lane: LaneState,
        error: BackendError | None,
        name: str,
        message: str,
        *,
        final: bool,
        cut_off: bool = False,
    ) -> None:
        """Record a failed attempt; a cut-off one (no answer came) is charged its whole hold."""
        retryable = bool(error and error.retryable)
        hold = lane.hold
        if hold is None:  # the attempt was never dispatched (no budget for it)
            self.recorder.emit(
                LaneFailed,
                LaneFailedData(
                    error=name,
                    message=message,
                    retryable=False,
                    final=True,
                ),
                wave=spec.wave,
                lane=lane.lane,
                attempt=lane.attempts + 1,
            )
            return
        if cut_off:
            billed, cost = hold.usage, hold.cost_usd
        else:
            billed, cost = Usage(), 0.0
        self.recorder.emit(
            LaneFailed,
            LaneFailedData(
                error=name,
                message=message,
                retryable=retryable,
                final=final,
                billed=UsageData.of(billed),
                billed_cost_usd=cost,
                cut_off=cut_off,
            ),
            wave=spec.wave,
            lane=lane.lane,
            attempt=lane.attempts,
        )
        if cut_off:  # after the record, as `complete` settles
            self.ledger.charge_cut_off(hold)
        else:
            self.ledger.settle(hold, billed)
        self._log.debug(
            "lane.failed", wave=spec.wave, lane=lane.lane, attempt=lane.attempts, error=name, final=final
        )

    def cut_off(self, spec: WaveSpec, reason: str) -> None:
        """Attempts still in flight when their wave was stopped fail for good, charged whole."""
        wave = self.recorder.state.waves[spec.wave]
        for lane in sorted(wave.lanes.values(), key=lambda s: s.lane):
            if lane.status == "dispatched":
                self.fail(spec, lane, None, "Cancelled", reason, final=True, cut_off=True)

    def abandon(self, spec: WaveSpec, groups: list[_Group], reason: str) -> None:
        """Lanes cancelled before they were dispatched fail for good; their holds return."""
        wave = self.recorder.state.waves[spec.wave]
        for group in groups:
            for job in group.jobs:
                lane = wave.lane(job.lane)
                if lane.done or lane.status == "dispatched":
                    continue
                self._give_back(group, job.lane)
                self.fail(spec, lane, None, "Cancelled", reason, final=True)

    def give_back(self, groups: list[_Group]) -> None:
        """Release every hold reserved for a lane that was never dispatched (nothing recorded:
        the wave did not end, it was cut off, and those lanes go out on resume)."""
        for group in groups:
            for job in group.jobs:
                self._give_back(group, job.lane)

    def _give_back(self, group: _Group, lane: int) -> None:
        if lane in group.waiting and group.holds is not None:
            group.waiting.discard(lane)
            self.ledger.release(group.holds[[j.lane for j in group.jobs].index(lane)])


def _done(lane: LaneState | None) -> bool:
    return lane is not None and lane.done


def _cost(ledger: Ledger, usage: Usage, hold: Hold) -> float:
    return cost_of(usage, hold.bill, ledger.pricing)
