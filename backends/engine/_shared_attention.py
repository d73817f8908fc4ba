"""Decode attention where groups of sequences share their leading blocks (K forks of one prompt,
prompts behind one cached preamble), compiled by numba around the products with the prefix.

The products with the prefix are torch's batched ones (with AMX, bf16, SmolLM2's heads, 24
queries over 496 positions: 27 us for the three KV heads; a compiled loop took 27 a head), or on
a CPU with AMX the tiles' (`_tiled_attend`, over the prefix as `prefix_tiles` lays it out); what
lies between them (the sequences' own keys and values in the pool, the softmax over both parts,
the sum of the two halves) is compiled, where `_attention` ran some 15 eager operations a layer:
12 of a K = 8 step's 48 ms (bf16, one thread, the Xeon with AMX). One softmax spans both parts,
so the result is full attention.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lanefold.backends.engine._compiled import _array, _exp, _jit, _narrowed, _stored, _wide, compiled
from lanefold.backends.engine._tiles import _tile_config, _tile_dots, amx_ready

__all__ = ("prefix_tiles", "ready", "shared_attend", "tiles_ready")


def _row_max(row: Any, lanes: Any) -> Any:  # pragma: no cover - compiled
    """The largest of `row`'s values (bf16 bits or fp32) as fp32, kept in 16 `lanes` side by
    side: a running maximum is a chain LLVM does not vectorise (SmolLM2's 36 000 prefix scores a
    layer: 35 us one at a time, 9 in lanes)."""
    lanes[:] = -np.inf
    n = row.shape[0]
    top = n - n % 16
    for p in range(0, top, 16):
        for j in range(16):
            value = _wide(row[p + j])
            lanes[j] = value if value > lanes[j] else lanes[j]
    most = np.float32(-np.inf)
    for p in range(top, n):
        most = max(most, _wide(row[p]))
    for j in range(16):
        most = max(most, lanes[j])
    return most


_row_max = _jit(_row_max)


def _own_softmax(
    scores: Any,
    queries: Any,
    rows: Any,
    kc: Any,
    vc: Any,
    tables: Any,
    size: int,
    positions: Any,
    shared: int,
    weights: Any,
    acc: Any,
) -> None:  # pragma: no cover - compiled
    """For each query `i` of a KV head `h` (`queries` `[kv_heads, n, D]`, scaled; sequence
    `rows[i // group]`): its scores over its own positions `shared .. positions[b]` in the pool
    (`kc`, `vc` `[slots, kv_heads, D]`, through its blocks `tables[b]` of `size` slots); one
    softmax over those and its scores over the prefix's `shared` positions (`scores` `[kv_heads,
    n, >= shared]`); the prefix's weights into `weights` (the scores' shape, its own dtype; 0
    past `shared`) and the own values' weighted sum into `acc` `[kv_heads, n, D]` (fp32).
    Scores, softmax and sum in fp32."""
    kv_heads, n = scores.shape[0], scores.shape[1]
    dim = acc.shape[2]
    group = n // rows.shape[0]
    most = 0
    for b in rows:
        most = max(most, positions[b] + 1 - shared)
    own = np.empty(most, dtype=np.float32)
    query = np.empty(dim, dtype=np.float32)
    powers = np.empty(shared, dtype=np.float32)
    lanes = np.empty(16, dtype=np.float32)
    for h in range(kv_heads):
        for i in range(n):
            b = rows[i // group]
            for d in range(dim):
                query[d] = _wide(queries[h, i, d])
            length = positions[b] + 1 - shared
            top = _row_max(scores[h, i, :shared], lanes)
            for j in range(length):
                slot = tables[b, j // size] * size + j % size
                score = np.float32(0.0)
                for d in range(dim):
                    score += query[d] * _wide(kc[slot, h, d])
                own[j] = score
                top = max(top, score)
            total = np.float32(0.0)
            for j in range(length):
                own[j] = _exp(own[j] - top)
                total += own[j]
            for p in range(shared):
                powers[p] = _exp(_wide(scores[h, i, p]) - top)
                total += powers[p]
            inverse = np.float32(1.0) / total
            for p in range(shared):
                weights[h, i, p] = _stored(weights, powers[p] * inverse)
            for p in range(shared, weights.shape[2]):
                weights[h, i, p] = 0
            acc[h, i, :] = 0.0
            for j in range(length):
                slot = tables[b, j // size] * size + j % size
                weight = own[j] * inverse
                for d in range(dim):
                    acc[h, i, d] += weight * _wide(vc[slot, h, d])


_own_softmax = _jit(_own_softmax)


def _summed(acc: Any, part: Any, rows: Any, out: Any) -> None:  # pragma: no cover - compiled
    """`out[rows[i // group], head]` = `acc` + `part` (`[kv_heads, n, D]`, the own and the
    prefix's weighted values) of each query, in `out`'s dtype (`[B, heads * D]`)."""
    kv_heads, n, dim = acc.shape
    group = n // rows.shape[0]
    for h in range(kv_heads):
        for i in range(n):
            b = rows[i // group]
            column = (h * group + i % group) * dim
            for d in range(dim):
                out[b, column + d] = _stored(out, acc[h, i, d] + _wide(part[h, i, d]))


_summed = _jit(_summed)


def _tiled_attend(
    q: Any,
    rows: Any,
    keys: Any,
    values: Any,
    shared: int,
    kc: Any,
    vc: Any,
    tables: Any,
    size: int,
    positions: Any,
    out: Any,
) -> None:  # pragma: no cover - compiled
    """`_shared_attend`'s work for one group with its prefix in AMX's tiles: bf16 queries `q`
    `[B, heads, D]` (bits) of the sequences `rows`; the prefix's `shared` keys as the tiles of a
    `[Lp, D]` weight a KV head (`keys` `[kv_heads, Lp / 16, D / 32, 16, 16]`, `Lp` a multiple of
    32 past `shared`, the rest zeros) and its values as those of `[D, Lp]` (`values`); the
    scores and the prefix's weighted values in two tiled products a KV head, fp32 scores, bf16
    weights (as the products before them took), everything else as `_own_softmax` and `_summed`."""
    kv_heads, dim = keys.shape[0], q.shape[2]
    group = q.shape[1] // kv_heads
    n = rows.shape[0] * group
    width = keys.shape[1] * 16
    scale = np.float32(1.0) / np.sqrt(np.float32(dim))
    if keys.shape[2] * 32 != dim or values.shape[1] * 16 != dim or values.shape[2] * 32 != width:
        raise ValueError("the queries and the prefix's tiles disagree")
    config = _tile_config(n)
    queries = np.empty((kv_heads, n, dim), dtype=np.uint16)
    for h in range(kv_heads):
        for i in range(n):
            b, head = rows[i // group], h * group + i % group
            for d in range(dim):
                queries[h, i, d] = _narrowed(_wide(q[b, head, d]) * scale)
    scores = np.empty((kv_heads, n, width), dtype=np.float32)
    for h in range(kv_heads):
        _tile_dots(keys[h], queries[h], scores[h], config)
    weights = np.empty((kv_heads, n, width), dtype=np.uint16)
    acc = np.empty((kv_heads, n, dim), dtype=np.float32)
    _own_softmax(scores, queries, rows, kc, vc, tables, size, positions, shared, weights, acc)
    part = np.empty((kv_heads, n, dim), dtype=np.float32)
    for h in range(kv_heads):
        _tile_dots(values[h], weights[h], part[h], config)
    _summed(acc, part, rows, out)


_tiled_attend = _jit(_tiled_attend)


@functools.cache
def ready() -> bool:
    """Whether the compiled shared-prefix attention compiled (or loaded from numba's cache);
    False, logged once, if not."""

    def calls() -> None:
        for dtype in (torch.bfloat16, torch.float32):
            # in the dtype it runs in (the model's, or fp32 where bf16 is emulated)
            pool, index = torch.zeros(2, 1, 2, dtype=dtype), np.zeros(1, dtype=np.int64)
            acc = np.zeros((1, 2, 2), dtype=np.float32)
            for work in {dtype, torch.float32}:
                queries, answer = torch.ones(1, 2, 2, dtype=work), torch.empty(1, 4, dtype=work)
                scores = _array(torch.ones(1, 2, 1, dtype=work))
                k, one = _array(pool), np.ones(1, dtype=np.int64)
                _own_softmax(
                    scores, _array(queries), index, k, k, index.reshape(1, 1), 2, one, 1, scores.copy(), acc
                )
                _summed(acc, _array(queries), index, _array(answer))

    return compiled("shared-prefix attention", calls)


@functools.cache
def tiles_ready() -> bool:
    """Whether the shared-prefix attention runs over AMX's tiles here (`amx_ready`, and its
    compiled call compiled, its queries a strided view); False where not."""

    def calls() -> None:
        row = torch.zeros(1, 6, 32, dtype=torch.bfloat16)
        prefix = torch.zeros(1, 2, 32, 32, dtype=torch.bfloat16)
        pool, index = torch.zeros(64, 2, 32, dtype=torch.bfloat16), np.zeros(1, dtype=np.int64)
        tiles = _prefix_tiles(prefix, prefix)
        words = (tiles[0][0].numpy().view(np.uint32), tiles[1][0].numpy().view(np.uint32))
        out = torch.empty(1, 64, dtype=torch.bfloat16)
        _tiled_attend(_array(row[:, :2]), index, *words, 32, _array(pool), _array(pool), index.reshape(1, 1),
                      16, np.full(1, 32, dtype=np.int64), _array(out))  # fmt: skip

    return ready() and amx_ready() and compiled("shared-prefix attention over AMX's tiles", calls)


def prefix_tiles(keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor] | None:
    """A kept prefix's bf16 keys and values `[layers, kv_heads, Lp, D]` as AMX tiles for
    `shared_attend`: the keys as the tiles of a `[Lp, D]` weight a KV head and layer, the
    values as those of `[D, Lp]` (`tile`), `Lp` padded with zeros to a multiple of 32. None
    where the tiles do not apply (no AMX, another dtype, `D` not a multiple of 32)."""
    dim = keys.shape[3]
    if keys.dtype != torch.bfloat16 or values.dtype != torch.bfloat16 or dim % 32:
        return None
    if keys.device.type != "cpu" or not keys.is_contiguous() or not values.is_contiguous():
        return None
    return _prefix_tiles(keys, values) if tiles_ready() else None


def _prefix_tiles(keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    layers, kv_heads, length, dim = keys.shape
    width = -(-length // 32) * 32
    padded = keys.new_zeros((layers, kv_heads, width, dim))
    padded[:, :, :length] = keys
    turned = values.new_zeros((layers, kv_heads, dim, width))
    turned[:, :, :, :length] = values.transpose(2, 3)
    return tuple(  # type: ignore[return-value]
        m.view(torch.int32)
        .view(layers, kv_heads, n // 16, 16, k // 32, 16)
        .permute(0, 1, 2, 4, 5, 3)
        .contiguous()
        for m, n, k in ((padded, width, dim), (turned, dim, width))
    )


def shared_attend(
    q: Tensor,
    groups: list[tuple[Tensor | None, Tensor, Tensor, tuple[Tensor, Tensor] | None]],
    cache: tuple[Tensor, Tensor],
    tables: Tensor,
    size: int,
    positions: Tensor,
) -> Tensor | None:
    """Attention output `[B, heads * D]` of one decode query a sequence, `q` `[B, heads, D]`:
    each group (its rows, None for every sequence; its prefix's keys and values `[kv_heads, Lp,
    D]` in `q`'s dtype, and this layer's `prefix_tiles` of them or None) over its prefix and
    then over its own positions in this layer's pool (`cache`, K and V `[slots, kv_heads, D]`)
    up to `positions[b]`, through `tables[b]`, its blocks of `size` slots after the prefix;
    sequences in no group over their own blocks alone. One softmax spans both parts, so the
    result is full attention. The prefix's two products are torch's batched ones, or with tiles
    AMX's in the same compiled call as the rest. None where it does not apply (a device, other
    dtypes, numba missing)."""
    arrays = (*cache, *(t for _, k, v, _ in groups for t in (k, v)))
    if q.device.type != "cpu" or not all(t.device.type == "cpu" and t.is_contiguous() for t in arrays):
        return None
    if any(t.dtype not in (torch.float32, torch.bfloat16) for t in (q, *arrays)) or not ready():
        return None
    if any(k.dtype != q.dtype or v.dtype != q.dtype for _, k, v, _ in groups):
        return None
    b, heads, dim = q.shape
    kv_heads = cache[0].shape[1]
    group = heads // kv_heads
    if all(rows is not None for rows, _, _, _ in groups):  # some sequences in no group?
        covered = np.zeros(b, dtype=np.bool_)
        for rows, _, _, _ in groups:
            covered[rows.numpy()] = True  # type: ignore[union-attr]
        if not covered.all():  # they attend to their own blocks alone
            rest = torch.from_numpy(np.flatnonzero(~covered))
            nothing = q.new_empty((kv_heads, 0, dim))
            groups = [*groups, (rest, nothing, nothing, None)]
    out = torch.empty((b, heads * dim), dtype=q.dtype)
    kc, vc, o = _array(cache[0]), _array(cache[1]), _array(out)
    index, at = tables.numpy(), positions.numpy()
    for rows, keys, values, tiles in groups:
        which = np.arange(b) if rows is None else rows.numpy()
        n = len(which) * group
        if tiles is not None and q.dtype == torch.bfloat16:
            words = tiles[0].numpy().view(np.uint32), tiles[1].numpy().view(np.uint32)
            _tiled_attend(_array(q), which, *words, keys.shape[1], kc, vc, index, size, at, o)
            continue
        mine = q if rows is None else q[rows]
        queries = torch.empty((kv_heads, n, dim), dtype=q.dtype)  # a KV head's queries together, scaled
        heads_first = mine.view(-1, kv_heads, group, dim).transpose(0, 1)
        torch.mul(heads_first, dim**-0.5, out=queries.view(kv_heads, -1, group, dim))
        scores = torch.bmm(queries, keys.transpose(1, 2))  # [kv_heads, n, Lp]
        weights = torch.empty_like(scores)
        acc = np.empty((kv_heads, n, dim), dtype=np.float32)
        shared = keys.shape[1]
        _own_softmax(
            _array(scores), _array(queries), which, kc, vc, index, size, at, shared, _array(weights), acc
        )
        _summed(acc, _array(torch.bmm(weights, values)), which, o)
    return out
