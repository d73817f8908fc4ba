"""Configuration of the OpenAI-compatible backend, validated at the boundary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lanefold.primitives import (
    ConfigError,
    PrefixSharing,
    PromptForm,
    check_headers,
    check_headers_env,
    headers_from_env,
    read_secret,
    register_backend,
)

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


@register_backend("openai")
class OpenAIConfig(BaseModel):
    """Where and how to reach an OpenAI-compatible server (vLLM, SGLang, llama.cpp, OpenAI).

    `base_url` ends at the API root, e.g. ``http://127.0.0.1:8000/v1``; requests go to
    ``{base_url}/chat/completions`` or ``{base_url}/completions`` by `api`. `api_key_env` is
    the NAME of the environment variable holding the key; the key itself never enters config.
    `headers` are sent with every request; a header that carries a secret (`api-key`,
    `X-Goog-Api-Key`, a cookie: `lanefold.primitives.check_headers`) is refused there and
    named in `headers_env` instead, header -> environment variable, read when the backend is
    built (a config is recorded with every run).
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
    headers_env: dict[str, str] = Field(default_factory=dict)
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
        return check_headers(value, instead="headers_env (a Bearer key: api_key_env)")

    @field_validator("headers_env")
    @classmethod
    def _check_headers_env(cls, value: dict[str, str]) -> dict[str, str]:
        return check_headers_env(value)

    @model_validator(mode="after")
    def _one_authorization(self) -> OpenAIConfig:
        named = {name.lower() for name in self.headers_env}
        if self.api_key_env is not None and "authorization" in named:
            raise ValueError("headers_env: Authorization is set by api_key_env or headers_env, not both")
        if named & {name.lower() for name in self.headers}:
            raise ValueError("headers_env: a header named in headers too")
        return self

    @field_validator("extra_body")
    @classmethod
    def _check_extra_body(cls, value: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(RESERVED_BODY_KEYS & value.keys())
        if clash:
            raise ValueError(f"extra_body may not set {clash}: the backend sets them per request")
        return value

    def prompt_forms(self) -> tuple[PromptForm, ...]:
        """`api = "chat"` sends chats (`/chat/completions`), `"completions"` raw text."""
        return ("chat",) if self.api == "chat" else ("raw",)

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
        """What `build` would refuse, found without building: an API key or a header from the
        environment it would not send."""
        errors: list[str] = []
        if self.api_key_env is not None:
            try:
                read_api_key(environ, self.api_key_env)
            except ConfigError as exc:
                errors.append(f"api_key_env: {exc}")
        try:
            headers_from_env(self.headers_env, environ)
        except ConfigError as exc:
            errors.append(str(exc))
        return errors


def read_api_key(environ: Mapping[str, str], name: str) -> str:
    """The API key in the environment variable `name`, refused (ConfigError) where it could
    not go in an `Authorization` header as it is: unset, empty, whitespace at either end (a
    CRLF from a .env file), a control or a non-ASCII character.

    The one check of a key read from the environment (`lanefold.primitives.read_secret`): the
    backend's `api_key_env` and `headers_env`, `serve --api-key-env`, and `validate` use it.
    The messages name the variable, never the value: a key is refused before it can reach a
    header (whose errors would quote it) or a log.
    """
    return read_secret(environ, name)
