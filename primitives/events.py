"""The event model, public: one frozen pydantic model per event type, in a discriminated union.

Loops and extenders import these to read a log (`parse_event`, `AnyEvent`) and to record
their own events (`LoopEvent`, typed `loop.<name>.<noun>`).

The envelope follows CloudEvents' JSON form where it fits (`specversion`, `id`, `source`,
`type`, `time`, and the extension attribute `schemaversion`: the version of these models a line
was written in) plus `sequence` (strictly increasing from 1 within a run), `run_id` and, where
they apply, `wave`, `lane` and `attempt`; the payload sits under `data`. Token usage uses the
OpenTelemetry GenAI attribute names.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from lanefold.primitives._backend import ChatMessage, MessageToolCall, Usage

__all__ = (
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "AnyEvent",
    "BackendNoted",
    "BackendNotedData",
    "Bill",
    "BudgetExhausted",
    "BudgetExhaustedData",
    "BudgetOverrun",
    "BudgetOverrunData",
    "BudgetWaveShrunk",
    "BudgetWaveShrunkData",
    "Event",
    "JudgeCompleted",
    "JudgeCompletedData",
    "LaneCompleted",
    "LaneCompletedData",
    "LaneDispatched",
    "LaneDispatchedData",
    "LaneFailed",
    "LaneFailedData",
    "LaneInterrupted",
    "LaneInterruptedData",
    "LoopEvent",
    "ReduceCompleted",
    "ReduceCompletedData",
    "ReduceStarted",
    "ReduceStartedData",
    "ReservationData",
    "RunCompleted",
    "RunCompletedData",
    "RunFailed",
    "RunFailedData",
    "RunInterrupted",
    "RunInterruptedData",
    "RunResumed",
    "RunResumedData",
    "RunStarted",
    "RunStartedData",
    "TurnCallData",
    "TurnData",
    "UsageData",
    "WaveBarrier",
    "WaveBarrierData",
    "WaveStarted",
    "WaveStartedData",
    "bill_of",
    "hash_config",
    "newer_schema",
    "parse_event",
)


def _absent(value: object) -> bool:
    return value is None


# The largest quantity a bill holds: 2**53, the last integer a JSON number carries exactly
# (RFC 7493, I-JSON), so a count or amount past it is no backend's and no ledger's.
MAX_QUANTITY = 2**53
# A count (tokens, requests, a wave's lanes): a non-negative integer a bill can add up.
Count = Annotated[int, Field(ge=0, le=MAX_QUANTITY)]
# An amount (USD, token-seconds, seconds): a finite non-negative number.
Amount = Annotated[float, Field(ge=0, le=MAX_QUANTITY, allow_inf_nan=False)]
# A named budget's name, as `check_budget_name` takes it (a file's name on the files store).
BudgetName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class UsageData(_Frozen):
    """Usage in OpenTelemetry GenAI names (plus KV residency, which GenAI does not name)."""

    input_tokens: Count = Field(0, alias="gen_ai.usage.input_tokens")
    output_tokens: Count = Field(0, alias="gen_ai.usage.output_tokens")
    cached_input_tokens: Count = Field(0, alias="gen_ai.usage.cache_read.input_tokens")
    kv_token_seconds: Amount = Field(0.0, alias="lanefold.usage.kv_token_seconds")

    @classmethod
    def of(cls, usage: Usage) -> UsageData:
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            kv_token_seconds=usage.kv_token_seconds,
        )

    def to_usage(self) -> Usage:
        return Usage(self.input_tokens, self.cached_input_tokens, self.output_tokens, self.kv_token_seconds)


SCHEMA_VERSION = 1
"""The version of the event schema this library writes, and the newest it reads.

