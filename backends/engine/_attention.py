"""Attention over the paged KV cache, given one step's `AttentionBatch`.

Queries, keys and values arrive in the dtype attention runs in (`_model` upcasts them where the
CPU only emulates the model's dtype); what is read from the cache is converted to it.

Prefill runs `scaled_dot_product_attention` over each sequence's gathered context. Decode is
where forked branches pay off: the blocks a group of sequences shares (a prompt forked K ways,
or a preamble served from the prefix cache) are gathered once, and all the group's queries meet
them in one matrix product; each sequence then attends to its own remaining blocks, and one
softmax spans both parts, so the result is exactly full attention. On a CPU the part between
the two products (the own blocks, read in place from the pool, and the softmax) is compiled
(`_shared_attention.shared_attend`); torch's operations remain where it does not apply.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from lanefold.backends.engine._shared_attention import shared_attend

__all__ = ("AttentionBatch", "Lane", "Prefix", "causal_attention", "lane_attention", "paged_attention")


@dataclass(slots=True)
class Prefix:
    """Leading blocks a group of decode sequences shares, and their K/V laid out for products.

    `rows` None means every sequence of the step, in order (K forks of one prompt). `keys` and
    `values` `[layers, kv_heads, Lp, D]` are set where the runner gathered the prefix once for
    every layer (and keeps it while the group decodes); otherwise each layer gathers it from the
    cache.
    """

    rows: Tensor | None
    blocks: Tensor
    keys: Tensor | None = None
    values: Tensor | None = None
    tiles: tuple[Tensor, Tensor] | None = None  # `_shared_attention.prefix_tiles` of keys and values, kept

    def kv(self, layer: int, k_cache: Tensor, v_cache: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
        """This layer's prefix keys and values `[kv_heads, Lp, D]`."""
        if self.keys is not None and self.values is not None:
            return self.keys[layer], self.values[layer]
        k = _gather(k_cache, self.blocks[None], block_size)[0]  # [Lp, kv_heads, D]
        v = _gather(v_cache, self.blocks[None], block_size)[0]
        return k.transpose(0, 1), v.transpose(0, 1)


@dataclass(slots=True)
class Lane:
    """A lone decoding sequence's whole context, contiguous for every layer.

    `keys` and `values` `[layers, kv_heads, capacity, D]` hold its first `length` positions;
    each layer of the step writes the new token's K/V at `length` (as well as into the paged
    cache) and attends over the first `length + 1` in one fused kernel: no gather, no mask,
    no split between a shared prefix and the sequence's own blocks. They are in the dtype
    attention runs in (`_arith.compute_dtype`, the queries' dtype here): fp32 on a CPU that
    emulates bf16, where bf16 attention over 512 positions took 0.64 ms a layer against 0.1 ms
    in fp32.
    """

    keys: Tensor
    values: Tensor
    length: int
    slot: int = -1  # the pool slot the step's new K/V go to (set with the step's batch)


@dataclass(slots=True)
class AttentionBatch:
    """Where one step's new tokens go and what each sequence attends to.

    Tokens are flat (`N` of them); attention runs padded over `B` sequences: `query_index`
    `[B, Lq]` picks each sequence's new tokens, `block_tables` `[B, blocks]` its context (its
    own blocks only, after any shared prefix; `Lk = blocks * block_size`), `mask`
    `[B, 1, Lq, Lk]` causality and padding, `query_valid` `[B * Lq]` un-pads the output.
    `prefixes` (decode only) are the groups of sequences sharing leading blocks; `bias` (set
    with them) is `mask` as 0 / -inf, added to the scores. `spans` (a prefill where no sequence
    has cached tokens) are each sequence's (offset, length) among the flat tokens: each attends
    causally to its own new tokens alone, so no context is gathered and no mask is built.
    """

    positions: Tensor
    write_slots: Tensor
    query_index: Tensor
    query_valid: Tensor
    block_tables: Tensor
    block_size: int
    mask: Tensor | None
    prefixes: list[Prefix] = field(default_factory=list)
    bias: Tensor | None = None
    spans: list[tuple[int, int]] | None = None
    lane: Lane | None = None


