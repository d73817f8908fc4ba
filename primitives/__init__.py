"""The governed substrate shared by every loop. Imports no other package of ours.

Events and event logs, the budget ledger, the dispatch path and its barrier, the run-state
fold, the Backend seam, and the pure answer/vote/judge functions.
"""

from __future__ import annotations

from primitives._answers import ExtractMethod, ExtractSpec, extract_answer, normalize_answer
from primitives._backend import (
    Backend,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    StreamingBackend,
    TextDelta,
    Usage,
)
from primitives._budget import Hold, Ledger, Limits, Pricing, Spend, cost_of
from primitives._dispatch import Dispatcher, LaneJob, RetryPolicy, WaveSpec, lane_seed
from primitives._errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BadResponseError,
    BudgetExhaustedError,
    ConfigError,
    ContextLengthError,
    LanefoldError,
    LogCorruptError,
    QuorumNotMetError,
    RateLimitError,
    RequestRejectedError,
    RunError,
    RunNotFoundError,
    ServerError,
)
from primitives._eventlog import (
    EventLog,
    FsyncPolicy,
    JsonlEventLog,
    MemoryEventLog,
    TornTail,
    validate_run_id,
)
from primitives._events import AnyEvent, Event, parse_event
from primitives._judge import (
    JudgeResult,
    JudgeTieBreak,
    judge_argmax,
    parse_score,
    render_judge_prompt,
    render_prompt,
)
from primitives._record import Recorder
from primitives._state import LaneState, RunState, WaveState, apply, fold
from primitives._vote import Ballot, VoteResult, VoteTieBreak, logprob_weight, vote_fold

__all__ = (
    "AnyEvent",
    "AuthenticationError",
    "Backend",
    "BackendError",
    "BackendTimeoutError",
    "BadResponseError",
    "Ballot",
    "BudgetExhaustedError",
    "ConfigError",
    "ContextLengthError",
    "Dispatcher",
    "Event",
    "EventLog",
    "ExtractMethod",
    "ExtractSpec",
    "FsyncPolicy",
    "Hold",
    "JsonlEventLog",
    "JudgeResult",
    "JudgeTieBreak",
    "LaneJob",
    "LaneRequest",
    "LaneState",
    "LanefoldError",
    "Ledger",
    "Limits",
    "LogCorruptError",
    "MemoryEventLog",
    "Pricing",
    "QuorumNotMetError",
    "RateLimitError",
    "Recorder",
    "RequestRejectedError",
    "RetryPolicy",
    "RunError",
    "RunNotFoundError",
    "RunState",
    "Sample",
    "SampleRequest",
    "SamplingParams",
    "ServerError",
    "Spend",
    "StreamingBackend",
    "TextDelta",
    "TornTail",
    "Usage",
    "VoteResult",
    "VoteTieBreak",
    "WaveSpec",
    "WaveState",
    "apply",
    "cost_of",
    "extract_answer",
    "fold",
    "judge_argmax",
    "lane_seed",
    "logprob_weight",
    "normalize_answer",
    "parse_event",
    "parse_score",
    "render_judge_prompt",
    "render_prompt",
    "validate_run_id",
    "vote_fold",
)