It moves when a change to the models would make an older reader misread a line (a field it
would ignore or refuse, a meaning changed); a field added the way `lanes` or `cut_off` were,
left out where it does not apply, does not move it. A line without `schemaversion` was written
before the envelope carried one: schema 1. (When this moves past 1, absent must still read as 1.)
"""


class Event(_Frozen):
    """The envelope shared by every event type."""

    specversion: Literal["1.0"] = "1.0"
    # A CloudEvents extension attribute (lowercase alphanumerics): the schema the line was
    # written in. A reader refuses a line newer than it reads rather than misread it.
    schemaversion: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION, strict=True)
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


class TurnCallData(_Frozen):
    """A call an assistant turn of a recorded conversation made (`MessageToolCall`)."""

    id: str
    name: str
    arguments: str


class TurnData(_Frozen):
    """A turn of a recorded conversation that holds more than (role, content): an assistant's
    `tool_calls`, a tool turn's `tool_call_id` and `name`. A plain turn stays a (role, content)
    pair, so logs and config hashes of plain chats are as they were."""

    role: str
    content: str
    tool_calls: list[TurnCallData] | None = Field(None, exclude_if=_absent)
    tool_call_id: str | None = Field(None, exclude_if=_absent)
    name: str | None = Field(None, exclude_if=_absent)

    @staticmethod
    def recorded(turn: ChatMessage | tuple[str, str]) -> TurnData | tuple[str, str]:
        """How `turn` is recorded: a pair where it is plain, else a TurnData."""
        if isinstance(turn, tuple):
            return turn
        if not turn.tool_calls and turn.tool_call_id is None and turn.name is None:
            return (turn.role, turn.content)
        calls = [TurnCallData(id=c.id, name=c.name, arguments=c.arguments) for c in turn.tool_calls]
        return TurnData(
            role=turn.role,
            content=turn.content,
            tool_calls=calls or None,
            tool_call_id=turn.tool_call_id,
            name=turn.name,
        )

    @staticmethod
    def message(turn: TurnData | tuple[str, str]) -> ChatMessage:
        """The `ChatMessage` a recorded turn is sent as."""
        if isinstance(turn, tuple):
            return ChatMessage(*turn)
        calls = tuple(MessageToolCall(c.id, c.name, c.arguments) for c in turn.tool_calls or ())
        return ChatMessage(turn.role, turn.content, calls, turn.tool_call_id, turn.name)


class RunStartedData(_Frozen):
    """The data of `run.started`."""

    config: dict[str, Any]
    config_hash: str
    question: str
    coordinator: str
    backend: str
    library_version: str
    # The config file's folder, where a `module:...` loop or verifier beside it is imported from
    config_dir: str | None = Field(None, exclude_if=_absent)
    # A chat's run (the loop gateway's): its turns before the question, (role, content) each
    # (a turn with tool calls or a tool's result: a TurnData), which every sampled lane sends
    # ahead of its prompt (the user's turn) through the backend's chat template; empty where
    # the question is the chat's only turn.
    conversation: list[tuple[str, str] | TurnData] | None = Field(None, exclude_if=_absent)
    # Who asked (a gateway key's name, never the key) and the sha256 of what they sent: an
    # idempotent retry with another body is refused by it.
    caller: str | None = Field(None, exclude_if=_absent)
    request_sha256: str | None = Field(None, exclude_if=_absent)
    # The named budgets in the store the run spends from besides its own limits (its `[budget]
    # shared`, a gateway key's `key:<name>`): every later segment (resume, a retry, a
    # re-reduction) rejoins them. Absent in logs from before they were recorded.
    pools: list[BudgetName] | None = Field(None, exclude_if=_absent)
    # The tools the run carries (OpenAI's form, `{"type": "function", "function": {...}}`) and
    # its `tool_choice`: every sampled lane is sent them, and every reader of the log reads a
    # `tool_call` answer with them. Absent where the run has none.
    tools: list[dict[str, Any]] | None = Field(None, exclude_if=_absent)
    tool_choice: str | None = Field(None, exclude_if=_absent)


class RunStarted(Event):
    """`run.started`, first in every log: the resolved config, the question and what runs it."""

    type: Literal["run.started"] = "run.started"
    data: RunStartedData


class RunResumedData(_Frozen):
    """The data of `run.resumed`."""

    resumed_after_sequence: Count
    # (wave, lane) dispatched but never landed: a crash cut them off; each is charged its hold
    in_flight: list[tuple[int, int]] = []
    torn_tail_bytes: Count = 0  # bytes of a half-written last line that were cut off
    torn_tail_line: int | None = Field(None, ge=1)
    active_seconds_before: Amount = 0.0  # wall time the run ran before this resume


class RunResumed(Event):
    """`run.resumed`, at each resume: the lanes a crash cut off (charged their holds), a torn
    tail cut, the active seconds so far."""

    type: Literal["run.resumed"] = "run.resumed"
    data: RunResumedData


class RunCompletedData(_Frozen):
    """The data of `run.completed`: the run's result, as `RunResult` serializes it."""

    result: dict[str, Any]


class RunCompleted(Event):
    """`run.completed`, last on success (re-reductions may follow): the result object."""

    type: Literal["run.completed"] = "run.completed"
    data: RunCompletedData


class RunFailedData(_Frozen):
    """The data of `run.failed`."""

    error: str
    message: str
    exit_code: int


class RunFailed(Event):
    """`run.failed`, last on failure: the error's class, its message and the exit code."""

    type: Literal["run.failed"] = "run.failed"
    data: RunFailedData


