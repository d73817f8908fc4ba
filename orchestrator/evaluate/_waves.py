"""How a loop's waves spend on the backend at hand: its requests, its prefill passes, its worst case.

A wave's lanes of one prompt travel in requests of at most `request_size` lanes (the
dispatcher's own rule, from `[loop] max_concurrency` and the backend's `lanes_per_request`).
Where the backend shares a request's prompt among its lanes, each request prefills the prompt
once; where it does not, each lane does. The first pass of a prompt in a question is computed;
a later pass of a prompt sent before (another request of a wave split by `max_concurrency`, a
later wave that sends it again) is what a cross-request prefix cache may serve, and is
computed again where the backend keeps none. `Passes` counts these for a path of waves; the
pilot (`_pilot`) measures how much of them a backend computes. `worst` is what the ledger holds
for a wave before it runs: every pass computed, every lane its `max_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lanefold.config import LoopConfig
from lanefold.primitives import Pricing, WaveShape
from lanefold.primitives.internal import backend_sharing, cost_shape, request_size, shape_waves

__all__ = ("Passes", "Serving", "passes", "path", "prefill_passes", "worst")


@dataclass(frozen=True, slots=True)
class Serving:
    """How the backend at hand takes a wave: `size` lanes of one prompt a request at most,
    `within` whether a request's lanes share its prefill, `across` whether it declares a
    prefix cache across requests (None: not declared), keeping whole `block`s of a prompt."""

    size: int
    within: bool
    across: bool | None
    block: int = 1

    @classmethod
    def of(cls, config: LoopConfig) -> Serving:
        """What `config`'s backend declares and its `[loop] max_concurrency` allows."""
        sharing = backend_sharing(config.backend)
        size = request_size(config.loop.max_concurrency, sharing.lanes_per_request)
        within = sharing.within_request is not False
        return cls(size, within, sharing.across_requests, max(1, sharing.cache_block))

    def declared_reuse(self, prompt: int) -> float:
        """The share of a `prompt`-token prompt sent again that the declared cache serves:
        its whole blocks; 0 without a declared cache."""
        if not self.across or prompt <= 0:
            return 0.0
        return (prompt // self.block * self.block) / prompt

    def passes_of(self, wave: WaveShape) -> int:
        """How many times the wave's prompts are prefilled: once a request where a request's
        lanes share it, else once a lane."""
        return wave.requests(self.size) if self.within else wave.lanes


@dataclass(frozen=True, slots=True)
class Passes:
    """A path's prompt tokens, each as (first prompt, growth beyond it): `seen` by its lanes,
    `fresh` (the first pass of each prompt), `again` (later passes of a prompt sent before);
    and its `lanes`."""

    lanes: int
    seen: tuple[float, float]
    fresh: tuple[float, float]
    again: tuple[float, float]


def path(waves: Sequence[WaveShape], lanes: int) -> list[WaveShape]:
    """The waves a question runs when it stops after `lanes` lanes: those before, and the
    last one cut to what it ran."""
    ran: list[WaveShape] = []
    left = lanes
    for wave in waves:
        if left <= 0:
            break
        ran.append(wave if wave.lanes <= left else wave.truncated(left))
        left -= wave.lanes
    return ran


def passes(waves: Sequence[WaveShape], first: int, serving: Serving) -> Passes:
    """The prefill passes of `waves`, a first prompt being `first` tokens (later prompts'
    tokens beyond it are growth)."""
    lanes, seen, fresh, again = 0, [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]
    for wave in waves:
        growth = max(0, wave.prompt_tokens - first)
        head = min(first, wave.prompt_tokens)
        count = serving.passes_of(wave)
        new = 0 if wave.repeat else min(wave.prompts, wave.lanes)
        lanes += wave.lanes
        for into, times in ((seen, wave.lanes), (fresh, new), (again, count - new)):
            into[0] += times * head
            into[1] += times * growth
    return Passes(lanes, (seen[0], seen[1]), (fresh[0], fresh[1]), (again[0], again[1]))


def worst(wave: WaveShape, serving: Serving, max_tokens: int, pricing: Pricing, unit: str) -> float:
    """What the ledger holds for `wave` before it runs: each prefill pass of its prompt
    computed (the rest of its lanes' prompts cached prefill), each lane `max_tokens`."""
    count = serving.passes_of(wave)
    prompt = wave.prompt_tokens
    if unit == "lanes":
        return float(wave.lanes)
    if unit == "tokens":
        return float(count * prompt + wave.lanes * max_tokens)
    cached = (wave.lanes - count) * prompt
    return 1e-6 * (
        count * prompt * pricing.input_per_mtok
        + cached * pricing.cached_input_per_mtok
        + wave.lanes * max_tokens * pricing.output_per_mtok
    )


def prefill_passes(config: LoopConfig) -> int:
    """How many times a question of `config` (its params as they are) prefills its prompts on
    the backend at hand, at most; 0 where its loop declares no shape."""
    shape = cost_shape(config.loop_class(), config.loop_params, prompt_tokens=1, max_tokens=1)
    if shape is None:
        return 0
    serving = Serving.of(config)
    return sum(serving.passes_of(wave) for wave in shape_waves(shape))
