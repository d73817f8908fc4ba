"""`[backend] kind = "simulated"`: the keys, their defaults and their checks.

Every key added for the loop library (`seed`, `difficulty`, `answers`, the refine and debate
rates, `script`) defaults to "off", so a config without them says byte for byte what it said
before they existed.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from lanefold.primitives import LaneTokens, PrefixSharing, register_backend

if TYPE_CHECKING:
    from lanefold.backends.simulated._backend import SimulatedBackend

__all__ = ("ScriptRule", "SimulatedConfig")


class ScriptRule(BaseModel):
    """`[[backend.script]]`: a request of this `purpose` whose prompt `match`es gets `output`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    purpose: str = Field(min_length=1)
    match: str | None = None  # a regex searched in the prompt; none matches every prompt
    output: str

    @field_validator("match")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    def matches(self, purpose: str, prompt: str) -> bool:
        """Whether this rule answers a request of `purpose` with `prompt`."""
        return purpose == self.purpose and (self.match is None or re.search(self.match, prompt) is not None)


@register_backend("simulated")
class SimulatedConfig(BaseModel):
    """`[backend] kind = "simulated"`: what the simulated sampler says, how fast, how often it fails."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["simulated"] = "simulated"
    # A model name as free text (it changes no answer): what a gateway's `[serve] models` sets,
    # so a run over `LOOP/MODEL` records the model it stood for. Recorded only when given.
    model: str | None = Field(None, min_length=1, exclude_if=lambda v: v is None)
    answer: str = "391"
    accuracy: float = Field(0.6, ge=0, le=1)
    distractors: list[str] = ["381", "401", "293"]
    latency_ms: tuple[float, float] = (0.0, 0.0)
    failure_rate: float = Field(0.0, ge=0, le=1)
    prompt_tokens: LaneTokens = Field(64, ge=0)
    # A chat request's messages (and the tools it carries) each cost this many more prompt
    # tokens, as a chat template's markers would: held and billed alike (0: no template).
    template_tokens: LaneTokens = Field(0, ge=0)
    output_tokens: LaneTokens = Field(48, ge=1)
    shares_prefix: bool = True  # a request's lanes share its prompt's prefill
    # A prefix cache across requests: a prompt an earlier request sent is cached prefill
    # (`prefix_cache_tokens` of it at most: a block cache keeps whole blocks only).
    prefix_cache: bool = False
    prefix_cache_tokens: LaneTokens | None = Field(None, ge=0)
    judge_accuracy: float = Field(0.9, ge=0, le=1)
    judge_output_tokens: LaneTokens = Field(16, ge=1)
    lanes_per_request: int | None = Field(None, ge=1)
    call_log: str | None = None  # append "wave lane attempt" per lane attempt (tests count calls)
    # Per question (keyed by the prompt's first line): its accuracy ~ Beta(a, b), its gold answer.
    seed: int = 0
    difficulty: tuple[float, float] | None = None
    answers: dict[str, str] = {}
    # purpose "refine": copy an earlier attempt's answer instead of sampling afresh.
    copy_rate: float = Field(0.0, ge=0, le=1)
    explore_copy_factor: float = Field(0.5, ge=0, le=1)
    # purpose "debate": keep one's own answer, else adopt a peer's (biased toward the right one).
    debate_keep: float = Field(0.5, ge=0, le=1)
    debate_bias: float = Field(0.0, ge=0, le=1)
    script: list[ScriptRule] = []
    # A request with tools or a schema is answered with `answer` (or a distractor) alone, as
    # JSON text; with `vary_json` each lane spells it its own way (keys in another order,
    # numbers as 2.0 or 20e-1, spaces), as lanes of a real model do.
    vary_json: bool = False
    # An agent's later steps: a request whose messages hold n tool results (n >= 1) is answered
    # by every lane with the n-th entry (the last past the end), a call's JSON or a reply in
    # prose, as a model answers once its tools have spoken. Empty: `answer` at every step.
    after_tool_results: list[str] = []

    @field_validator("difficulty")
    @classmethod
    def _beta(cls, value: tuple[float, float] | None, info: ValidationInfo) -> tuple[float, float] | None:
        if value is None:
            return value
        if not (value[0] > 0 and value[1] > 0):
            raise ValueError("must be [a, b] with a > 0 and b > 0 (a Beta distribution)")
        if not info.data.get("distractors", True):
            raise ValueError("needs distractors (a question's accuracy may be below 1)")
        return value

    @field_validator("answers")
    @classmethod
    def _golds(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        distractors = set(info.data.get("distractors", ()))
        for question, gold in value.items():
            if not question.strip() or not gold.strip():
                raise ValueError("questions and their answers must not be empty")
            if distractors and not distractors - {gold}:
                raise ValueError(f"{question!r} has no distractor other than its answer {gold!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> SimulatedConfig:
        low, high = self.latency_ms
        if low < 0 or high < low:
            raise ValueError("latency_ms must be [min, max] with 0 <= min <= max")
        if self.accuracy < 1 and not self.distractors:
            raise ValueError("distractors must not be empty when accuracy < 1")
        return self

    def count_prompt_tokens(self, prompt: str) -> int:
        """Every prompt is `prompt_tokens` long here, whatever its text (as the backend bills)."""
        return self.prompt_tokens

    def prefix_sharing(self) -> PrefixSharing:
        """What these settings say of a prompt sent again, for an equal budget's fit."""
        return PrefixSharing(self.lanes_per_request, self.shares_prefix, self.prefix_cache)

    def build(self) -> SimulatedBackend:
        """The simulated backend these settings describe."""
        # Imported here: the backend's module imports this one (its default config).
        from lanefold.backends.simulated._backend import SimulatedBackend

        return SimulatedBackend(self)