def lane_attention(q: Tensor, k: Tensor | None, v: Tensor | None, lane: Lane, layer: int) -> Tensor:
    """Attention output `[1, heads * D]` of a lone sequence's one new query `q` `[1, heads, D]`,
    its new key and value `k`, `v` `[1, kv_heads, D]` appended to the lane first (None: they
    are there already, see `_lane_step.lane_put`)."""
    n, heads, dim = lane.length, q.shape[1], q.shape[2]
    keys, values = lane.keys[layer], lane.values[layer]
    if k is not None and v is not None:
        keys[:, n] = k[0]
        values[:, n] = v[0]
    out = F.scaled_dot_product_attention(
        q.view(1, heads, 1, dim), keys[None, :, : n + 1], values[None, :, : n + 1], enable_gqa=True
    )
    return out.view(1, heads * dim)


def paged_attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch, layer: int = 0
) -> Tensor:
    """Attention output `[N, heads * D]` for the flat queries `q` `[N, heads, D]` of `layer`."""
    if batch.prefixes:
        return _shared_prefix_decode(q, k_cache, v_cache, batch, layer)
    b, lq = batch.query_index.shape
    qp = q[batch.query_index].transpose(1, 2)  # [B, heads, Lq, D]
    kp = _gather(k_cache, batch.block_tables, batch.block_size).transpose(1, 2)
    vp = _gather(v_cache, batch.block_tables, batch.block_size).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        qp, kp.to(q.dtype), vp.to(q.dtype), attn_mask=batch.mask, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(b * lq, -1)[batch.query_valid]


# On a CPU, a sequence of at most this many new tokens attends in chunks of `_CHUNK` queries,
# each against the keys up to its end under a mask: torch's CPU flash kernel computes the whole
# square under `is_causal` at these lengths. One thread, AVX512-BF16 EPYC, SmolLM2's heads, fp32:
# 512 tokens 5.0 against 7.4 ms a layer, 1024 18.7 against 21.6; two threads 3.1 against 3.9
# and 11.1 against 11.6. From 1536 up chunks were level or slower (2048 on two threads: 40.7
# against 37.9), and a GPU's flash kernels skip the masked half themselves.
_CHUNKED_UP_TO = 1024
_CHUNK = 64


