"""What the engine measured: per request (for usage and `Sample.extra`) and over its life."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lanefold.backends.engine._blocks import BlockPool
    from lanefold.backends.engine._sequence import Sequence

__all__ = ("EngineMetrics", "RequestMetrics", "charge_residency")


@dataclass(slots=True)
class RequestMetrics:
    """One request: prompt computed once, served from cache, decoded, and KV held."""

    prompt_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    recomputed_tokens: int = 0  # re-prefilled after a preemption
    decode_tokens: int = 0
    peak_kv_blocks: int = 0
    kv_block_seconds: float = 0.0
    cow_block_copies: int = 0

    def as_extra(self) -> dict[str, object]:
        """The figures as plain values for `Sample.extra`."""
        return asdict(self)


@dataclass(slots=True)
class EngineMetrics:
    """Totals over the engine's life; `tokens_computed` counts every token pushed through."""

    steps: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    tokens_computed: int = 0
    prompt_tokens_cached: int = 0
    preemptions: int = 0
    peak_kv_blocks: int = 0
    cow_block_copies: int = 0


def charge_residency(sequences: Iterable[Sequence], pool: BlockPool, seconds: float) -> None:
    """Charge `seconds` of KV residency to every sequence holding blocks.

    A block shared by n tables costs each of them 1/n of its slots, so the lanes of a request
    add up to the memory it really held; the request is charged its distinct blocks.
    """
    held: dict[int, set[int]] = {}
    owners: dict[int, RequestMetrics] = {}
    for seq in sequences:
        share = sum(pool.block_size / pool.blocks[b].ref_count for b in seq.block_table)
        seq.kv_token_seconds += share * seconds
        key = id(seq.metrics)
        owners[key] = seq.metrics
        held.setdefault(key, set()).update(seq.block_table)
    for key, blocks in held.items():
        metrics = owners[key]
        metrics.kv_block_seconds += len(blocks) * seconds
        metrics.peak_kv_blocks = max(metrics.peak_kv_blocks, len(blocks))
