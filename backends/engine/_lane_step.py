"""A lone lane's decode step on a CPU in one compiled call: every layer's products, its K/V
stored in the pool and in the lane, and its attention over the lane.

A step that decodes one sequence alone (K = 1, or the last lane of a wave) reads every weight
for one token; eager, the step also ran some 200 operations and 90 Python calls between the
layer loops, microseconds each. `lane_layers` runs `_layers`' compiled halves around the lane's
own attention (fp32 scores, a vectorised exp within 2e-7 of `exp`, the output rounded as SDPA's)
for every layer, reading every matrix from the model's one block (`_memory.Arena`) through a
table of where each lies. Where torch's products read faster (the model's decode paths), the
model takes the layers one by one instead.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from lanefold.backends.engine._compiled import _array, _exp, _jit, _narrowed, _stored, _takes, _wide, compiled
from lanefold.backends.engine._layers import _layer_in, _layer_out
from lanefold.backends.engine._layers import ready as layers_ready

__all__ = ("Stack", "lane_layers", "lane_put", "ready", "stack")


def _lane_put(
    made: Any, rotated: int, kc: Any, vc: Any, slot: int, lk: Any, lv: Any, at: int, q: Any
) -> None:  # pragma: no cover - compiled
    """A lone lane's q|k|v row `made` (fp32, or bf16 bits; after RoPE; q the first `rotated`
    less the keys') stored where its step reads it: K and V at the pool's row `slot` (`kc`, `vc`
    `[slots, kv_heads, D]`) and at the lane's position `at` (`lk`, `lv` `[kv_heads, capacity,
    D]`), each in its array's dtype; q into `q`, in the lane's."""
    kv_heads, dim = lk.shape[0], lk.shape[2]
    queries = rotated - kv_heads * dim
    for c in range(queries):
        q[c] = _stored(q, _wide(made[0, c]))
    for h in range(kv_heads):
        for d in range(dim):
            key = _wide(made[0, queries + h * dim + d])
            value = _wide(made[0, rotated + h * dim + d])
            kc[slot, h, d] = _stored(kc, key)
            vc[slot, h, d] = _stored(vc, value)
            lk[h, at, d] = _stored(lk, key)
            lv[h, at, d] = _stored(lv, value)


_lane_put = _jit(_lane_put)


def _lane_attend(
    q: Any, keys: Any, values: Any, length: int, out: Any
) -> None:  # pragma: no cover - compiled
    """`out[0]` = attention of one token's queries `q` `[heads * D]` (the lane's dtype) over the
    first `length` of a lane's `keys`, `values` `[kv_heads, capacity, D]`, heads grouped over
    the KV heads; scores, softmax and sums in fp32, the output rounded to the lane's dtype as
    SDPA's is."""
    kv_heads, dim = keys.shape[0], keys.shape[2]
    heads = q.shape[0] // dim
    group = heads // kv_heads
    scale = np.float32(1.0) / np.sqrt(np.float32(dim))
    scores = np.empty(length, dtype=np.float32)
    query = np.empty(dim, dtype=np.float32)
    acc = np.empty(dim, dtype=np.float32)
    for h in range(heads):
        g = h // group
        for d in range(dim):
            query[d] = _wide(q[h * dim + d]) * scale
        top = np.float32(-np.inf)
        for t in range(length):
            score = np.float32(0.0)
            for d in range(dim):
                score += query[d] * _wide(keys[g, t, d])
            scores[t] = score
            top = max(top, score)
        total = np.float32(0.0)
        for t in range(length):
            scores[t] = _exp(scores[t] - top)
            total += scores[t]
        acc[:] = 0.0
        for t in range(length):
            weight = scores[t]
            for d in range(dim):
                acc[d] += weight * _wide(values[g, t, d])
        for d in range(dim):
            out[0, h * dim + d] = _wide(_stored(q, acc[d] / total))


_lane_attend = _jit(_lane_attend)


def _matrix(block: Any, entry: Any) -> Any:  # pragma: no cover - compiled
    """The matrix `entry` = (first word, rows, words a row) of the weights' `block`."""
    return block[entry[0] : entry[0] + entry[1] * entry[2]].reshape(entry[1], entry[2])


_matrix = _jit(_matrix)


def _lane_layers(
    x: Any,
    norms: Any,
    posts: Any,
    block: Any,
    table: Any,
    halves: bool,
    eps: float,
    rope: Any,
    rotated: int,
    kc: Any,
    vc: Any,
    slot: int,
    lk: Any,
    lv: Any,
    at: int,
    rounds: bool,
) -> None:  # pragma: no cover - compiled
    """Every layer of a lone lane's decode step in one call, `x` `[1, hidden]` (fp32) in place:
    `_layer_in`, `_lane_put`, `_lane_attend`, `_layer_out`, layer by layer. The norms are
    `[layers, hidden]`; the matrices lie in `block` (the weights' words) where `table` `[layers,
    4, 3]` says (q|k|v, o, gate|up, down); the pool's and the lane's K/V are `[layers, ...]`.
    `rounds`: the residual stream rounded to bf16 after each layer, as a bf16 model's is
    between eager layers."""
    dim = lk.shape[3]
    made = np.empty((1, table[0, 0, 1]), dtype=np.float32)
    q = np.empty(rotated - lk.shape[1] * dim, dtype=lk.dtype)
    attended = np.empty((1, q.shape[0]), dtype=np.float32)
    out = np.empty_like(x)
    for layer in range(table.shape[0]):
        qkv, o = _matrix(block, table[layer, 0]), _matrix(block, table[layer, 1])
        gate_up, down = _matrix(block, table[layer, 2]), _matrix(block, table[layer, 3])
        _layer_in(x, norms[layer], eps, qkv, halves, rope, rotated, dim, made)
        _lane_put(made, rotated, kc[layer], vc[layer], slot, lk[layer], lv[layer], at, q)
        _lane_attend(q, lk[layer], lv[layer], at + 1, attended)
        _layer_out(attended, o, x, posts[layer], eps, gate_up, down, halves, out)
        for c in range(x.shape[1]):
            x[0, c] = _wide(_narrowed(out[0, c])) if rounds else out[0, c]


_lane_layers = _jit(_lane_layers)


@functools.cache
def ready() -> bool:
    """Whether the lone lane's compiled step compiled (or loaded from numba's cache); False,
    logged once, if not."""

    def calls() -> None:
        for dtype in (torch.bfloat16, torch.float32):
            halves = dtype == torch.bfloat16
            for lane in (torch.bfloat16, torch.float32):  # the lane in the dtype attention runs in
                row = np.ones((1, 6), dtype=np.float32)
                pool, kept = torch.zeros(2, 1, 2, dtype=dtype), torch.zeros(1, 2, 2, dtype=lane)
                q = torch.empty(2, dtype=lane)
                _lane_put(row, 4, _array(pool), _array(pool), 1, _array(kept), _array(kept), 1, _array(q))
            # a whole lone-lane step of a one-layer model: hidden 4, two heads of 2 over one KV head
            words = 2 if halves else 4  # a row of 4 values
            block = np.zeros(24 * words, dtype=np.uint32)
            starts = (0, 8 * words, 12 * words, 20 * words)
            heights = (8, 4, 8, 4)
            table = np.array([[[start, rows, words] for start, rows in zip(starts, heights, strict=True)]])
            norms = np.ones((1, 4), dtype=np.float32)
            rope = torch.ones(1, 1, 2).numpy()
            for lane in (torch.bfloat16, torch.float32):
                pool, kept = torch.zeros(1, 2, 1, 2, dtype=dtype), torch.zeros(1, 1, 2, 2, dtype=lane)
                h = np.ones((1, 4), dtype=np.float32)
                k, kept_k = _array(pool), _array(kept)
                _lane_layers(
                    h, norms, norms, block, table, halves, 1e-5, rope, 6, k, k, 1, kept_k, kept_k, 1, halves
                )

    return layers_ready() and compiled("lone lane's step", calls)


def lane_put(
    made: Tensor, rotated: int, cache: tuple[Tensor, Tensor], slot: int, lane: tuple[Tensor, Tensor], at: int
) -> Tensor | None:
    """The queries `[heads * D]` of `layer_in`'s row `made` (its first `rotated` outputs
    turned) in the lane's dtype, its keys and values stored at the pool's row `slot` of this
    layer's `cache` (K, V `[slots, kv_heads, D]`) and at position `at` of the `lane`'s (K, V
    `[kv_heads, capacity, D]`); in one compiled call, where the step did it in some ten eager
    operations (split, casts, two `index_copy_`, two lane writes). None where it does not apply
    (other dtypes, or numba is missing)."""
    tensors = (*cache, *lane)
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) or not ready():
        return None
    if any(t.dtype not in (torch.float32, torch.bfloat16) for t in tensors) or made.dtype != torch.float32:
        return None
    kv_heads, dim = lane[0].shape[0], lane[0].shape[2]
    q = torch.empty(rotated - kv_heads * dim, dtype=lane[0].dtype)
    k, v, keys, values = (_array(t) for t in tensors)
    _lane_put(made.numpy(), rotated, k, v, slot, keys, values, at, _array(q))
    return q


class Stack(NamedTuple):
    """Every layer's tensors as `lane_layers` reads them, made once a model."""

    norms: Any  # fp32 [layers, hidden]
    posts: Any
    block: Any  # the weights' block as uint32 words
    table: Any  # int64 [layers, 4, 3]: each matrix's first word in `block`, rows, words a row
    halves: bool  # bf16 weights (two values a word)


def stack(layers: list[tuple[Tensor, ...]], block: Any, base: int) -> Stack | None:
    """The `Stack` of `layers`, each (input norm, post norm, qkv, o, gate_up, down), the norms
    fp32 and the matrices lying in `block` (numpy uint32 words whose first is at address
    `base`: the model's `_memory.Arena`). None where the loops do not take them all (or numba
    is missing). One block and a table, not a list of arrays: numba's typed lists cost 0.3 s of
    every process's first use."""
    if not layers or not ready():
        return None
    dtype = layers[0][2].dtype
    table = np.empty((len(layers), 4, 3), dtype=np.int64)
    for i, (norm, post, *matrices) in enumerate(layers):
        if not all(n.dtype == torch.float32 and n.device.type == "cpu" for n in (norm, post)):
            return None
        for j, m in enumerate(matrices):
            start = m.data_ptr() - base
            inside = 0 <= start and start + m.numel() * m.element_size() <= block.nbytes and start % 4 == 0
            if not (inside and _takes(m) and m.dtype == dtype):
                return None
            table[i, j] = (start // 4, m.shape[0], m.shape[1] * m.element_size() // 4)
    norms = np.stack([layer[0].numpy() for layer in layers])
    posts = np.stack([layer[1].numpy() for layer in layers])
    return Stack(norms, posts, block, table, dtype == torch.bfloat16)


def lane_layers(
    x: Tensor,
    layers: Stack,
    eps: float,
    rope: Tensor,
    rotated: int,
    cache: tuple[Tensor, Tensor],
    slot: int,
    lane: tuple[Tensor, Tensor],
    at: int,
) -> Tensor | None:
    """A lone lane's hidden state `[1, hidden]` (fp32, before the final norm) after every layer,
    from its token's embedding `x`: the whole decode step's layers in one compiled call
    (`_lane_layers`), with the pool's K/V (`cache`, `[layers, slots, kv_heads, D]`) written at
    `slot` and the lane's (`[layers, kv_heads, capacity, D]`) at `at`. The step ran some 200
    eager operations and 90 Python calls between the layer loops; each costs microseconds. None
    where it does not apply: other dtypes, a device. (Where torch's products read faster the
    model does not call it: its decode paths say so.)"""
    tensors = (*cache, *lane)
    if x.shape[0] != 1 or not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    if any(t.dtype not in (torch.float32, torch.bfloat16) for t in tensors):
        return None
    out = x.float().clone()  # (a fresh tensor: the loop works in place)
    k, v, keys, values = (_array(t) for t in tensors)
    turns = torch.view_as_real(rope).contiguous().numpy()
    _lane_layers(
        out.numpy(), layers.norms, layers.posts, layers.block, layers.table, layers.halves, eps, turns,
        rotated, k, v, slot, keys, values, at, x.dtype == torch.bfloat16,
    )  # fmt: skip
    return out