def causal_attention(q: Tensor, k: Tensor, v: Tensor, spans: list[tuple[int, int]]) -> Tensor:
    """Attention output `[N, heads * D]` of sequences that attend to their own new tokens only.

    SDPA a sequence at a time (no padding), straight from the step's fresh keys and values:
    with `is_causal` and no mask (the form the flash kernels take), or on a CPU, up to
    `_CHUNKED_UP_TO` tokens, a chunk of queries at a time.
    """
    parts = []
    chunked = q.device.type == "cpu"
    for start, length in spans:
        qs, ks, vs = (t[start : start + length].transpose(0, 1)[None] for t in (q, k, v))
        if chunked and _CHUNK < length <= _CHUNKED_UP_TO:
            out = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        qs[:, :, a:b], ks[:, :, :b], vs[:, :, :b], attn_mask=_causal(a, b), enable_gqa=True
                    )
                    for a in range(0, length, _CHUNK)
                    for b in (min(length, a + _CHUNK),)
                ],
                dim=2,
            )
        else:
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        parts.append(out[0].transpose(0, 1).reshape(length, -1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


@functools.lru_cache(maxsize=4 * _CHUNKED_UP_TO // _CHUNK)
def _causal(start: int, end: int) -> Tensor:
    """Which of keys `[0, end)` queries `[start, end)` see: each its own position and those before."""
    return torch.ones(end - start, end, dtype=torch.bool).tril(start)


def _shared_prefix_decode(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, batch: AttentionBatch, layer: int
) -> Tensor:
    shared = [p.kv(layer, k_cache, v_cache, batch.block_size) for p in batch.prefixes]
    if q.device.type == "cpu":  # the compiled path (its groups copy a prefix gathered strided)
        groups = [
            (
                p.rows,
                k.to(q.dtype).contiguous(),
                v.to(q.dtype).contiguous(),
                None if p.tiles is None else (p.tiles[0][layer], p.tiles[1][layer]),
            )
            for p, (k, v) in zip(batch.prefixes, shared, strict=True)
        ]
        cache = (k_cache, v_cache)
        made = shared_attend(q, groups, cache, batch.block_tables, batch.block_size, batch.positions)
        if made is not None:
            return made
    b, heads, dim = q.shape  # one query per sequence
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    qg = (q * dim**-0.5).view(b, kv_heads, group, dim)
    own_k = _gather(k_cache, batch.block_tables, batch.block_size).to(q.dtype)  # [B, Lo, kvh, D]
    own_v = _gather(v_cache, batch.block_tables, batch.block_size).to(q.dtype).transpose(1, 2)
    assert batch.bias is not None, "the runner sets a bias wherever it sets prefixes"
    own = qg @ own_k.permute(0, 2, 3, 1) + batch.bias  # [B, kv_heads, group, Lo]
    if len(batch.prefixes) == 1 and batch.prefixes[0].rows is None:
        # K forks of one prompt: all B * group queries of a KV head meet the prompt in one product.
        k, v = shared[0]  # [kv_heads, Lp, D]
        width = k.shape[1]
        queries = qg.transpose(0, 1).reshape(kv_heads, b * group, dim)
        scores = (queries @ k.to(q.dtype).transpose(1, 2)).view(kv_heads, b, group, width).transpose(0, 1)
        weights = torch.cat((scores, own), dim=-1).softmax(dim=-1)
        out = weights[..., width:] @ own_v  # [B, kv_heads, group, D]
        w = weights[..., :width].transpose(0, 1).reshape(kv_heads, b * group, width)
        out += (w @ v.to(q.dtype)).view(kv_heads, b, group, dim).transpose(0, 1)
        return out.reshape(b, heads * dim)
    width = max(k.shape[1] for k, _ in shared)
    scores = own.new_full((b, kv_heads, group, width), -torch.inf)
    for prefix, (k, _) in zip(batch.prefixes, shared, strict=True):
        index = prefix.rows if prefix.rows is not None else slice(None)
        n = b if prefix.rows is None else len(prefix.rows)
        queries = qg[index].transpose(0, 1).reshape(kv_heads, n * group, dim)
        part = (queries @ k.to(q.dtype).transpose(1, 2)).view(kv_heads, n, group, -1).transpose(0, 1)
        scores[index, :, :, : k.shape[1]] = part
    weights = torch.cat((scores, own), dim=-1).softmax(dim=-1)
    out = weights[..., width:] @ own_v  # [B, kv_heads, group, D]
    for prefix, (_, v) in zip(batch.prefixes, shared, strict=True):
        index = prefix.rows if prefix.rows is not None else slice(None)
        n = b if prefix.rows is None else len(prefix.rows)
        lp = v.shape[1]
        w = weights[index, :, :, :lp].transpose(0, 1).reshape(kv_heads, n * group, lp)
        part = w @ v.to(q.dtype)  # [kv_heads, n * group, D]
        out[index] += part.view(kv_heads, n, group, dim).transpose(0, 1)
    return out.reshape(b, heads * dim)


def _gather(store: Tensor, tables: Tensor, block_size: int) -> Tensor:
    """Context `[B, blocks * block_size, kv_heads, D]` of each table, copied a block at a time
    (index_select on whole blocks is several times faster than indexing slot by slot)."""
    blocks = store.view(-1, block_size, *store.shape[1:])
    b, width = tables.shape
    return blocks.index_select(0, tables.flatten()).view(b, width * block_size, *store.shape[1:])
