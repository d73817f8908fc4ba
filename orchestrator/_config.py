"""Loop config files: TOML (or JSON) validated by pydantic, errors naming file and field."""

from __future__ import annotations

import importlib
import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backends.engine import EngineConfig
from backends.engine._config import resolve_model_path
from backends.openai import OpenAIConfig
from backends.simulated import SimulatedConfig
from primitives import ConfigError, ExtractSpec, Limits, Pricing, hash_config

if TYPE_CHECKING:
    from coordinators import Verifier
    from primitives import RunState

__all__ = (
    "VERSION",
    "BackendConfig",
    "LoopConfig",
    "config_hash",
    "import_verifier",
    "load_backend_config",
    "load_config",
    "parse_config",
    "preflight",
    "recorded_config",
)

VERSION = "0.1.0"  # recorded in every run.started: which version wrote a log

BackendConfig = Annotated[SimulatedConfig | EngineConfig | OpenAIConfig,
                          Field(discriminator="kind")]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoopSection(_Section):
    """`[loop]`: which coordinator, how many lanes, how many at once, the seed, the reducer."""

    coordinator: Literal["parallel_sample"] = "parallel_sample"
    k: int = Field(8, ge=1, le=100_000)
    max_concurrency: int = Field(16, ge=1)
    seed: int = 0
    reducer: Literal["majority_vote", "judge_argmax"] = "majority_vote"
    min_quorum: int = Field(1, ge=1)
    tie_break: Literal["first_lane", "lexicographic", "random"] = "first_lane"
    weighting: Literal["none", "mean_logprob"] = "none"
    timeout_s: float | None = Field(None, gt=0, description="per backend request")


class RetrySection(_Section):
    """`[retry]`: attempts per lane and exponential backoff with jitter between them."""

    max_attempts: int = Field(3, ge=1, le=100)
    initial_backoff_s: float = Field(0.25, ge=0)
    max_backoff_s: float = Field(8.0, ge=0)
    jitter: float = Field(0.25, ge=0, le=1)


class PromptSection(_Section):
    """`[prompt]`: the template every lane is sent, with `{question}` in it."""

    template: str = "Question: {question}\nThink briefly, then end with 'Answer: <answer>'.\n"

    @field_validator("template")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError("template must contain {question}")
        return value


