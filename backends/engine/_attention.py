"""Attention over the paged KV cache, given one step's `AttentionBatch`.

Prefill runs `scaled_dot_product_attention` over each sequence's gathered context. Decode is
where forked branches pay off: the blocks a group of sequences shares (a prompt forked K ways,
or a preamble served from the prefix cache) are gathered once, and all the group's queries meet
them in one matrix product; each sequence then attends to its own remaining blocks, and one
softmax spans both parts, so the result is exactly full attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ("AttentionBatch", "paged_attention")


@dataclass(slots=True)
class AttentionBatch:
    """Where one step's new tokens go and what each sequence attends to.

    Tokens are flat (`N` of them); attention runs padded over `B` sequences: `query_index`
    `[B, Lq]` picks each sequence's new tokens, `block_tables` `[B, blocks]` its context (its
    own blocks only, after any shared prefix; `Lk = blocks * block_size`), `mask`
    `[B, 1, Lq, Lk]` causality and padding, `query_valid` `[B * Lq]` un-pads the output.
    `prefixes` (decode only) are `(rows, blocks)`: sequences and the leading blocks they share.
    """

    positions: Tensor
    write_slots: Tensor
    query_index: Tensor
    query_valid: Tensor
    block_tables: Tensor
    block_size: int
    mask: Tensor
    prefixes: list[tuple[Tensor, Tensor]] = field(default_factory=list)


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch) -> Tensor:
    """Attention output `[N, heads * D]` for the flat queries `q` `[N, heads, D]`."""
    if batch.prefixes:
        return _shared_prefix_decode(q, k_cache, v_cache, batch)
    b, lq = batch.query_index.shape
    qp = q[batch.query_index].transpose(1, 2)  # [B, heads, Lq, D]
    kp = _gather(k_cache, batch.block_tables, batch.block_size).transpose(1, 2)
    vp = _gather(v_cache, batch.block_tables, batch.block_size).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        qp, kp.to(q.dtype), vp.to(q.dtype), attn_mask=batch.mask, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(b * lq, -1)[batch.query_valid]


def _shared_prefix_decode(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch
) -> Tensor:
    b, heads, dim = q.shape  # one query per sequence
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    scale = dim**-0.5
    qg = q.view(b, kv_heads, group, dim)
    own_k = _gather(k_cache, batch.block_tables, batch.block_size).transpose(1, 2).to(q.dtype)
    own_v = _gather(v_cache, batch.block_tables, batch.block_size).transpose(1, 2).to(q.dtype)
    own = (qg @ own_k.transpose(-1, -2)) * scale  # [B, kv_heads, group, Lk]
    own = own.masked_fill(~batch.mask, float("-inf"))
    width = max(len(blocks) for _, blocks in batch.prefixes) * batch.block_size
    shared = own.new_full((b, kv_heads, group, width), float("-inf"))
    shared_v = []
    for rows, blocks in batch.prefixes:
        k = _gather(k_cache, blocks[None], batch.block_size)[0].to(q.dtype)  # [Lp, kv_heads, D]
        shared_v.append(_gather(v_cache, blocks[None], batch.block_size)[0].to(q.dtype))
        queries = qg[rows].permute(1, 0, 2, 3).reshape(kv_heads, -1, dim)  # [kv_heads, n*group, D]
        scores = (queries @ k.permute(1, 2, 0)) * scale  # [kv_heads, n*group, Lp]
        shared[rows, :, :, : k.shape[0]] = scores.view(kv_heads, len(rows), group, -1).transpose(
            0, 1
        )
    weights = torch.cat((shared, own), dim=-1).softmax(dim=-1)
    out = weights[..., width:] @ own_v  # [B, kv_heads, group, D]
    for (rows, _), v in zip(batch.prefixes, shared_v, strict=True):
        w = weights[rows, :, :, : v.shape[0]].transpose(0, 1).reshape(kv_heads, -1, v.shape[0])
        part = w @ v.transpose(0, 1)  # [kv_heads, n*group, D]
        out[rows] += part.view(kv_heads, len(rows), group, dim).transpose(0, 1)
    return out.reshape(b, heads * dim)


def _gather(store: Tensor, tables: Tensor, block_size: int) -> Tensor:
    """Context `[B, blocks * block_size, kv_heads, D]` of each table, copied a block at a time
    (index_select on whole blocks is several times faster than indexing slot by slot)."""
    blocks = store.view(-1, block_size, *store.shape[1:])
    b, width = tables.shape
    return blocks.index_select(0, tables.flatten()).view(b, width * block_size, *store.shape[1:])
