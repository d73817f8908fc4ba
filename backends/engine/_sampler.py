"""Choosing the next token of one branch from its logits.

Each branch draws from its own `torch.Generator`, one uniform number per token, so its tokens
depend only on its seed and its logits, never on which other branches share the batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from primitives import SamplingParams

__all__ = ("find_stop", "new_generator", "sample_token")


def new_generator(seed: int) -> torch.Generator:
    """A CPU random stream for one branch.

    The seed is mixed first (splitmix64): lanes usually get consecutive seeds, and the first
    draws of Mersenne Twisters seeded 10, 11, 12... are visibly clustered.
    """
    return torch.Generator(device="cpu").manual_seed(_splitmix64(seed) >> 1)


def _splitmix64(seed: int) -> int:
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def sample_token(
    logits: Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[int, float]:
    """Pick a token from one row of fp32 CPU logits; returns it and its log-probability.

    The log-probability is under the model's own distribution (before temperature, top-k, top-p).
    Temperature 0 is greedy.
    """
    if params.temperature <= 0.0:
        token = int(torch.argmax(logits))
    else:
        probs = _filtered_probs(logits / params.temperature, params.top_k, params.top_p)
        cumulative = torch.cumsum(probs, dim=0)
        draw = torch.rand((), generator=generator) * cumulative[-1]
        token = min(int(torch.searchsorted(cumulative, draw, right=True)), logits.shape[0] - 1)
        while probs[token] == 0:  # a draw on the exact upper edge of a kept token's interval
            token -= 1
    logprob = float(torch.log_softmax(logits, dim=0)[token]) if params.logprobs else 0.0
    return token, logprob


def _filtered_probs(scaled: Tensor, top_k: int, top_p: float) -> Tensor:
    if top_k > 0 and top_k < scaled.shape[0]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=0)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        before = torch.cumsum(sorted_probs, dim=0) - sorted_probs  # mass ranked above each token
        drop = before >= top_p  # keep the smallest prefix reaching top_p (at least one token)
        probs = probs.scatter(0, order[drop], 0.0)
    return probs


def find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string starts in `text`, or None."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None
