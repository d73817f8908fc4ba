"""Choosing every lane's next token at once, on the device that holds the logits.

Temperature, top-k and top-p are applied to the whole `[lanes, vocab]` batch, then one token per
row is drawn by inverting its cumulative distribution at one uniform number. That number is not
drawn from a random stream but hashed from (lane seed, position), so a lane's tokens depend only
on its seed and its logits, never on which lanes share the batch or in what order, and nothing
per lane (no generator, no Python loop) is needed: the same few integer operations run on CPU or
GPU, and only the chosen ids (and the log-probabilities asked for) leave the device. (Gumbel-max,
which needs a hashed number per vocabulary entry, measured 9x slower on CPU.)
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from torch import Tensor

from lanefold.primitives import SamplingParams

__all__ = (
    "SamplingBatch",
    "find_stop",
    "lane_key",
    "sample",
    "sample_token",
    "sample_with_alternatives",
)

_M32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a 32-bit value times one stays inside int64 on every device.
_MUL = (0x7FEB352D, 0x4ADA6B45, 0x2C1B3C6D)


def lane_key(seed: int) -> int:
    """A lane's 32-bit noise key from its seed (splitmix64: lanes get consecutive seeds)."""
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) & _M32


@dataclass(slots=True)
class SamplingBatch:
    """Each row's sampling parameters, as tensors on the logits' device.

    `keys` are `lane_key`s, `positions` the index of the token being drawn in the lane's
    output; the flags say which filters any row uses, so a batch without them sorts nothing.
    `allowed`, where some lane is held to a grammar (`_grammar.allowed_tokens`), says which ids
    each row may draw; the log-probabilities reported stay the model's own.
    """

    temperature: Tensor
    top_k: Tensor
    top_p: Tensor
    keys: Tensor
    positions: Tensor
    any_top_k: bool
    any_top_p: bool
    logprobs: bool
    any_sampled: bool = True
    any_greedy: bool = False
    top_logprobs: int = 0  # the most alternatives any row asked for (0: none, no top-k taken)
    allowed: Tensor | None = None  # [B, vocab] bool: the ids a row may draw (None: every id)

    @classmethod
    def build(
        cls,
        params: Seq[SamplingParams],
        keys: Seq[int],
        positions: Seq[int],
        device: torch.device,
        allowed: Tensor | None = None,
    ) -> SamplingBatch:
        """One host-to-device copy of every row's parameters (`allowed` is already there)."""
        rows = torch.tensor(
            [
                (p.temperature, p.top_p, p.top_k, k, n)
                for p, k, n in zip(params, keys, positions, strict=True)
            ],
            dtype=torch.float64,  # exact for 32-bit keys and any position
        ).to(device)
        logprobs = any(p.logprobs for p in params)
        return cls(
            temperature=rows[:, 0].float(),
            top_p=rows[:, 1].float(),
            top_k=rows[:, 2].long(),
            keys=rows[:, 3].long(),
            positions=rows[:, 4].long(),
            any_top_k=any(p.top_k > 0 for p in params),
            any_top_p=any(p.top_p < 1.0 for p in params),
            logprobs=logprobs,
            any_sampled=any(p.temperature > 0.0 for p in params),
            any_greedy=any(p.temperature <= 0.0 for p in params),
            # one more pass over the rows only where some asked for logprobs at all
            top_logprobs=max((p.top_logprobs for p in params if p.logprobs), default=0) if logprobs else 0,
            allowed=allowed,
        )


