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

Every message passes through a `Redactor` before it is cut short, so a server that echoes the
key, or a part of it, cannot leak it.
"""

from __future__ import annotations

import json
import re
import string
import urllib.parse
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

from pydantic import ValidationError

from lanefold.primitives import (
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
    "first_line",
    "invalid_body",
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
    """Cuts the API key out of text: every run that shares 8 characters with the key.

    Matching ignores ASCII case and covers the key's JSON-, repr- and percent-escaped forms,
    so a server that echoes the key, a part of it (its first 12 characters, say), upper-cased
    or escaped, leaks nothing. Callers redact a whole text before cutting it short: a cut
    could leave a piece too short to recognise. Its repr never shows the key.
    """

    __slots__ = ("_grams", "_more", "_width")

    def __init__(self, secret: str | None, *more: str | None) -> None:
        forms = _forms(secret) if secret else set()
        self._width = min(_RUN, len(secret)) if secret else 0
        self._grams = frozenset(
            form[i : i + self._width] for form in forms for i in range(len(form) - self._width + 1)
        )
        # Further secrets (headers from the environment), each cut out in turn.
        self._more = Redactor(*more) if more else None

    def __call__(self, text: str) -> str:
        if self._more is not None:
            text = self._more(text)
        width = self._width
        if not self._grams or len(text) < width:
            return text
        lowered = text.translate(_ASCII_LOWER)  # one character for one: indices stay put
        spans: list[list[int]] = []
        for i in range(len(text) - width + 1):
            if lowered[i : i + width] in self._grams:
                if spans and i <= spans[-1][1]:
                    spans[-1][1] = i + width
                else:
                    spans.append([i, i + width])
        if not spans:
            return text
        out, at = [], 0
        for start, end in spans:
            out += [text[at:start], _REDACTED]
            at = end
        out.append(text[at:])
        return "".join(out)

    def __repr__(self) -> str:
        return "Redactor(<hidden>)"


_RUN = 8  # a run of this many of the key's characters is the key
_REDACTED = "[redacted]"
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _forms(secret: str) -> set[str]:
    """The key as it may appear in text: as is, JSON-, repr- or percent-escaped; lower case."""
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        repr(secret)[1:-1],
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret, safe=""),
    }
    return {form.translate(_ASCII_LOWER) for form in forms}


def _as_is(text: str) -> str:
    return text


def server_message(body: bytes, redact: Callable[[str], str] = _as_is) -> str:
    """The human message of an error body (OpenAI's shape, FastAPI's, or the raw text),
    redacted, then cut to 500 characters."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return redact(text)[:_MAX_MESSAGE]
    found: object = data
    if isinstance(data, dict):
        found = data.get("error", data.get("message", data.get("detail", data)))
        if isinstance(found, dict):
            parts = [found.get("message"), found.get("code"), found.get("type")]
            found = " ".join(str(p) for p in parts if p) or json.dumps(found)
    return redact(found if isinstance(found, str) else json.dumps(found))[:_MAX_MESSAGE]


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
    detail = server_message(body, redact) or "(empty body)"
    message = redact(f"HTTP {status} from {where}: {detail}")
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


def invalid_body(exc: ValidationError) -> str:
    """What a response body's ValidationError found, without the input it quotes (the
    server's text, which a traceback or a log would show unredacted)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" and {len(errors) - 1} more" if len(errors) > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"


def first_line(exc: BaseException, redact: Callable[[str], str]) -> str:
    """The first line of an exception's text, redacted before it is cut to 300 characters."""
    text = redact(str(exc)).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