class RunInterruptedData(_Frozen):
    """The data of `run.interrupted`: why, and the lanes it cut off."""

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

    tokens: Count = 0
    cost_usd: Amount = 0.0
    requests: Count = 0


Bill = Literal["sample", "verifier"]
"""The line of the bill a wave's lanes are priced on: sampled answers, or verifier passes."""


def bill_of(purpose: str) -> Bill:
    """The bill line a wave is priced on when it does not say: judges are verifier passes."""
    return "verifier" if purpose == "judge" else "sample"


class WaveStartedData(_Frozen):
    """The data of `wave.started`."""

    purpose: str  # what the loop calls the wave: "sample", "judge", "critique", ...
    k: Count
    k_requested: Count
    lane_max_tokens: Count
    prompt_tokens: Count | None
    share_prefix: bool
    reservation: ReservationData
    bill: Bill = "sample"  # the bill line its lanes are priced on
    # The lane numbers the wave was given (k of them; a loop may number lanes itself): no
    # other lane is ever dispatched in it. Logs written before it was recorded leave it out.
    lanes: list[int] | None = Field(None, exclude_if=_absent)
    # sha256 of the wave's spec (prompts and params): a resumed loop asking for another spec
    # for this wave is refused, never silently mixed
    fingerprint: str | None = Field(None, exclude_if=_absent)

    @model_validator(mode="before")
    @classmethod
    def _default_bill(cls, value: Any) -> Any:
        if isinstance(value, dict) and "bill" not in value and "purpose" in value:
            value = {**value, "bill": bill_of(str(value["purpose"]))}
        return value

    @model_validator(mode="after")
    def _k_lanes(self) -> WaveStartedData:
        if self.k > self.k_requested:
            raise ValueError(f"k {self.k} is more than the {self.k_requested} lanes asked for")
        if self.lanes is not None and (len(self.lanes) != self.k or len(set(self.lanes)) != self.k):
            raise ValueError(f"lanes {self.lanes} are not {self.k} distinct lane numbers")
        return self


class WaveStarted(Event):
    """`wave.started`, before a wave is dispatched: its lanes, their allotment and its hold."""

    type: Literal["wave.started"] = "wave.started"
    data: WaveStartedData


class LaneDispatchedData(_Frozen):
    """The data of `lane.dispatched`: the attempt's seed, its ceiling, its request and its hold."""

    seed: int
    max_tokens: Count
    request: Count  # which backend request of the wave carries this lane
    reserved: UsageData  # the worst case this attempt may spend
    reserved_cost_usd: Amount
    reserved_requests: int = Field(ge=0, le=1)  # 1 on the lane that pays for the request


class LaneDispatched(Event):
    """`lane.dispatched`, before the backend is called for a lane's attempt: its seed and hold."""

    type: Literal["lane.dispatched"] = "lane.dispatched"
    data: LaneDispatchedData


class LaneCompletedData(_Frozen):
    """The data of `lane.completed`."""

    text: str
    answer: str | None = None
    # Why the extractor found no answer in `text`, where it says (a structured answer: not
    # JSON, not valid under the schema, not a call of the run's tools); absent otherwise
    answer_error: str | None = Field(None, exclude_if=_absent)
    finish_reason: str
    usage: UsageData
    cost_usd: Amount
    logprob_mean: float | None = None
    backend: dict[str, Any] = {}


class LaneCompleted(Event):
    """`lane.completed`, after the backend answered a lane: its text, answer, usage and cost."""

    type: Literal["lane.completed"] = "lane.completed"
    data: LaneCompletedData


class LaneFailedData(_Frozen):
    """The data of `lane.failed`."""

    error: str
    message: str
    retryable: bool
    final: bool  # no further attempt will be made
    billed: UsageData = UsageData()
    billed_cost_usd: Amount = 0.0
    # The attempt was cut off before it answered (a timeout, the deadline, a fatal error in
    # its wave): `billed` is its whole hold, on the bill's cut-off line, not as decode.
    cut_off: bool = Field(False, exclude_if=lambda v: not v)


class LaneFailed(Event):
    """`lane.failed`: a lane's attempt failed; whether it is retried, and what it was billed."""

    type: Literal["lane.failed"] = "lane.failed"
    data: LaneFailedData


class LaneInterruptedData(_Frozen):
    """An attempt in flight when the run was interrupted: charged its hold, run again on resume."""

    reason: str
    billed: UsageData = UsageData()
    billed_cost_usd: Amount = 0.0


