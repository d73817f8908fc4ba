"""The event model: one frozen pydantic model per event type, in a discriminated union.

The envelope follows CloudEvents' JSON form where it fits (`specversion`, `id`, `source`,
`type`, `time`) plus `sequence` (strictly increasing from 1 within a run), `run_id` and, where
they apply, `wave`, `lane` and `attempt`; the payload sits under `data`. Token usage uses the
OpenTelemetry GenAI attribute names.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from primitives._backend import Usage

__all__ = (
    "AnyEvent",
    "BackendNoted",
    "BudgetExhausted",
    "BudgetOverrun",
    "BudgetWaveShrunk",
    "Event",
    "JudgeCompleted",
    "LaneCompleted",
    "LaneDispatched",
    "LaneFailed",
    "LaneInterrupted",
    "ReduceCompleted",
    "ReservationData",
    "RunCompleted",
    "RunFailed",
    "RunInterrupted",
    "RunResumed",
    "RunStarted",
    "UsageData",
    "WaveBarrier",
    "WaveStarted",
    "hash_config",
    "parse_event",
)

def _absent(value: object) -> bool:
    return value is None


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class UsageData(_Frozen):
    """Usage in OpenTelemetry GenAI names (plus KV residency, which GenAI does not name)."""

    input_tokens: int = Field(0, alias="gen_ai.usage.input_tokens")
    output_tokens: int = Field(0, alias="gen_ai.usage.output_tokens")
    cached_input_tokens: int = Field(0, alias="gen_ai.usage.cache_read.input_tokens")
    kv_token_seconds: float = Field(0.0, alias="lanefold.usage.kv_token_seconds")

    @classmethod
    def of(cls, usage: Usage) -> UsageData:
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            kv_token_seconds=usage.kv_token_seconds,
        )

    def to_usage(self) -> Usage:
        return Usage(
            self.input_tokens, self.cached_input_tokens, self.output_tokens, self.kv_token_seconds
        )


class Event(_Frozen):
    """The envelope shared by every event type."""

    specversion: Literal["1.0"] = "1.0"
    id: str
    source: str
    type: str
    time: datetime
    sequence: int = Field(ge=1)
    run_id: str
    # CloudEvents leaves out attributes that do not apply, rather than writing null.
    wave: int | None = Field(None, exclude_if=_absent)
    lane: int | None = Field(None, exclude_if=_absent)
    attempt: int | None = Field(None, exclude_if=_absent)
    data: Any


# -- run --------------------------------------------------------------------------------------


def hash_config(config: dict[str, Any]) -> str:
    """sha256 of a resolved config's canonical JSON: two runs with one hash ran one config."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class RunStartedData(_Frozen):
    config: dict[str, Any]
    config_hash: str
    question: str
    coordinator: str
    backend: str
    library_version: str


class RunStarted(Event):
    type: Literal["run.started"] = "run.started"
    data: RunStartedData


class RunResumedData(_Frozen):
    resumed_after_sequence: int
    # (wave, lane) dispatched but never landed: a crash cut them off; each is charged its hold
    in_flight: list[tuple[int, int]] = []
    torn_tail_bytes: int = 0  # bytes of a half-written last line that were cut off
    torn_tail_line: int | None = None
    active_seconds_before: float = 0.0  # wall time the run ran before this resume


class RunResumed(Event):
    type: Literal["run.resumed"] = "run.resumed"
    data: RunResumedData


class RunCompletedData(_Frozen):
    result: dict[str, Any]


class RunCompleted(Event):
    type: Literal["run.completed"] = "run.completed"
    data: RunCompletedData


class RunFailedData(_Frozen):
    error: str
    message: str
    exit_code: int


class RunFailed(Event):
    type: Literal["run.failed"] = "run.failed"
    data: RunFailedData


class RunInterruptedData(_Frozen):
    reason: str  # "SIGINT", "SIGTERM" or "cancelled"
    in_flight: list[tuple[int, int]] = []  # (wave, lane) recorded as lane.interrupted


class RunInterrupted(Event):
    """The run was stopped from outside (Ctrl-C, SIGTERM, a caller's cancellation): not a
    failure. `resume` continues it; the lanes it cut off are dispatched again."""

    type: Literal["run.interrupted"] = "run.interrupted"
    data: RunInterruptedData


# -- waves and lanes ----------------------------------------------------------------------------


class ReservationData(_Frozen):
    """Worst-case spend set aside before dispatch."""

    tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0


class WaveStartedData(_Frozen):
    purpose: Literal["sample", "judge"]
    k: int
    k_requested: int
    lane_max_tokens: int
    prompt_tokens: int | None
    share_prefix: bool
    reservation: ReservationData


