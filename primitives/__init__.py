"""The governed substrate shared by every loop. Imports no other package of ours."""

from __future__ import annotations

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

__all__ = (
    "AuthenticationError",
    "Backend",
    "BackendError",
    "BackendTimeoutError",
    "BadResponseError",
    "BudgetExhaustedError",
    "ConfigError",
    "ContextLengthError",
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
)
