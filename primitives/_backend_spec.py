"""The backend kind: what a `[backend]` table validates into, and the registry of them.

A backend registers its config model, a pydantic model with a `kind` field, which declares how
to build its Backend (`build`) and, optionally, what the facade checks before a run is created
(`preflight`), what building would refuse, found without building (`build_errors`), a prompt's
token count known from the settings alone (`count_prompt_tokens`, a test double's fixed count), how it
reuses a prompt's prefill (`prefix_sharing`, which an equal budget's fit prices), the GPUs one
worker of it needs (`gpus`), the prompt forms its settings can send (`prompt_forms`) and its
deprecated keys in use (`deprecated`). The
facade knows no backend by name: `[backend] kind` picks the registered model (or names one as
`module:Class`), validates the table with it, and asks it for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from lanefold.primitives._backend import Backend
from lanefold.primitives._registry import NotOfKindError, Registry, _qualified

__all__ = (
    "BACKENDS",
    "PROMPT_FORMS",
    "BackendSpec",
    "PrefixSharing",
    "PromptForm",
    "backend_build_errors",
    "backend_deprecated",
    "backend_gpus",
    "backend_preflight",
    "backend_prompt_forms",
    "backend_prompt_tokens",
    "backend_sharing",
    "register_backend",
)

M = TypeVar("M", bound=type[BaseModel])

PromptForm = Literal["chat", "raw"]
"""How a lane's prompt reaches the model: "chat", as the user's turn of a chat the backend renders
through the model's chat template; "raw", as text the model continues (a completion)."""
PROMPT_FORMS: tuple[PromptForm, ...] = ("chat", "raw")
"""Every `PromptForm`: what a backend that declares none can send, "chat" first."""


@runtime_checkable
class BackendSpec(Protocol):
    """A validated `[backend]` table: its `kind` and how to build its Backend.

    Optional, where the backend has something to say before it is built (each returns one
    `key: what` line per problem, `key` one of its own keys; [] when there is none):
    `preflight() -> list[str]`, checked before a run is created (a model file exists), and
    `build_errors(environ) -> list[str]`, what `build()` would refuse, found without building
    (an API key, an optional extra), for `validate` and `serve`.
    """

    kind: str

    def build(self) -> Backend:
        """The Backend these settings describe, not loaded yet (heavy imports happen here)."""
        ...


def backend_preflight(spec: BackendSpec) -> list[str]:
    """The backend's own `preflight()` lines ([] when it declares none)."""
    hook: Callable[[], list[str]] | None = getattr(spec, "preflight", None)
    return list(hook()) if hook is not None else []


def backend_build_errors(spec: BackendSpec, environ: Mapping[str, str]) -> list[str]:
    """The backend's own `build_errors(environ)` lines ([] when it declares none)."""
    hook: Callable[[Mapping[str, str]], list[str]] | None = getattr(spec, "build_errors", None)
    return list(hook(environ)) if hook is not None else []


def backend_prompt_tokens(spec: BackendSpec, prompt: str) -> int | None:
    """The prompt's token count as the backend's settings alone know it
    (`count_prompt_tokens(text)`, e.g. a test double's fixed count), or None where it declares
    none (count it otherwise)."""
    hook: Callable[[str], int | None] | None = getattr(spec, "count_prompt_tokens", None)
    return hook(prompt) if callable(hook) else None


def backend_prompt_forms(spec: BackendSpec) -> tuple[PromptForm, ...]:
    """The prompt forms the backend's settings can send (`prompt_forms()`), the one it would
    pick first; both, "chat" first, where it declares none. An OpenAI backend on
    `/chat/completions` sends only chats, one on `/completions` only raw text."""
    hook: Callable[[], tuple[PromptForm, ...]] | None = getattr(spec, "prompt_forms", None)
    forms = tuple(hook()) if callable(hook) else PROMPT_FORMS
    return tuple(f for f in forms if f in PROMPT_FORMS) or PROMPT_FORMS


def backend_deprecated(spec: BackendSpec) -> list[str]:
    """The backend's deprecated keys in use (`deprecated()`: one `key: use X instead` line
    each), for the facade to warn of once where a config file is read."""
    hook: Callable[[], list[str]] | None = getattr(spec, "deprecated", None)
    return list(hook()) if callable(hook) else []


@dataclass(frozen=True, slots=True)
class PrefixSharing:
    """How a backend reuses a prompt's prefill, as its settings declare it (None: not
    declared; a pilot measures it): `lanes_per_request`, the most lanes one request carries
    (the backend's `max_lanes_per_request`); `within_request`, whether a request's lanes
    share its prompt's prefill (its `shares_prefix`); `across_requests`, whether it keeps a
    prompt's prefix for later requests (a prefix cache), so a prompt sent again is cached
    prefill rather than computed, in whole blocks of `cache_block` tokens (a prompt shorter than
    one block is computed again)."""

    lanes_per_request: int | None = None
    within_request: bool | None = None
    across_requests: bool | None = None
    cache_block: int = 1


def backend_sharing(spec: BackendSpec) -> PrefixSharing:
    """The backend's own `prefix_sharing()`, or nothing declared."""
    hook: Callable[[], PrefixSharing] | None = getattr(spec, "prefix_sharing", None)
    return hook() if callable(hook) else PrefixSharing()


def backend_gpus(spec: BackendSpec) -> float | None:
    """The GPUs one worker of this backend needs (`gpus()`): 0 where it declares none, None
    where it takes one if the cluster has any."""
    hook: Callable[[], float | None] | None = getattr(spec, "gpus", None)
    return hook() if callable(hook) else 0


def _check_backend(obj: Any, key: str) -> None:
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise NotOfKindError(f"{key}: {_qualified(obj)} is not a pydantic model")
    if "kind" not in obj.model_fields:
        raise NotOfKindError(f"{key}: {_qualified(obj)} is not a backend config (it has no 'kind' field)")
    if not callable(getattr(obj, "build", None)):
        raise NotOfKindError(f"{key}: {_qualified(obj)} is not a backend config (it has no 'build' method)")


def _own_kind(obj: Any) -> str | None:
    fields = getattr(obj, "model_fields", {})
    kind = fields["kind"].default if "kind" in fields else None
    return kind if isinstance(kind, str) else None


BACKENDS: Registry[type[BaseModel]] = Registry(
    "backend", key="backend.kind", check=_check_backend, name_of=_own_kind
)
"""The backends' config models by `[backend] kind`: `@register_backend` or the `lanefold.backends`
entry points."""


def register_backend(kind: str) -> Callable[[M], M]:
    """Class decorator on a backend's config model: `[backend] kind = "<kind>"` validates with
    it (unknown keys refused, whatever its own model config says) and builds its Backend."""

    def add(model: M) -> M:
        BACKENDS.add(kind, model)
        return model

    return add
