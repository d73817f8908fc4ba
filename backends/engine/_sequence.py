"""A branch being generated, and the request that groups a prompt's branches."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto
from typing import TYPE_CHECKING

from lanefold.backends.engine._metrics import RequestMetrics
from lanefold.backends.engine._output_text import OutputText
from lanefold.primitives import SamplingParams

if TYPE_CHECKING:
    from lanefold.backends.engine._grammar import LaneGrammar

__all__ = ("Alternatives", "EngineRequest", "Sequence", "Status")

# The most likely tokens at one output position as (token id, logprob), most likely first.
Alternatives = tuple[tuple[int, float], ...]


class Status(Enum):
    """Where a sequence is: waiting for a (re)prefill, decoding, or done."""

    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(slots=True, eq=False)
class Sequence:
    """One lane: its tokens, its KV block table and its noise key (`_sampler.lane_key`).

    `followers` are the other lanes of the request, forked from this one once its prompt is
    prefilled; they share its blocks and sample their first token from the same logits.
    `grammar`, where the request gave a schema, is this lane's own place in it (`_grammar`).
    """

    lane: int
    tokens: list[int]
    num_prompt: int
    max_tokens: int
    key: int
    metrics: RequestMetrics
    params: SamplingParams
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the pool
    followers: list[Sequence] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[Alternatives] = field(default_factory=list)  # beside `logprobs`, if asked
    finish_reason: str | None = None
    text: str = ""
    output: OutputText = field(default_factory=OutputText)  # grown a token at a time for stops
    kv_token_seconds: float = 0.0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    grammar: LaneGrammar | None = None

    @property
    def output_ids(self) -> list[int]:
        """Generated token ids so far."""
        return self.tokens[self.num_prompt :]

    @property
    def num_generated(self) -> int:
        """Number of generated tokens so far."""
        return len(self.tokens) - self.num_prompt


@dataclass(slots=True, eq=False)
class EngineRequest:
    """The lanes of one prompt, in lane order, and the request's metrics."""

    sequences: list[Sequence]
    metrics: RequestMetrics
    error: BaseException | None = None

    @property
    def finished(self) -> bool:
        """Whether every lane is done (or the request failed)."""
        return self.error is not None or all(s.status is Status.FINISHED for s in self.sequences)