class LaneInterrupted(Event):
    """`lane.interrupted`: the run was interrupted with this lane in flight."""

    type: Literal["lane.interrupted"] = "lane.interrupted"
    data: LaneInterruptedData


class WaveBarrierData(_Frozen):
    """The data of `wave.barrier`: the lanes that completed and those that failed for good."""

    completed: list[int]
    failed: list[int]


class WaveBarrier(Event):
    """`wave.barrier`: every lane of the wave landed or failed for good."""

    type: Literal["wave.barrier"] = "wave.barrier"
    data: WaveBarrierData


# -- reduce -------------------------------------------------------------------------------------


class JudgeCompletedData(_Frozen):
    """The data of `judge.completed`."""

    candidate_lane: int
    score: float | None  # None: the judge's output held no score (an abstention)
    judge: str  # "llm" or the verifier's name ("module:function", "command:...")
    detail: str = ""
    candidate_wave: int = Field(1, exclude_if=lambda v: v == 1)
    reduction: int = Field(1, exclude_if=lambda v: v == 1)  # which reduce it belongs to
    passed: bool | None = Field(None, exclude_if=_absent)  # a verifier's pass/fail
    error: str | None = Field(None, exclude_if=_absent)  # the verifier failed: how


class JudgeCompleted(Event):
    """`judge.completed`: one verdict on a candidate, an LLM judge's score or a verifier's."""

    type: Literal["judge.completed"] = "judge.completed"
    data: JudgeCompletedData


class ReduceStartedData(_Frozen):
    """A re-reduction of a finished run (`orchestrator reduce`): its number and settings."""

    reduction: int
    reducer: str
    extract: dict[str, Any] | None = None  # the extractor it reads answers with, if not the run's
    candidate_waves: list[int] = [1]  # the waves whose lanes it reduces
    first_wave: int  # the number of the first wave it may start (a judge's, usc's)


class ReduceStarted(Event):
    """`reduce.started`: a re-reduction of a finished run begins (`orchestrator reduce`)."""

    type: Literal["reduce.started"] = "reduce.started"
    data: ReduceStartedData


class ReduceCompletedData(_Frozen):
    """The data of `reduce.completed`."""

    reducer: str
    winner: str | None
    winner_lane: int | None
    # Ballot counts for a plain vote, total weights for a weighted one. Logs written before
    # counts were integers hold them as floats (5.0), and still read.
    votes: dict[str, int] | dict[str, float] = {}
    scores: dict[int, float | None] = {}
    tie_break: str
    tied: list[Any] = []
    abstentions: int = 0
    reduction: int = 1  # 1: the run's own; 2, 3, ...: `orchestrator reduce` afterwards
    # the waves its candidates came from, when more than one (else the envelope's `wave`)
    candidate_waves: list[int] = Field([], exclude_if=lambda v: not v)
    # the winning lane's wave, where the candidates came from more than one (lanes are
    # numbered within a wave, so the number alone may not say which lane won)
    winner_wave: int | None = Field(None, exclude_if=_absent)
    agreement: float | None = Field(None, exclude_if=_absent)
    margin: float | None = Field(None, exclude_if=_absent)
    detail: dict[str, Any] = Field({}, exclude_if=lambda v: not v)


class ReduceCompleted(Event):
    """`reduce.completed`: the reducer decided, with the votes or scores it decided by."""

    type: Literal["reduce.completed"] = "reduce.completed"
    data: ReduceCompletedData


# -- budget and backend notes ---------------------------------------------------------------------


class BudgetWaveShrunkData(_Frozen):
    """The data of `budget.wave_shrunk`: the K asked for, the K funded, the limit that bound."""

    k_requested: Count
    k: Count
    limit: str
    shared: str | None = Field(None, exclude_if=_absent)  # the shared budget's name, if it bound


class BudgetWaveShrunk(Event):
    """`budget.wave_shrunk`: a wave's K was cut to what the budget funds."""

    type: Literal["budget.wave_shrunk"] = "budget.wave_shrunk"
    data: BudgetWaveShrunkData


class BudgetExhaustedData(_Frozen):
    """The data of `budget.exhausted`: the limit, what the quorum needed and what was left."""

    limit: str
    needed: Amount
    available: float = Field(allow_inf_nan=False)  # below 0 where an overrun spent past it
    k_fit: Count
    min_quorum: Count
    shared: str | None = Field(None, exclude_if=_absent)  # the shared budget's name, if it bound


class BudgetExhausted(Event):
    """`budget.exhausted`: the budget cannot fund a wave's quorum."""

    type: Literal["budget.exhausted"] = "budget.exhausted"
    data: BudgetExhaustedData


