"""HTTP statuses, bodies and transport failures mapped to the library's backend errors.

    401                    AuthenticationError (fatal)
    429                    RateLimitError        Retry-After honoured
    503, other 5xx         ServerError           Retry-After honoured where sent
    408                    BackendTimeoutError
    other 4xx              RequestRejectedError  the server's message
    4xx naming the context ContextLengthError
    connect/read timeout   BackendTimeoutError
    refused or dropped     ServerError
    truncated or malformed BadResponseError

Every message passes through a `Redactor`, so a server that echoes the key cannot leak it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

from primitives import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    ContextLengthError,
    RateLimitError,
    RequestRejectedError,
    ServerError,
)

__all__ = (
    "Redactor",
    "error_from_status",
    "parse_retry_after",
    "refuses_n",
    "server_message",
)

_CONTEXT = re.compile(
    r"context.length|context_length_exceeded|exceed_context_size|maximum context|context window",
    re.IGNORECASE,
)
# llama.cpp: "Only one completion choice is allowed"; others name the field.
_N_REFUSED = re.compile(
    r"only one (?:completion )?choice|\bn\s*(?:>|must|should|is not|not supported|=\s*1\b)"
    r"|['\"`]n['\"`]",
    re.IGNORECASE,
)
_MAX_MESSAGE = 500


class Redactor:
    """Replaces the API key in any text; its repr never shows the key."""

    __slots__ = ("_secret",)

    def __init__(self, secret: str | None) -> None:
        self._secret = secret or None

    def __call__(self, text: str) -> str:
        return text.replace(self._secret, "[redacted]") if self._secret else text

    def __repr__(self) -> str:
        return "Redactor(<hidden>)"


def server_message(body: bytes) -> str:
    """The human message of an error body: OpenAI's shape, FastAPI's, or the raw text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:_MAX_MESSAGE]
    found: object = data
    if isinstance(data, dict):
        found = data.get("error", data.get("message", data.get("detail", data)))
        if isinstance(found, dict):
            parts = [found.get("message"), found.get("code"), found.get("type")]
            found = " ".join(str(p) for p in parts if p) or json.dumps(found)
    return (found if isinstance(found, str) else json.dumps(found))[:_MAX_MESSAGE]


_N_LIMIT = re.compile(r"\bn\b\W.*?(?:<=|at most|maximum(?: of)?|up to)\s*(\d+)", re.IGNORECASE)


def n_limit(message: str) -> int | None:
    """The largest `n` a 400/422 message says the server takes, where it states one."""
    found = _N_LIMIT.search(message)
    return int(found.group(1)) if found else None


def refuses_n(message: str) -> bool:
    """Whether a 400/422 message says the server takes no ``n > 1``."""
    return _N_REFUSED.search(message) is not None


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; None if absent."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(seconds, 0.0) if seconds == seconds else None  # NaN is no answer


def error_from_status(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    where: str,
    redact: Callable[[str], str],
    now: float,
) -> BackendError:
    """The library error for a non-2xx response to `where` (e.g. "POST http://h/v1/...")."""
    detail = redact(server_message(body)) or "(empty body)"
    message = f"HTTP {status} from {where}: {detail}"
    retry_after = parse_retry_after(headers.get("retry-after"), now)
    if status == 401:
        return AuthenticationError(message)
    if status == 429:
        return RateLimitError(message, retry_after=retry_after)
    if status == 408:
        return BackendTimeoutError(message)
    if status >= 500:
        return ServerError(message, retry_after=retry_after)
    if _CONTEXT.search(detail):
        return ContextLengthError(message)
    return RequestRejectedError(message)