def sample(logits: Tensor, batch: SamplingBatch) -> tuple[Tensor, Tensor | None]:
    """Token ids `[B]` from fp32 logits `[B, vocab]`, and their log-probabilities under the
    model's own distribution (before temperature and filters) where any row asked for them.

    Temperature 0 is greedy.
    """
    tokens = _draw(logits, batch)
    if not batch.logprobs:
        return tokens, None
    logprobs = torch.log_softmax(logits, dim=1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs


def sample_with_alternatives(logits: Tensor, batch: SamplingBatch) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`sample` for a batch where some row asked for alternatives: token ids `[B]`, their
    log-probabilities `[B]`, and each row's `batch.top_logprobs` most likely token ids and
    log-probabilities `[B, N]` (most likely first), all from the one log-softmax the sampled
    token's log-probability comes from (the model's own distribution, before temperature and
    filters). A row that asked for fewer keeps the first of its N.
    """
    tokens = _draw(logits, batch)
    every = torch.log_softmax(logits, dim=1)
    top = every.topk(min(batch.top_logprobs, logits.shape[1]), dim=1)
    return tokens, every.gather(1, tokens[:, None])[:, 0], top.values, top.indices


def _draw(logits: Tensor, batch: SamplingBatch) -> Tensor:
    """One token id per row: greedy at temperature 0, else drawn at the row's hashed uniform,
    among the ids `batch.allowed` lets the row draw."""
    greedy = batch.temperature <= 0.0
    scaled: Tensor | None = None  # the logits over each row's temperature (1 where greedy)
    highest = logits  # what a greedy row takes the largest of
    if batch.any_sampled or batch.allowed is not None:
        scaled = logits / torch.where(greedy, 1.0, batch.temperature)[:, None]
        if batch.allowed is not None:  # masked in that fresh buffer: `logits` stay the model's
            highest = scaled.masked_fill_(batch.allowed.logical_not(), -torch.inf)
    tokens = highest.argmax(dim=1) if batch.any_greedy else None
    if batch.any_sampled:
        assert scaled is not None
        scaled = _filtered(scaled, batch)
        # unnormalised weights, cumulated in place: one [B, vocab] buffer, not three (on CPU
        # every fresh buffer of that size is fresh pages, which cost more than the arithmetic)
        cumulative = scaled.sub_(scaled.amax(dim=1, keepdim=True)).exp_().cumsum_(dim=1)
        total = cumulative[:, -1:]
        draw = _uniform(batch.keys, batch.positions)[:, None] * total
        # strictly below the total: the first entry above the draw then has a weight > 0
        draw = torch.minimum(draw, torch.nextafter(total, torch.zeros_like(total)))
        drawn = torch.searchsorted(cumulative, draw, right=True)[:, 0]
        drawn = drawn.clamp_(max=logits.shape[1] - 1)
        tokens = drawn if tokens is None else torch.where(greedy, tokens, drawn)
    assert tokens is not None, "a batch has a greedy or a sampled row"
    return tokens


def sample_token(logits: Tensor, params: SamplingParams, seed: int, position: int = 0) -> tuple[int, float]:
    """One row's token and log-probability (0.0 unless asked for): `sample` for a single lane."""
    batch = SamplingBatch.build([params], [lane_key(seed)], [position], logits.device)
    tokens, logprobs = sample(logits[None].float(), batch)
    return int(tokens[0]), float(logprobs[0]) if logprobs is not None else 0.0


def _filtered(scaled: Tensor, batch: SamplingBatch) -> Tensor:
    """`scaled` with the tokens top-k and top-p drop set to -inf.

    Top-k keeps every token at least as likely as the k-th (ties kept); top-p then keeps the
    smallest most-likely prefix of what is left whose mass reaches p (at least one token).
    """
    if not (batch.any_top_k or batch.any_top_p):
        return scaled
    vocab = scaled.shape[1]
    ordered, order = scaled.sort(dim=1, descending=True)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if batch.any_top_k:
        k = torch.where((batch.top_k > 0) & (batch.top_k < vocab), batch.top_k, vocab)
        keep &= ordered >= ordered.gather(1, (k - 1)[:, None])
    if batch.any_top_p:
        probs = ordered.masked_fill(~keep, -torch.inf).softmax(dim=1)
        before = probs.cumsum(dim=1) - probs  # mass ranked above each token
        keep &= (before < batch.top_p[:, None]) | (batch.top_p[:, None] >= 1.0)
    kept = torch.zeros_like(keep).scatter_(1, order, keep)
    return scaled.masked_fill(~kept, -torch.inf)


def _uniform(keys: Tensor, positions: Tensor) -> Tensor:
    """One number per row in (0, 1), hashed from the row's key and position (24 bits, fp32)."""
    bits = _mix(keys ^ _mix(positions & _M32))
    return ((bits >> 8).float() + 0.5) * 2.0**-24


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply rounds) of non-negative int64 values < 2**32."""
    for mul in _MUL:
        x = x ^ (x >> 16)
        x = (x * mul) & _M32
    return x ^ (x >> 16)


def find_stop(text: str, stops: tuple[str, ...], start: int = 0) -> int | None:
    """Index where the earliest stop string starts in `text` at or after `start`, or None."""
    found = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(found) if found else None
