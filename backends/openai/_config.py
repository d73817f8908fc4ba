"""Configuration of the OpenAI-compatible backend, validated at the boundary."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanefold.primitives import ConfigError, PrefixSharing, register_backend

if TYPE_CHECKING:
    from lanefold.backends.openai._backend import OpenAIBackend

__all__ = ("RESERVED_BODY_KEYS", "OpenAIConfig", "read_api_key")

# Fields the backend sets from the request; extra_body may not override them, or the
# budget (max_tokens), the lane split (n) or the seeds would silently stop holding.
RESERVED_BODY_KEYS = frozenset(
    {
        "model",
        "prompt",
        "messages",
        "n",
        "seed",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "logprobs",
        "top_logprobs",
    }
)

# Credentials come from the environment variable named by api_key_env, never from config.
_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key"})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 field name
_HEADER_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?)?")


@register_backend("openai")
class OpenAIConfig(BaseModel):
    """Where and how to reach an OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI).

    `base_url` ends at the API root, e.g. ``http://127.0.0.1:8000/v1``; requests go to
    ``{base_url}/chat/completions`` or ``{base_url}/completions`` by `api`. `api_key_env` is
    the NAME of the environment variable holding the key; the key itself never enters config.
    `n` says whether a request's lanes are merged into one ``n > 1`` request: "auto" merges
    until the server shows it does not honour ``n``, "always" never falls back, "never" sends
    one request per lane. `max_n` is the largest ``n`` of one request. `max_connections` caps
    the open connections; requests beyond it wait for one (the wait is not the server's fault,
    so it is no timeout).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["openai"] = "openai"
    base_url: str
    model: str = Field(min_length=1)
    api: Literal["chat", "completions"] = "chat"
    system_prompt: str | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    timeout_s: float = Field(default=60.0, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    n: Literal["auto", "always", "never"] = "auto"
    max_n: int = Field(default=16, ge=1)
    max_connections: int = Field(default=100, ge=1)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL: {exc}") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("base_url must be an http:// or https:// URL with a host")
        if url.username or url.password or url.query or url.fragment:
            raise ValueError("base_url may not carry credentials, a query or a fragment")
        return value.rstrip("/")

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if name.lower() in _CREDENTIAL_HEADERS:
                raise ValueError(
                    f"header {name!r} carries credentials; name an environment variable "
                    "in api_key_env instead"
                )
            # Refused here, not by httpx at the first request with a traceback quoting it.
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header {name!r} is not a valid header name")
            if not _HEADER_VALUE.fullmatch(text):
                raise ValueError(
                    f"header {name!r}: the value must be printable ASCII, with no whitespace at either end"
                )
        return value

    @field_validator("extra_body")
    @classmethod
    def _check_extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(RESERVED_BODY_KEYS & value.keys())
        if clash:
            raise ValueError(f"extra_body may not set {clash}: the backend sets them per request")
        return value

    def prefix_sharing(self) -> PrefixSharing:
        """Merged into `n`, a request's lanes share its prefill, `max_n` of them at most; one
        request a lane otherwise. Whether the server keeps a prefix across requests is its own
        (vLLM's prefix caching): not declared, a pilot measures it."""
        if self.n == "never":
            return PrefixSharing(1, within_request=False)
        return PrefixSharing(self.max_n, within_request=True)

    def build(self) -> OpenAIBackend:
        """The backend these settings describe (its API key read from the environment now)."""
        # Imported here: the backend's module imports this one.
        from lanefold.backends.openai._backend import OpenAIBackend

        return OpenAIBackend(self)

    def build_errors(self, environ: Mapping[str, str]) -> list[str]:
        """What `build` would refuse, found without building: an API key it would not send."""
        if self.api_key_env is None:
            return []
        try:
            read_api_key(environ, self.api_key_env)
        except ConfigError as exc:
            return [f"api_key_env: {exc}"]
        return []


def read_api_key(environ: Mapping[str, str], name: str) -> str:
    """The API key in the environment variable `name`, refused (ConfigError) where it could
    not go in an `Authorization` header as it is: unset, empty, whitespace at either end (a
    CRLF from a .env file), a control or a non-ASCII character.

    The one check of a key read from the environment: the backend's `api_key_env`, `serve
    --api-key-env`, and `validate` use it. The messages name the variable, never the value: a
    key is refused before it can reach a header (whose errors would quote it) or a log.
    """
    key = environ.get(name)
    if key is None:
        raise ConfigError(f"environment variable {name} is not set")
    if not key:
        raise ConfigError(f"environment variable {name} is empty")
    if key != key.strip():
        raise ConfigError(
            f"environment variable {name}: the key begins or ends with whitespace (a CRLF "
            "line ending from a .env file?); strip it"
        )
    if any(c < " " or c == "\x7f" for c in key):
        raise ConfigError(f"environment variable {name}: the key holds a control character")
    if not key.isascii():
        raise ConfigError(f"environment variable {name}: the key holds a non-ASCII character")
    return key
