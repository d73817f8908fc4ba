"""Loop config files: TOML (or JSON) validated by pydantic, errors naming file and field."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from backends.engine import EngineConfig
from backends.openai import OpenAIConfig
from backends.simulated import SimulatedConfig
from primitives import ConfigError, ExtractSpec, Limits, Pricing

__all__ = (
    "BackendConfig",
    "LoopConfig",
    "config_hash",
    "load_backend_config",
    "load_config",
    "parse_config",
)

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
    backend: BackendConfig = SimulatedConfig()
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
        return self


def parse_config(raw: dict[str, Any], *, source: str = "<config>") -> LoopConfig:
    """Validate a config mapping; a bad one raises ConfigError naming source and field.

    Validation is strict, as for JSON: `k = true` or `k = "8"` is an error, not a coercion.
    """
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


def config_hash(config: LoopConfig) -> str:
    """sha256 of the resolved config's canonical JSON: two runs with one hash ran one config."""
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
