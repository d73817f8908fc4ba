"""A bf16 model's decode steps over AMX's tiles, every layer in one compiled call: the K forks of
one prompt (`tiled_layers`) and a lone lane (`tiled_lane_layers`), around `_layers`' halves over
the tiles (`_tiled_in`, `_tiled_out`).

Where every packed copy of a bf16 model is tiles (`_tiles`), a decode step of K forks of one
prompt runs norm, q|k|v, RoPE, the K/V stores, the attention over the prompt's tiles and each
fork's own blocks, o, SwiGLU and the residuals of every layer in one call, equal bit for bit to
the same step layer by layer; a lone lane's step reads the tiles too, which stream one row
faster than the loops read the `[out, in]` weights (`bench/tiles.py`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from lanefold.backends.engine._compiled import _array, _jit, _narrowed, compiled
from lanefold.backends.engine._lane_step import _lane_attend, _lane_put
from lanefold.backends.engine._lane_step import ready as lane_ready
from lanefold.backends.engine._layers import _tiled_in, _tiled_out
from lanefold.backends.engine._layers import ready as layers_ready
from lanefold.backends.engine._memory import Arena
from lanefold.backends.engine._shared_attention import _prefix_tiles, _tiled_attend, tiles_ready
from lanefold.backends.engine._tiles import TILED_ROWS, Tiles, tile

__all__ = ("TileStack", "ready", "tile_stack", "tiled_lane_layers", "tiled_layers")


def _tiles_at(block: Any, entry: Any) -> Any:  # pragma: no cover - compiled
    """The tiles `entry` = (first word, N / 16, K / 32) of the copies' `block`."""
    return block[entry[0] : entry[0] + entry[1] * entry[2] * 256].reshape(entry[1], entry[2], 16, 16)


_tiles_at = _jit(_tiles_at)


def _layer_tiles(block: Any, table: Any, layer: int) -> Any:  # pragma: no cover - compiled
    """A layer's q|k|v, o, gate|up and down tiles, where `table[layer]` says they lie in `block`."""
    entries = table[layer]
    return (
        _tiles_at(block, entries[0]),
        _tiles_at(block, entries[1]),
        _tiles_at(block, entries[2]),
        _tiles_at(block, entries[3]),
    )


_layer_tiles = _jit(_layer_tiles)


