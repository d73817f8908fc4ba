"""The `[loop]` keys every voting loop shares: which reducer, its tie-break and weighting.

One model and three helpers, so parallel_sample, adaptive_sample and debate validate them
alike and ask the backend for logprobs where the reducer weighs lanes by them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lanefold.primitives import (
    ConfigError,
    ReduceOptions,
    ReducerChoice,
    SamplingParams,
    resolve_reducer,
)

__all__ = ("ReducerKeys", "TieBreak", "Weighting", "known_reducer", "recorded_name", "with_logprobs")

TieBreak = Literal["first_lane", "lexicographic", "random"]
Weighting = Literal["none", "mean_logprob", "verifier"]


def known_reducer(value: str, key: str) -> str:
    """`value` if it names a registered reducer; else the registry's error, without its key
    (pydantic puts `key` in front)."""
    try:
        resolve_reducer(value, key=key)
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix(f"{key}: ")) from None
    return value


def recorded_name(reducer: str) -> str:
    """The name a run's `reduce.completed` records for `reducer`: a `module:attr` reducer
    records its class's name (imported already: the config named it)."""
    return str(resolve_reducer(reducer).name) if ":" in reducer else reducer


def with_logprobs(sampling: SamplingParams, reducer: str, weighting: str) -> SamplingParams:
    """`sampling`, asking for logprobs where the reducer weighs lanes by them: weighting by
    mean logprob, or a weighted_vote left at its default weighting."""
    wanted = weighting == "mean_logprob" or (reducer == "weighted_vote" and weighting == "none")
    return replace(sampling, logprobs=True) if wanted and not sampling.logprobs else sampling


class ReducerKeys(BaseModel):
    """`reducer`, `tie_break` and `weighting`, checked together."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reducer: str = Field("majority_vote", description="a registered reducer")
    tie_break: TieBreak = "first_lane"
    weighting: Weighting = "none"

    @field_validator("reducer")
    @classmethod
    def _known_reducer(cls, value: str) -> str:
        return known_reducer(value, "loop.reducer")

    @model_validator(mode="after")
    def _weighting_is_read(self) -> Self:
        if self.weighting == "verifier" and self.reducer != "weighted_vote":
            raise ValueError(
                f'loop.weighting: "verifier" weighs a weighted_vote; the '
                f"{self.reducer} reducer would ignore it"
            )
        return self

    def options(self, seed: int) -> ReduceOptions:
        """The reducer's options for a run of `seed`."""
        return ReduceOptions(tie_break=self.tie_break, weighting=self.weighting, seed=seed)

    def choice(self) -> ReducerChoice:
        """The reducer these keys name, as a loop declares it (`Loop.reducer`)."""
        return ReducerChoice(self.reducer, self.options(0))

    def sampling(self, sampling: SamplingParams) -> SamplingParams:
        return with_logprobs(sampling, self.reducer, self.weighting)