class BudgetOverrunData(_Frozen):
    """The data of `budget.overrun`: the limit, what was held and what was spent."""

    limit: str
    reserved: Amount
    actual: Amount


class BudgetOverrun(Event):
    """`budget.overrun`: a lane's actual spend was above its hold (a remote backend's estimate)."""

    type: Literal["budget.overrun"] = "budget.overrun"
    data: BudgetOverrunData


class BackendNotedData(_Frozen):
    """The data of a backend's note: what it learned, and its detail."""

    note: str
    detail: dict[str, Any] = {}


class BackendNoted(Event):
    """Something a backend learned that changes how it is driven (e.g. `n` unsupported)."""

    type: Literal["backend.n_unsupported"] = "backend.n_unsupported"
    data: BackendNotedData


# -- a loop's own events -----------------------------------------------------------------------

_LOOP_TYPE = re.compile(r"loop\.[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*")


class LoopEvent(Event):
    """An event a loop records for itself: `loop.<loop name>.<noun>` with a JSON data dict.

    Folded like the rest (the state keeps them in order, for the loop to read on resume).
    """

    type: str
    data: dict[str, Any]

    @field_validator("type")
    @classmethod
    def _loop_type(cls, value: str) -> str:
        if not _LOOP_TYPE.fullmatch(value):
            raise ValueError(f"{value!r} is not a loop event type (loop.<name>.<noun>)")
        return value


_KINDS: tuple[type[Event], ...] = (
    RunStarted,
    RunResumed,
    RunCompleted,
    RunFailed,
    RunInterrupted,
    WaveStarted,
    LaneDispatched,
    LaneCompleted,
    LaneFailed,
    LaneInterrupted,
    WaveBarrier,
    JudgeCompleted,
    ReduceStarted,
    ReduceCompleted,
    BudgetWaveShrunk,
    BudgetExhausted,
    BudgetOverrun,
    BackendNoted,
)
EVENT_TYPES: frozenset[str] = frozenset(kind.model_fields["type"].default for kind in _KINDS)
"""Every event type lanefold itself records (a loop's own, `loop.<name>.<noun>`, aside)."""


def _tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if isinstance(kind, str) and kind.startswith("loop."):
        return "loop"
    return kind if isinstance(kind, str) else None


AnyEvent = Annotated[
    Annotated[RunStarted, Tag("run.started")]
    | Annotated[RunResumed, Tag("run.resumed")]
    | Annotated[RunCompleted, Tag("run.completed")]
    | Annotated[RunFailed, Tag("run.failed")]
    | Annotated[RunInterrupted, Tag("run.interrupted")]
    | Annotated[WaveStarted, Tag("wave.started")]
    | Annotated[LaneDispatched, Tag("lane.dispatched")]
    | Annotated[LaneCompleted, Tag("lane.completed")]
    | Annotated[LaneFailed, Tag("lane.failed")]
    | Annotated[LaneInterrupted, Tag("lane.interrupted")]
    | Annotated[WaveBarrier, Tag("wave.barrier")]
    | Annotated[JudgeCompleted, Tag("judge.completed")]
    | Annotated[ReduceStarted, Tag("reduce.started")]
    | Annotated[ReduceCompleted, Tag("reduce.completed")]
    | Annotated[BudgetWaveShrunk, Tag("budget.wave_shrunk")]
    | Annotated[BudgetExhausted, Tag("budget.exhausted")]
    | Annotated[BudgetOverrun, Tag("budget.overrun")]
    | Annotated[BackendNoted, Tag("backend.n_unsupported")]
    | Annotated[LoopEvent, Tag("loop")],
    Discriminator(_tag),
]
"""Any event a log may hold, one model per type (a loop's own as `LoopEvent`): what `parse_event`
gives and a hook's `on_event` is handed."""

_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)


def parse_event(line: str | bytes) -> AnyEvent:
    """Validate one JSON line into its event model; raises pydantic.ValidationError (a line
    written in a newer schema than `SCHEMA_VERSION` too: `newer_schema` tells that one apart)."""
    return _ADAPTER.validate_json(line)


def newer_schema(line: str | bytes) -> int | None:
    """The schema version a line claims when it is newer than this library reads, else None.

    For a reader to name why a line does not parse: a log written by a newer lanefold is not
    corrupt, and its first unknown field is not the news. Only called on lines that failed.
    """
    try:
        claimed = json.loads(line).get("schemaversion")
    except (ValueError, AttributeError, RecursionError):  # not JSON, not an object, too deep
        return None
    if isinstance(claimed, int) and not isinstance(claimed, bool) and claimed > SCHEMA_VERSION:
        return claimed
    return None