def _tiled_layers(
    x: Any,
    norms: Any,
    posts: Any,
    block: Any,
    table: Any,
    eps: float,
    rope: Any,
    rotated: int,
    dim: int,
    kc: Any,
    vc: Any,
    slots: Any,
    keys: Any,
    values: Any,
    shared: int,
    tables: Any,
    size: int,
    positions: Any,
) -> None:  # pragma: no cover - compiled
    """Every layer of a decode step of K forks of one prompt in one call, bf16 rows `x` `[K,
    hidden]` (bits) in place: `_tiled_in`, the new keys and values into the pool (`kc`, `vc`
    `[layers, slots, kv_heads, D]`) at `slots`, `_tiled_attend` over the prompt's tiles (`keys`,
    `values`: `prefix_tiles`, every layer) and each fork's own blocks, `_tiled_out`. The norms
    are bf16 `[layers, hidden]`; the copies lie in `block` where `table` `[layers, 4, 3]` says."""
    n, kv_heads = x.shape[0], kc.shape[2]
    queries = rotated - kv_heads * dim
    heads = queries // dim
    made = np.empty((n, table[0, 0, 1] * 16), dtype=np.uint16)
    q = np.empty((n, heads, dim), dtype=np.uint16)
    attended = np.empty((n, queries), dtype=np.uint16)
    out = np.empty_like(x)
    rows = np.arange(n)
    for layer in range(table.shape[0]):
        qkv, o, gate_up, down = _layer_tiles(block, table, layer)
        _tiled_in(x, norms[layer], eps, qkv, rope, rotated, dim, made)
        for i in range(n):
            for c in range(queries):
                q[i, c // dim, c % dim] = made[i, c]
            for h in range(kv_heads):
                for d in range(dim):
                    kc[layer, slots[i], h, d] = made[i, queries + h * dim + d]
                    vc[layer, slots[i], h, d] = made[i, rotated + h * dim + d]
        _tiled_attend(
            q,
            rows,
            keys[layer],
            values[layer],
            shared,
            kc[layer],
            vc[layer],
            tables,
            size,
            positions,
            attended,
        )
        _tiled_out(attended, o, x, posts[layer], eps, gate_up, down, out)
        x[:] = out


_tiled_layers = _jit(_tiled_layers)


def _tiled_lane_layers(
    x: Any,
    norms: Any,
    posts: Any,
    block: Any,
    table: Any,
    eps: float,
    rope: Any,
    rotated: int,
    dim: int,
    kc: Any,
    vc: Any,
    slot: int,
    lk: Any,
    lv: Any,
    at: int,
) -> None:  # pragma: no cover - compiled
    """Every layer of a lone lane's decode step in one call over AMX's tiles, its bf16 row `x`
    `[1, hidden]` (bits) in place: `_tiled_in`, `_lane_put` (the pool's K/V `kc`, `vc` `[layers,
    slots, kv_heads, D]` at `slot`, the lane's `lk`, `lv` `[layers, kv_heads, capacity, D]` at
    `at`), `_lane_attend`, its output rounded to bf16, `_tiled_out`; as `_tiled_layers` lays out
    the norms, the copies and their `table`."""
    queries = rotated - lk.shape[1] * dim
    made = np.empty((1, table[0, 0, 1] * 16), dtype=np.uint16)
    q = np.empty(queries, dtype=lk.dtype)
    attended = np.empty((1, queries), dtype=np.float32)
    bits = np.empty((1, queries), dtype=np.uint16)
    out = np.empty_like(x)
    for layer in range(table.shape[0]):
        qkv, o, gate_up, down = _layer_tiles(block, table, layer)
        _tiled_in(x, norms[layer], eps, qkv, rope, rotated, dim, made)
        _lane_put(made, rotated, kc[layer], vc[layer], slot, lk[layer], lv[layer], at, q)
        _lane_attend(q, lk[layer], lv[layer], at + 1, attended)
        for c in range(queries):
            bits[0, c] = _narrowed(attended[0, c])
        _tiled_out(bits, o, x, posts[layer], eps, gate_up, down, out)
        x[:] = out


_tiled_lane_layers = _jit(_tiled_lane_layers)


def _compile_tiled_layers() -> None:
    """Call `_tiled_layers` and `_tiled_lane_layers` once on a one-layer model (hidden 32, one
    head of 32 over one KV head, intermediate 32) so a first step does not compile them."""
    shapes = [(96, 32), (32, 32), (64, 32), (32, 32)]
    memory = Arena.of([(n // 16, k // 32, 16, 16) for n, k in shapes], torch.int32, torch.device("cpu"))
    copies = [tile(torch.zeros(shape, dtype=torch.bfloat16), memory) for shape in shapes]
    words = memory.words()
    assert words is not None
    norm = torch.ones(32, dtype=torch.bfloat16)
    made = _tile_stack([(norm, norm, *copies)], words[0], words[1])
    assert made is not None
    prefix = _prefix_tiles(*(torch.zeros(1, 1, 32, 32, dtype=torch.bfloat16),) * 2)
    pool = _array(torch.zeros(1, 64, 1, 32, dtype=torch.bfloat16))
    x = np.zeros((1, 32), dtype=np.uint16)
    turns = np.ones((1, 16, 2), dtype=np.float32)
    keys, values = (t.numpy().view(np.uint32) for t in prefix)
    one = np.ones(1, dtype=np.int64)
    _tiled_layers(x, made.norms, made.posts, made.block, made.table, 1e-5, turns, 64, 32, pool, pool,
                  one * 32, keys, values, 32, one.reshape(1, 1) * 2, 16, one * 32)  # fmt: skip
    # and a lone lane's step, its lane in bf16 as attention runs where there are tiles
    # (`_arith.sdpa_dtype`; an fp32 lane compiles on first use)
    kept = _array(torch.zeros(1, 1, 4, 32, dtype=torch.bfloat16))
    _tiled_lane_layers(x, made.norms, made.posts, made.block, made.table, 1e-5, turns, 64, 32,
                       pool, pool, 1, kept, kept, 1)  # fmt: skip


@functools.cache
def ready() -> bool:
    """Whether the whole decode steps over AMX's tiles run here: the tiles' attention
    (`tiles_ready`), the compiled halves and lone-lane pieces they call, and their own calls
    compiled (or loaded from numba's cache). False where not."""

    def calls() -> None:
        square = tile(torch.zeros(32, 32, dtype=torch.bfloat16)).words
        bits = np.zeros((1, 32), dtype=np.uint16)
        _tiled_in(bits, bits[0], 1e-5, square, np.ones((1, 16, 2), dtype=np.float32), 32, 32, bits.copy())
        wide = tile(torch.zeros(64, 32, dtype=torch.bfloat16)).words
        _tiled_out(bits, square, bits, bits[0], 1e-5, wide, square, bits.copy())
        _compile_tiled_layers()

    return (
        tiles_ready() and layers_ready() and lane_ready() and compiled("decode steps over AMX's tiles", calls)
    )


class TileStack(NamedTuple):
    """Every layer's tiled copies and bf16 norms as `tiled_layers` reads them, made once a model."""

    norms: Any  # uint16 (bf16 bits) [layers, hidden]
    posts: Any
    block: Any  # the copies' block as uint32 words
    table: Any  # int64 [layers, 4, 3]: each copy's first word in `block`, N / 16, K / 32


def tile_stack(layers: list[tuple[Any, ...]], block: Any, base: int) -> TileStack | None:
    """The `TileStack` of `layers`, each (input norm, post norm, q|k|v, o, gate|up, down): bf16
    norms and `Tiles` lying in `block` (numpy uint32 words whose first is at address `base`: the
    copies' `_memory.Arena`). None where they do not all (or the CPU has no AMX)."""
    return _tile_stack(layers, block, base) if layers and ready() else None


def _tile_stack(layers: list[tuple[Any, ...]], block: Any, base: int) -> TileStack | None:
    table = np.empty((len(layers), 4, 3), dtype=np.int64)
    for i, (norm, post, *copies) in enumerate(layers):
        if norm.dtype != torch.bfloat16 or post.dtype != torch.bfloat16:
            return None
        for j, copy in enumerate(copies):
            if not isinstance(copy, Tiles):
                return None
            start = copy.tiles.data_ptr() - base
            if not (0 <= start and start + copy.tiles.nbytes <= block.nbytes and start % 4 == 0):
                return None
            table[i, j] = (start // 4, copy.tiles.shape[0], copy.tiles.shape[1])
    norms = np.stack([_array(layer[0]) for layer in layers])
    posts = np.stack([_array(layer[1]) for layer in layers])
    return TileStack(norms, posts, block, table)


def tiled_layers(
    x: Tensor,
    layers: TileStack,
    eps: float,
    rope: Tensor,
    rotated: int,
    cache: tuple[Tensor, Tensor],
    slots: Tensor,
    prefix: tuple[Tensor, Tensor],
    shared: int,
    tables: Tensor,
    size: int,
    positions: Tensor,
) -> Tensor | None:
    """The hidden states `[K, hidden]` (bf16, before the final norm) of a decode step of K forks
    of one prompt after every layer, from their tokens' embeddings `x`, in one compiled call
    (`_tiled_layers`): the pool's K/V (`cache`, `[layers, slots, kv_heads, D]`) written at
    `slots`, attention over the prompt's `prefix_tiles` (`shared` positions) and each fork's own
    blocks (`tables`, of `size` slots) up to `positions`. A step ran some 30 Python calls and
    100 eager operations a layer around the compiled ones. None where it does not apply."""
    rows = x.shape[0]
    if x.dtype != torch.bfloat16 or rows > TILED_ROWS or rows == 0:
        return None
    tensors = (*cache, *prefix)
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    if cache[0].dtype != torch.bfloat16 or cache[1].dtype != torch.bfloat16:
        return None
    out = x.contiguous().clone()  # (a fresh tensor: the loop works in place)
    turns = torch.view_as_real(rope).contiguous().numpy()
    words = (prefix[0].numpy().view(np.uint32), prefix[1].numpy().view(np.uint32))
    _tiled_layers(
        _array(out), layers.norms, layers.posts, layers.block, layers.table, eps, turns, rotated,
        cache[0].shape[3], _array(cache[0]), _array(cache[1]), slots.numpy(), *words, shared,
        tables.numpy(), size, positions.numpy(),
    )  # fmt: skip
    return out


def tiled_lane_layers(
    x: Tensor,
    layers: TileStack,
    eps: float,
    rope: Tensor,
    rotated: int,
    cache: tuple[Tensor, Tensor],
    slot: int,
    lane: tuple[Tensor, Tensor],
    at: int,
) -> Tensor | None:
    """A lone lane's hidden state `[1, hidden]` (bf16, before the final norm) after every layer,
    from its token's embedding `x`, in one compiled call over AMX's tiles (`_tiled_lane_layers`):
    `lane_layers` for a model whose copies are tiles, which stream one row faster than the loops
    read the `[out, in]` weights (`bench/tiles.py`). None where it does not apply."""
    tensors = (*cache, *lane)
    if x.shape[0] != 1 or x.dtype != torch.bfloat16:
        return None
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    if cache[0].dtype != torch.bfloat16 or cache[1].dtype != torch.bfloat16:
        return None
    if lane[0].dtype not in (torch.float32, torch.bfloat16) or lane[1].dtype != lane[0].dtype:
        return None
    out = x.contiguous().clone()  # (a fresh tensor: the loop works in place)
    turns = torch.view_as_real(rope).contiguous().numpy()
    k, v, keys, values = (_array(t) for t in tensors)
    _tiled_lane_layers(
        _array(out), layers.norms, layers.posts, layers.block, layers.table, eps, turns, rotated,
        cache[0].shape[3], k, v, slot, keys, values, at,
    )  # fmt: skip
    return out
