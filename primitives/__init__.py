"""The governed substrate shared by every loop. Imports no other package of ours."""

from __future__ import annotations

from primitives._answers import ExtractMethod, ExtractSpec, extract_answer, normalize_answer
from primitives._backend import Backend, LaneRequest, Sample, SampleRequest, SamplingParams, Usage
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
from primitives._judge import (
    JudgeResult,
    JudgeTieBreak,
    judge_argmax,
    parse_score,
    render_judge_prompt,
    render_prompt,
)
from primitives._vote import Ballot, VoteResult, VoteTieBreak, logprob_weight, vote_fold

__all__ = (
    "AuthenticationError",
    "Backend",
    "BackendError",
    "BackendTimeoutError",
    "BadResponseError",
    "Ballot",
    "BudgetExhaustedError",
    "ConfigError",
    "ContextLengthError",
    "ExtractMethod",
    "ExtractSpec",
    "JudgeResult",
    "JudgeTieBreak",
    "LaneRequest",
    "LanefoldError",
    "LogCorruptError",
    "QuorumNotMetError",
    "RateLimitError",
    "RequestRejectedError",
    "RunError",
    "RunNotFoundError",
    "Sample",
    "SampleRequest",
    "SamplingParams",
    "ServerError",
    "Usage",
    "VoteResult",
    "VoteTieBreak",
    "extract_answer",
    "judge_argmax",
    "logprob_weight",
    "normalize_answer",
    "parse_score",
    "render_judge_prompt",
    "render_prompt",
    "vote_fold",
)