class SamplingSection(_Section):
    """`[sampling]`: shared by every lane; `max_tokens` is each lane's ceiling."""

    temperature: float = Field(0.7, ge=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_tokens: int = Field(256, ge=1)
    stop: list[str] = []
    logprobs: bool = False


class JudgeSection(_Section):
    """`[judge]`: for `reducer = "judge_argmax"`: an LLM judge template or a Python verifier."""

    template: str | None = None
    verifier: str | None = Field(None, description="module:function returning a score")
    backend: BackendConfig | None = None
    temperature: float = Field(0.0, ge=0, le=5)
    max_tokens: int = Field(64, ge=1)

    @field_validator("template")
    @classmethod
    def _has_candidate(cls, value: str | None) -> str | None:
        if value is not None and "{candidate}" not in value:
            raise ValueError("template must contain {candidate}")
        return value

    @field_validator("verifier")
    @classmethod
    def _module_function(cls, value: str | None) -> str | None:
        if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
            raise ValueError("verifier must look like 'module:function'")
        return value


class LogSection(_Section):
    """`[log]`: when the event log is forced to disk."""

    fsync: Literal["always", "barrier", "never"] = "barrier"


class LoopConfig(_Section):
    """A whole loop config file."""

    loop: LoopSection = LoopSection()
    prompt: PromptSection = PromptSection()
    sampling: SamplingSection = SamplingSection()
    extract: ExtractSpec = ExtractSpec(regex=r"Answer:\s*(.+)")
    # The embedded default: the bundled engine on its bundled model (no server, no key).
    backend: BackendConfig = EngineConfig()
    budget: Limits = Limits()
    pricing: Pricing = Pricing()
    retry: RetrySection = RetrySection()
    judge: JudgeSection = JudgeSection()
    log: LogSection = LogSection()

    @model_validator(mode="after")
    def _consistent(self) -> LoopConfig:
        if self.loop.min_quorum > self.loop.k:
            raise ValueError(f"loop.min_quorum: {self.loop.min_quorum} is more than loop.k "
                             f"({self.loop.k})")
        if (self.loop.reducer == "judge_argmax" and self.judge.template is None
                and self.judge.verifier is None):
            raise ValueError("judge: reducer judge_argmax needs judge.template or judge.verifier")
        ignored = sorted(key for key in self.judge.model_fields_set
                         if getattr(self.judge, key) != JudgeSection.model_fields[key].default)
        if self.loop.reducer != "judge_argmax" and ignored:
            key = ignored[0]
            raise ValueError(f"judge.{key}: the {self.loop.reducer} reducer ignores [judge]; "
                             f"set loop.reducer = \"judge_argmax\" or remove it")
        return self


def parse_config(raw: dict[str, Any], *, source: str = "<config>") -> LoopConfig:
    """Validate a config mapping; a bad one raises ConfigError naming source and field.

    Validation is strict, as for JSON: `k = true` or `k = "8"` is an error, not a coercion.
    """
    bad = _non_finite(raw)
    if bad is not None:
        raise ConfigError(f"{source}: {bad or '(top level)'}: must be a finite number")
    try:
        document = json.dumps(raw, default=str)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: (top level): {exc}") from None
    try:
        return LoopConfig.model_validate_json(document, strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(_location(error["loc"]))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            where += ".kind"
        if error["type"] == "value_error" and not where:
            # A check across sections names its own field: "loop.min_quorum: ...".
            where, _, message = str(error["ctx"]["error"]).partition(": ")
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(f"{source}: {where or '(top level)'}: {message}{more}") from None


def _non_finite(value: object, where: str = "") -> str | None:
    """The dotted place of the first NaN or infinity in a config (TOML has `nan` and `inf`)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items: list[tuple[object, object]] = []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(enumerate(value))
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _location(loc: tuple[int | str, ...]) -> list[str]:
    # pydantic puts the union member's tag after `backend`; the user wrote no such key.
    parts: list[str] = []
    for i, part in enumerate(loc):
        if i > 0 and loc[i - 1] == "backend" and part in _BACKEND_KINDS:
            continue
        parts.append(str(part))
    return parts


_BACKEND_KINDS = frozenset({"simulated", "engine", "openai"})


def load_config(path: str | Path) -> LoopConfig:
    """Read a TOML (or `.json`) loop config file."""
    path = Path(path)
    return parse_config(_read(path), source=str(path))


def load_backend_config(path: str | Path) -> BackendConfig:
    """Read a backend config: a file holding a `[backend]` table, or only the backend's keys."""
    path = Path(path)
    raw = _read(path)
    section = raw.get("backend", raw)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: backend: must be a table")
    return parse_config({"backend": section}, source=str(path)).backend


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: "
                          f"{exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): must be a table")
    return raw


def preflight(config: LoopConfig, source: str = "<config>") -> None:
    """What validation alone cannot see, checked before a run is created: the verifier
    imports, and each engine model exists."""
    if config.judge.verifier is not None:
        try:
            import_verifier(config.judge.verifier)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    for where, backend in (("backend", config.backend), ("judge.backend", config.judge.backend)):
        if isinstance(backend, EngineConfig):
            try:
                resolve_model_path(backend.model)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {where}.model: {exc}") from None


def import_verifier(spec: str) -> Verifier:
    """The callable a `module:function` verifier names."""
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # a user's module may fail to import in any way
        raise ConfigError(f"judge.verifier: cannot import {spec!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"judge.verifier: {spec!r} is not callable")
    return target  # type: ignore[no-any-return]


def recorded_config(state: RunState, source: str) -> LoopConfig:
    """The config a log recorded, validated by this version; names the field and the
    version that wrote it when it no longer validates."""
    assert state.started is not None
    try:
        return parse_config(state.started.config, source=f"{source}:1: recorded config")
    except ConfigError as exc:
        raise ConfigError(f"{exc} (written by lanefold {state.started.library_version}, this is "
                          f"{VERSION})") from None


def config_hash(config: LoopConfig) -> str:
    """sha256 of the resolved config's canonical JSON: two runs with one hash ran one config."""
    return hash_config(config.model_dump(mode="json"))