class WaveStarted(Event):
    type: Literal["wave.started"] = "wave.started"
    data: WaveStartedData


class LaneDispatchedData(_Frozen):
    seed: int
    max_tokens: int
    request: int  # which backend request of the wave carries this lane
    reserved: UsageData  # the worst case this attempt may spend
    reserved_cost_usd: float
    reserved_requests: int  # 1 on the lane that pays for the request, else 0


class LaneDispatched(Event):
    type: Literal["lane.dispatched"] = "lane.dispatched"
    data: LaneDispatchedData


class LaneCompletedData(_Frozen):
    text: str
    answer: str | None = None
    finish_reason: str
    usage: UsageData
    cost_usd: float
    logprob_mean: float | None = None
    backend: dict[str, Any] = {}


class LaneCompleted(Event):
    type: Literal["lane.completed"] = "lane.completed"
    data: LaneCompletedData


class LaneFailedData(_Frozen):
    error: str
    message: str
    retryable: bool
    final: bool  # no further attempt will be made
    billed: UsageData = UsageData()
    billed_cost_usd: float = 0.0
    # The attempt was cut off before it answered (a timeout, the deadline, a fatal error in
    # its wave): `billed` is its whole hold, on the bill's cut-off line, not as decode.
    cut_off: bool = Field(False, exclude_if=lambda v: not v)


class LaneFailed(Event):
    type: Literal["lane.failed"] = "lane.failed"
    data: LaneFailedData


class LaneInterruptedData(_Frozen):
    """An attempt in flight when the run was interrupted: charged its hold, run again on resume."""

    reason: str
    billed: UsageData = UsageData()
    billed_cost_usd: float = 0.0


class LaneInterrupted(Event):
    type: Literal["lane.interrupted"] = "lane.interrupted"
    data: LaneInterruptedData


class WaveBarrierData(_Frozen):
    completed: list[int]
    failed: list[int]


class WaveBarrier(Event):
    type: Literal["wave.barrier"] = "wave.barrier"
    data: WaveBarrierData


# -- reduce -------------------------------------------------------------------------------------


class JudgeCompletedData(_Frozen):
    candidate_lane: int
    score: float | None  # None: the judge's output held no score (an abstention)
    judge: str  # "llm" or the verifier's "module:function"
    detail: str = ""


class JudgeCompleted(Event):
    type: Literal["judge.completed"] = "judge.completed"
    data: JudgeCompletedData


class ReduceCompletedData(_Frozen):
    reducer: str
    winner: str | None
    winner_lane: int | None
    votes: dict[str, float] = {}
    scores: dict[int, float | None] = {}
    tie_break: str
    tied: list[Any] = []
    abstentions: int = 0


class ReduceCompleted(Event):
    type: Literal["reduce.completed"] = "reduce.completed"
    data: ReduceCompletedData


# -- budget and backend notes ---------------------------------------------------------------------


class BudgetWaveShrunkData(_Frozen):
    k_requested: int
    k: int
    limit: str


class BudgetWaveShrunk(Event):
    type: Literal["budget.wave_shrunk"] = "budget.wave_shrunk"
    data: BudgetWaveShrunkData


class BudgetExhaustedData(_Frozen):
    limit: str
    needed: float
    available: float
    k_fit: int
    min_quorum: int


class BudgetExhausted(Event):
    type: Literal["budget.exhausted"] = "budget.exhausted"
    data: BudgetExhaustedData


class BudgetOverrunData(_Frozen):
    limit: str
    reserved: float
    actual: float


class BudgetOverrun(Event):
    type: Literal["budget.overrun"] = "budget.overrun"
    data: BudgetOverrunData


class BackendNotedData(_Frozen):
    note: str
    detail: dict[str, Any] = {}


class BackendNoted(Event):
    """Something a backend learned that changes how it is driven (e.g. `n` unsupported)."""

    type: Literal["backend.n_unsupported"] = "backend.n_unsupported"
    data: BackendNotedData


AnyEvent = Annotated[
    RunStarted
    | RunResumed
    | RunCompleted
    | RunFailed
    | RunInterrupted
    | WaveStarted
    | LaneDispatched
    | LaneCompleted
    | LaneFailed
    | LaneInterrupted
    | WaveBarrier
    | JudgeCompleted
    | ReduceCompleted
    | BudgetWaveShrunk
    | BudgetExhausted
    | BudgetOverrun
    | BackendNoted,
    Field(discriminator="type"),
]

_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)


def parse_event(line: str | bytes) -> AnyEvent:
    """Validate one JSON line into its event model; raises pydantic.ValidationError."""
    return _ADAPTER.validate_json(line)
