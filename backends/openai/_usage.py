"""Splitting one HTTP request's usage over the lanes it carried, never under-billing.

A server bills the prompt once per request and reports one `completion_tokens` for all of
its choices. The first lane of the request carries the prompt (cached prefill apart); the
completion tokens are split by each lane's own token count where logprobs give it, else by
characters. Where the choices evidently hold more tokens than the server reported (e.g.
llama-server counting one choice of an ``n > 1`` request), the larger number is billed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lanefold.primitives import Usage

__all__ = ("Apportioned", "Tally", "apportion", "split")


@dataclass(frozen=True, slots=True)
class Tally:
    """What one returned choice evidently holds."""

    token_count: int | None  # exact, from logprobs
    chars: int
    utf8_bytes: int
    hit_length: bool  # finish_reason "length": it holds exactly the request's max_tokens


@dataclass(frozen=True, slots=True)
class Apportioned:
    """Per-choice usage, how it was split, and the completion tokens billed in all."""

    usages: tuple[Usage, ...]
    method: str  # "single" | "tokens" | "characters" | "bytes_estimate"
    billed_completion_tokens: int
    reported_completion_tokens: int | None


def split(total: int, weights: Sequence[int]) -> list[int]:
    """Split `total` in proportion to `weights` by largest remainder; equal parts if all 0."""
    if not weights:
        return []
    if sum(weights) == 0:
        weights = [1] * len(weights)
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    left = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in order[:left]:
        parts[i] += 1
    return parts


def _known(tally: Tally, max_tokens: int) -> int | None:
    if tally.token_count is not None:
        return tally.token_count
    return max_tokens if tally.hit_length else None


def _completion_parts(tallies: Sequence[Tally], max_tokens: int, billed: int) -> tuple[list[int], str]:
    known = [_known(t, max_tokens) for t in tallies]
    fixed = sum(k for k in known if k is not None)
    free = [i for i, k in enumerate(known) if k is None]
    if not free:
        base = [k or 0 for k in known]
        extra = split(billed - fixed, base)  # server counted more (EOS, reasoning): same shape
        return [b + e for b, e in zip(base, extra, strict=True)], "tokens"
    parts = [k or 0 for k in known]
    floor = [1 if tallies[i].chars else 0 for i in free]  # a non-empty lane holds a token
    rest = split(billed - fixed - sum(floor), [tallies[i].chars for i in free])
    for i, f, r in zip(free, floor, rest, strict=True):
        parts[i] = f + r
    return parts, "characters"


def apportion(
    tallies: Sequence[Tally],
    *,
    prompt_tokens: int | None,
    cached_tokens: int,
    completion_tokens: int | None,
    max_tokens: int,
    prompt_bytes: int,
) -> Apportioned:
    """Usage of each choice of one HTTP request, in the order of `tallies`.

    `prompt_tokens`/`completion_tokens` are the server's figures, None where it sent no
    usage; then both are estimated from UTF-8 bytes, an upper bound of byte-level tokens.
    """
    if prompt_tokens is None or completion_tokens is None:
        outputs = [k if (k := _known(t, max_tokens)) is not None else t.utf8_bytes for t in tallies]
        usages = [
            Usage(input_tokens=prompt_bytes if i == 0 else 0, output_tokens=o) for i, o in enumerate(outputs)
        ]
        return Apportioned(tuple(usages), "bytes_estimate", sum(outputs), None)
    evident = sum(k if (k := _known(t, max_tokens)) is not None else (1 if t.chars else 0) for t in tallies)
    billed = max(completion_tokens, evident)
    parts, method = _completion_parts(tallies, max_tokens, billed)
    cached = min(cached_tokens, prompt_tokens)
    usages = [
        Usage(
            input_tokens=prompt_tokens - cached if i == 0 else 0,
            cached_input_tokens=cached if i == 0 else 0,
            output_tokens=part,
        )
        for i, part in enumerate(parts)
    ]
    if len(tallies) == 1:
        method = "single"
    return Apportioned(tuple(usages), method, billed, completion_tokens)
