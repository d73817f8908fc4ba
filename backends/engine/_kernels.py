"""The decode step of one or two rows on a CPU, compiled by numba: products and a layer's halves.

A decode step of one or two lanes reads every weight of the model for one or two tokens, so its
time is the weights' bytes over the rate a product streams them. torch's kernels stream a
weight kept `[out, in]` well below what one core can read (one thread, 2-core AVX512-BF16
EPYC, each matrix read from memory, not cache: oneDNN's bf16 product 12-14 GB/s, torch's own
bf16 `mv` 5.5, MKL's fp32 product 18-19 on the transposed layout the engine used to keep for
it), where a plain `sum` reads 31 GB/s. The loops below read each weight row once, front to
back, into fp32 accumulators: LLVM vectorises them, and they read 22-32 GB/s on that machine
(`bench/decode_limit.py` prints what they get on yours). fp32 rows go four at a time: on a Xeon
with AMX, whose one core reads 16 GB/s, a row at a time read 10 and four at a time 13-16. bf16
weights are widened to fp32 by a shift (a bf16 is the high half of an fp32), so the same code
serves a CPU without native bf16; the products accumulate in fp32, which is at least as exact
as torch's bf16 ones.

Around the products, eager PyTorch pays a few microseconds an operation, some 40 a layer
(norms, RoPE, SwiGLU, residuals, casts). `layer_in` and `layer_out` do a layer's work before and
after attention in one call each, in fp32 throughout:

- `layer_in`: RMSNorm, the q|k|v product, RoPE on q and k (pairs side by side, as `_model`
  keeps the rows);
- `layer_out`: the o product and its residual, RMSNorm, the gate|up product, SwiGLU, the down
  product and its residual.

The loops run on the calling thread. Where torch runs two threads or more, its own threaded
products can read faster than one core does (two real cores with memory to spare; not two
hyperthreads of one), and on some CPUs its kernels stream faster even on one thread, so `warm`
measures it once per thread count, dtype and row width (`_torch_reads_faster`), and where torch wins
the products go through torch (fp32 `mv` or `F.linear`, bf16 through oneDNN's packed copies)
between the same compiled stages (`_normed`, `_rope`, `_residual_normed`, `_swiglu`).

Everything takes the weights in the layout `F.linear` reads, so nothing is copied or kept twice.
Two more kinds of work live here for the same reason: the shared-prefix decode attention's
between its products (`shared_attend`), and on a CPU with AMX the products of up to 128 rows of a
bf16 model through AMX's tiles (`tile`, `tiled_linear`, `prefix_tiles`), whose copies of the
weights are laid out for them.
Without numba (it is part of the `engine` extra), or where it cannot compile them, the functions
return None and the engine uses torch's kernels. Compiling takes a few seconds once a machine
(numba caches the result on disk); `warm` loads them when the model is built.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lanefold.backends.engine._memory import Arena

try:
    import numba
except ImportError:  # pragma: no cover - numba is in the engine extra
    numba = None  # type: ignore[assignment]

__all__ = (
    "ROWS",
    "TILED_ROWS",
    "Stack",
    "TileStack",
    "Tiles",
    "lane_layers",
    "lane_put",
    "layer_in",
    "layer_out",
    "pack",
    "packed_linear",
    "prefix_tiles",
    "shared_attend",
    "small_linear",
    "stack",
    "staged_in",
    "staged_out",
    "tile",
    "tile_shape",
    "tile_stack",
    "tiled_layers",
    "tiled_linear",
    "tiles_fit",
    "tiles_read_faster",
    "warm",
)

logger = logging.getLogger(__name__)

ROWS = 2  # the most rows these loops take; from four rows up oneDNN's bf16 product was faster


def _jit(fn: Callable[..., Any]) -> Any:
    """`fn` compiled by numba on first call (cached on disk where numba finds a place)."""
    if numba is None:  # pragma: no cover - numba is in the engine extra
        return fn
    # numpy's error model: a division by zero gives inf as in numpy, with no check in the loop
    # (Python's raises, and its check keeps LLVM from vectorising a loop that divides)
    flags: dict[str, Any] = {
        "fastmath": {"reassoc", "contract"},
        "nogil": True,
        "boundscheck": False,
        "error_model": "numpy",
    }
    try:
        return numba.njit(cache=True, **flags)(fn)
    except RuntimeError:  # nowhere to write the cache (a read-only install): in memory only
        return numba.njit(**flags)(fn)


# The loops take every weight as uint32 words (`_words`): an fp32 weight one word a value, a
# bf16 weight two values a word (`halves`), the even column in the low half.

_LINE = 16  # words in a 64-byte cache line


def _prefetch_hint(typingctx: Any, words: Any, index: Any) -> Any:
    """`_prefetch(words, index)`: a software prefetch (`prefetcht2` on x86) of the line holding
    `words`' `index`th word, counted flat from the first; a hint that never faults, so it may
    point past the array (into the arena's next tensor). The bf16 loop asks for the row pair
    after the one it reads: the hardware's prefetchers alone kept a core's stream of bf16 rows
    576 wide at 13.1-13.5 GB/s, asking a pair ahead into L2 at 14.5-16.2 (the Xeon with AMX, one
    thread, a step's matrices on huge pages; in the step, 31.3 against 29.2 ms). The fp32 loop,
    four rows at a time, was slower with it (49.5-50.2 against 47.1-47.5 ms)."""
    from llvmlite import ir  # type: ignore[import-untyped]
    from numba.core import cgutils, types

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        kind = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, kind, "llvm.prefetch.p0i8")  # type: ignore[no-untyped-call]
        # a read, locality 1 (to L2, not L1: each row is read once), of data
        builder.call(fn, [builder.bitcast(builder.gep(data, [args[1]]), byte), i32(0), i32(1), i32(1)])
        return context.get_dummy_value()

    return types.void(words, index), codegen


if numba is not None:
    from numba.extending import intrinsic

    _prefetch: Any = intrinsic(_prefetch_hint)
else:  # pragma: no cover - numba is in the engine extra (and the loops are not run without it)
    _prefetch = None


def _narrowed(value: Any) -> Any:  # pragma: no cover - compiled
    """The bf16 bits of an fp32 value, rounded to nearest even as torch rounds (NaN stays NaN)."""
    bits = np.float32(value).view(np.uint32)
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16(0x7FC0)
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


_narrowed = _jit(_narrowed)


def _stored(like: Any, value: Any) -> Any:  # pragma: no cover - replaced by its overload
    """`value` (fp32) as an element of the array `like`: bf16 bits where it holds them (uint16)."""


def _wide(value: Any) -> Any:  # pragma: no cover - replaced by its overload
    """An element `_stored` wrote (bf16 bits or fp32) as fp32."""


def _exp(x: Any) -> Any:  # pragma: no cover - compiled
    """e ** x as 2 ** (x log2 e) with a degree-6 polynomial: within 2e-7 of `exp` relatively,
    and it vectorises, where `np.exp` calls libm a value at a time (a lone lane's attention
    takes some 4700 a layer, SwiGLU 1536 a row); held within 2 ** -126 and 2 ** 127."""
    t = min(max(x * np.float32(1.4426950408889634), np.float32(-126.0)), np.float32(127.0))
    k = np.floor(t + np.float32(0.5))
    f = (t - k) * np.float32(0.6931471805599453)
    p = np.float32(1.0 / 720.0)
    for c in (np.float32(1.0 / 120.0), np.float32(1.0 / 24.0), np.float32(1.0 / 6.0), np.float32(0.5)):
        p = p * f + c
    p = (p * f + np.float32(1.0)) * f + np.float32(1.0)
    return p * np.uint32(np.uint32(np.int32(k) + 127) << np.uint32(23)).view(np.float32)


_exp = _jit(_exp)


if numba is not None:
    from numba.extending import overload

    @overload(_stored)
    def _stored_as(like: Any, value: Any) -> Any:
        def bits(like: Any, value: Any) -> Any:  # (numba wants the signatures alike)
            return _narrowed(value)

        def single(like: Any, value: Any) -> Any:
            return np.float32(value)

        return bits if like.dtype == numba.types.uint16 else single

    @overload(_wide)
    def _wide_as(value: Any) -> Any:
        def bits(value: Any) -> Any:
            return np.uint32(np.uint32(value) << np.uint32(16)).view(np.float32)

        def single(value: Any) -> Any:
            return np.float32(value)

        return bits if value == numba.types.uint16 else single


def _rows32(w: Any, x: Any, out: Any) -> None:  # pragma: no cover - compiled
    """`_rows` of an fp32 weight, four weight rows at a time (each its own accumulator): four
    streams in flight instead of one keep more of the memory's bandwidth busy (one thread, a
    Xeon with AMX, a 3072 x 576 matrix from memory: 9.9 GB/s a row at a time, 13.3 four at a
    time; torch's `mv` 13.4)."""
    n, rows, cols = x.shape[0], w.shape[0], w.shape[1]
    top = rows - rows % 4
    for r in range(0, top, 4):
        for i in range(n):
            a0 = np.float32(0.0)
            a1 = np.float32(0.0)
            a2 = np.float32(0.0)
            a3 = np.float32(0.0)
            for c in range(cols):
                v = x[i, c]
                a0 += np.uint32(w[r, c]).view(np.float32) * v
                a1 += np.uint32(w[r + 1, c]).view(np.float32) * v
                a2 += np.uint32(w[r + 2, c]).view(np.float32) * v
                a3 += np.uint32(w[r + 3, c]).view(np.float32) * v
            out[i, r] = a0
            out[i, r + 1] = a1
            out[i, r + 2] = a2
            out[i, r + 3] = a3
    for r in range(top, rows):
        for i in range(n):
            acc = np.float32(0.0)
            for c in range(cols):
                acc += np.uint32(w[r, c]).view(np.float32) * x[i, c]
            out[i, r] = acc


_rows32 = _jit(_rows32)


def _rows16(w: Any, x: Any, out: Any) -> None:  # pragma: no cover - compiled
    """`_rows` of a bf16 weight (two values a word): x's even and odd columns are set apart
    first, to meet each word's low and high half. Two weight rows at a time, the low and the
    high halves in accumulators of their own (on the Xeon with AMX the K = 1 step 38.4-38.7
    against 39.2-39.6 ms a row at a time; four rows at a time, as `_rows32`, was slower there,
    43-44 ms: the widening keeps the core busier than the reads)."""
    n, rows, cols = x.shape[0], w.shape[0], w.shape[1]
    even = np.empty((n, cols), dtype=np.float32)
    odd = np.empty((n, cols), dtype=np.float32)
    for i in range(n):
        for c in range(cols):
            even[i, c] = x[i, 2 * c]
            odd[i, c] = x[i, 2 * c + 1]
    mask = np.uint32(0xFFFF0000)
    shift = np.uint32(16)
    top = rows - rows % 2
    for r in range(0, top, 2):
        ahead = (r + 2) * cols
        for word in range(ahead, ahead + 2 * cols, _LINE):
            _prefetch(w, word)
        for i in range(n):
            a0 = np.float32(0.0)
            b0 = np.float32(0.0)
            a1 = np.float32(0.0)
            b1 = np.float32(0.0)
            for c in range(cols):
                w0 = w[r, c]
                w1 = w[r + 1, c]
                e = even[i, c]
                o = odd[i, c]
                a0 += np.uint32(w0 << shift).view(np.float32) * e
                b0 += np.uint32(w0 & mask).view(np.float32) * o
                a1 += np.uint32(w1 << shift).view(np.float32) * e
                b1 += np.uint32(w1 & mask).view(np.float32) * o
            out[i, r] = a0 + b0
            out[i, r + 1] = a1 + b1
    for r in range(top, rows):
        for i in range(n):
            acc = np.float32(0.0)
            for c in range(cols):
                word = w[r, c]
                low = np.uint32(word << shift).view(np.float32)
                high = np.uint32(word & mask).view(np.float32)
                acc += low * even[i, c] + high * odd[i, c]
            out[i, r] = acc


_rows16 = _jit(_rows16)


def _rows(w: Any, halves: bool, x: Any, out: Any) -> None:  # pragma: no cover - compiled
    """out[i, r] = x[i] . w[r] for every row r of the weight and i of `x` (fp32 [rows, in])."""
    if halves:
        _rows16(w, x, out)
    else:
        _rows32(w, x, out)


_rows = _jit(_rows)


def _normed(x: Any, norm: Any, eps: float) -> Any:  # pragma: no cover - compiled
    """RMSNorm of each row of `x` by the fp32 weight `norm`, as `_model._rms_norm` computes it."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        total = np.float32(0.0)
        for c in range(x.shape[1]):
            total += x[i, c] * x[i, c]
        scale = np.float32(1.0) / np.sqrt(total / np.float32(x.shape[1]) + np.float32(eps))
        for c in range(x.shape[1]):
            out[i, c] = (x[i, c] * scale) * norm[c]
    return out


_normed = _jit(_normed)


def _rope(out: Any, rope: Any, rotated: int, dim: int) -> None:  # pragma: no cover - compiled
    """RoPE in place on the first `rotated` outputs of each row (heads of `dim`, pairs side by
    side); `rope` [rows, dim / 2, 2] holds each row's (cos, sin)."""
    for i in range(out.shape[0]):
        for base in range(0, rotated, dim):
            for j in range(dim // 2):
                a = out[i, base + 2 * j]
                b = out[i, base + 2 * j + 1]
                cos = rope[i, j, 0]
                sin = rope[i, j, 1]
                out[i, base + 2 * j] = a * cos - b * sin
                out[i, base + 2 * j + 1] = a * sin + b * cos


_rope = _jit(_rope)


def _residual_normed(out: Any, x: Any, norm: Any, eps: float) -> Any:  # pragma: no cover - compiled
    """out += x; then out normed by `norm`."""
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            out[i, c] += x[i, c]
    return _normed(out, norm, eps)


_residual_normed = _jit(_residual_normed)


def _swiglu(both: Any) -> Any:  # pragma: no cover - compiled
    """silu(gate) * up of each row of gate|up."""
    n, size = both.shape[0], both.shape[1] // 2
    act = np.empty((n, size), dtype=np.float32)
    for i in range(n):
        for c in range(size):
            gate = both[i, c]
            act[i, c] = gate / (np.float32(1.0) + _exp(-gate)) * both[i, size + c]
    return act


_swiglu = _jit(_swiglu)


def _layer_in(
    x: Any, norm: Any, eps: float, qkv: Any, halves: bool, rope: Any, rotated: int, dim: int, out: Any
) -> None:  # pragma: no cover - compiled
    """RMSNorm, the q|k|v product, RoPE on its first `rotated` outputs (`_rope`)."""
    _rows(qkv, halves, _normed(x, norm, eps), out)
    _rope(out, rope, rotated, dim)


_layer_in = _jit(_layer_in)


def _layer_out(
    attended: Any, o: Any, x: Any, norm: Any, eps: float, gate_up: Any, down: Any, halves: bool, out: Any
) -> None:  # pragma: no cover - compiled
    """out = x + o(attended); then out += down(silu(gate) * up) of the normed out."""
    n, hidden = x.shape
    _rows(o, halves, attended, out)
    normed = _residual_normed(out, x, norm, eps)
    both = np.empty((n, gate_up.shape[0]), dtype=np.float32)
    _rows(gate_up, halves, normed, both)
    act = _swiglu(both)
    mlp = np.empty((n, hidden), dtype=np.float32)
    _rows(down, halves, act, mlp)
    for i in range(n):
        for c in range(hidden):
            out[i, c] += mlp[i, c]


_layer_out = _jit(_layer_out)


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


# A bf16 model's work between oneDNN's products of three rows and more (`staged_in`,
# `staged_out`), on the rows' bf16 bits (uint16), rounding where eager bf16 rounds: some 35
# eager operations a layer (1-20 us each whatever the rows) in four compiled stages.


def _normed16(x: Any, norm: Any, eps: float, out: Any) -> None:  # pragma: no cover - compiled
    """`_model._rms_norm` of bf16 rows: fp32 statistics, the scaled row rounded to bf16, then
    times the bf16 weight `norm`, rounded again."""
    for i in range(x.shape[0]):
        total = np.float32(0.0)
        for c in range(x.shape[1]):
            value = _wide(x[i, c])
            total += value * value
        scale = np.float32(1.0) / np.sqrt(total / np.float32(x.shape[1]) + np.float32(eps))
        for c in range(x.shape[1]):
            out[i, c] = _narrowed(_wide(norm[c]) * _wide(_narrowed(_wide(x[i, c]) * scale)))


_normed16 = _jit(_normed16)


def _residual_normed16(
    made: Any, x: Any, norm: Any, eps: float, out: Any
) -> None:  # pragma: no cover - compiled
    """made += x (bf16, in place); out = made normed (`_normed16`)."""
    for i in range(x.shape[0]):
        for c in range(x.shape[1]):
            made[i, c] = _narrowed(_wide(made[i, c]) + _wide(x[i, c]))
    _normed16(made, norm, eps, out)


_residual_normed16 = _jit(_residual_normed16)


def _rope16(words: Any, rope: Any, rotated: int, dim: int) -> None:  # pragma: no cover - compiled
    """`_rope` on bf16 rows held as uint32 words, one rotated pair a word (low half first)."""
    mask = np.uint32(0xFFFF0000)
    half = dim // 2
    for i in range(words.shape[0]):
        for base in range(0, rotated // 2, half):
            for j in range(half):
                word = words[i, base + j]
                a = np.uint32(word << np.uint32(16)).view(np.float32)
                b = np.uint32(word & mask).view(np.float32)
                cos = rope[i, j, 0]
                sin = rope[i, j, 1]
                low = np.uint32(_narrowed(a * cos - b * sin))
                words[i, base + j] = low | (np.uint32(_narrowed(a * sin + b * cos)) << np.uint32(16))


_rope16 = _jit(_rope16)


def _swiglu16(both: Any, act: Any) -> None:  # pragma: no cover - compiled
    """act = silu(gate) * up of bf16 gate|up rows, silu rounded to bf16 first as eager's in-place
    silu is."""
    size = act.shape[1]
    for i in range(act.shape[0]):
        for c in range(size):
            gate = _wide(both[i, c])
            silu = _wide(_narrowed(gate / (np.float32(1.0) + _exp(-gate))))
            act[i, c] = _narrowed(silu * _wide(both[i, size + c]))


_swiglu16 = _jit(_swiglu16)


# Decode attention of several sequences, where groups of them share their leading blocks (K forks
# of one prompt, prompts behind one cached preamble). The products with the prefix are torch's
# batched ones (with AMX, bf16, SmolLM2's heads, 24 queries over 496 positions: 27 us for the
# three KV heads; a compiled loop took 27 a head), or on a CPU with AMX the tiles' below
# (`_tiled_attend`); what lies between them (the sequences' own keys and values in the pool, the
# softmax over both parts, the sum of the two halves) is compiled, where `_attention` ran some
# 15 eager operations a layer: 12 of a K = 8 step's 48 ms (bf16, one thread, the Xeon with AMX).


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


# A bf16 product of a few rows on a CPU with AMX (Intel's tile unit), compiled from LLVM's AMX
# intrinsics: oneDNN's packed product of 8 rows streamed SmolLM2's layers at about 10 GB/s (22
# ms a step, one thread, the Xeon with AMX), where the tiles below, read in order from huge pages,
# take 16-18 ms from 1 to 16 rows and 22 at 32 (oneDNN 28; `bench/tiles.py`); at 128 rows they
# are level, so more rows (a prefill) keep torch's product.
#
# A weight `[N, K]` is kept as `[N / 16, K / 32, 16, 16]` uint32 words (`tile`): for each 16
# outputs and 32 inputs, one 1 KiB tile of 16 rows, row j holding each output's inputs 2j and
# 2j + 1 side by side (the pairs `tdpbf16ps` multiplies). The rows `x` are plain bf16 `[M, K]`.
# Tiles 0, 1 (sums) and 2 (rows) take 16 rows at a time, 5, 6 and 7 the last M % 16; 3 and 4
# are a pair of weight tiles, so each tile of rows meets 32 outputs.


def _tile_dots_hint(typingctx: Any, tiles: Any, x: Any, out: Any, config: Any) -> Any:
    """`_tile_dots(tiles, x, out, config)`: fp32 `out[M, N]` = bf16 `x[M, K]` (uint16 bits)
    times the weight in `tiles` (see above), under the tile `config` (64 bytes, `_tile_config`)."""
    from llvmlite import ir
    from numba.core import cgutils, types

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        t, rows, sums, cfg = (
            context.make_array(kind)(context, builder, value)
            for kind, value in zip(signature.args, args, strict=True)
        )
        i8, i64, void = ir.IntType(8), ir.IntType(64), ir.VoidType()
        byte = i8.as_pointer()

        def fn(name: str, *kinds: Any) -> Any:
            return cgutils.get_or_insert_function(builder.module, ir.FunctionType(void, list(kinds)), name)  # type: ignore[no-untyped-call]

        configure, release = fn("llvm.x86.ldtilecfg", byte), fn("llvm.x86.tilerelease")
        load, store = fn("llvm.x86.tileloadd64", i8, byte, i64), fn("llvm.x86.tilestored64", i8, byte, i64)
        zero, dot = fn("llvm.x86.tilezero", i8), fn("llvm.x86.tdpbf16ps", i8, i8, i8)
        blocks, chunks = builder.extract_value(t.shape, 0), builder.extract_value(t.shape, 1)
        m = builder.extract_value(rows.shape, 0)
        full, rest = builder.udiv(m, i64(16)), builder.urem(m, i64(16))
        row_bytes, out_bytes = builder.mul(chunks, i64(64)), builder.mul(blocks, i64(64))
        span = builder.mul(chunks, i64(1024))  # bytes of 16 outputs' tiles
        base, xs, ys = (builder.bitcast(a.data, byte) for a in (t, rows, sums))
        builder.call(configure, [builder.bitcast(cfg.data, byte)])

        def block(first: int, second: int, a: int, row: Any, b0: Any, nb: Any) -> None:
            b1 = builder.gep(b0, [span])
            start = builder.gep(xs, [builder.mul(row, row_bytes)])
            builder.call(zero, [i8(first)])
            builder.call(zero, [i8(second)])
            with cgutils.for_range(builder, chunks) as chunk:
                at = builder.mul(chunk.index, i64(64))
                tile_at = builder.mul(chunk.index, i64(1024))
                builder.call(load, [i8(a), builder.gep(start, [at]), row_bytes])
                builder.call(load, [i8(3), builder.gep(b0, [tile_at]), i64(64)])
                builder.call(load, [i8(4), builder.gep(b1, [tile_at]), i64(64)])
                builder.call(dot, [i8(first), i8(a), i8(3)])
                builder.call(dot, [i8(second), i8(a), i8(4)])
            target = builder.gep(ys, [builder.add(builder.mul(row, out_bytes), builder.mul(nb, i64(64)))])
            builder.call(store, [i8(first), target, out_bytes])
            builder.call(store, [i8(second), builder.gep(target, [i64(64)]), out_bytes])

        with cgutils.for_range(builder, builder.udiv(blocks, i64(2))) as pair:
            nb = builder.mul(pair.index, i64(2))
            b0 = builder.gep(base, [builder.mul(nb, span)])
            with cgutils.for_range(builder, full) as sixteen:
                block(0, 1, 2, builder.mul(sixteen.index, i64(16)), b0, nb)
            with builder.if_then(builder.icmp_unsigned("!=", rest, i64(0))):
                block(5, 6, 7, builder.mul(full, i64(16)), b0, nb)
        builder.call(release, [])
        return context.get_dummy_value()

    return types.void(tiles, x, out, config), codegen


if numba is not None:
    _tile_dots: Any = intrinsic(_tile_dots_hint)
else:  # pragma: no cover - numba is in the engine extra
    _tile_dots = None


def _tile_config(rows: int) -> Any:  # pragma: no cover - compiled
    """The 64 bytes `_tile_dots` loads for a product of `rows` rows (palette 1; each tile's
    bytes a row, little-endian, at 16 + 2 t; its rows at 48 + t): sums, rows and the weight's
    pair 16 rows of 64 bytes, the last `rows % 16` rows' sums and rows as many. Made from the
    rows the product is given, so the tiles never reach past them."""
    config = np.zeros(64, dtype=np.uint8)
    config[0] = 1
    rest = rows % 16
    for t in range(8):
        height = 16 if t < 5 else rest
        if height:
            config[16 + 2 * t] = 64
            config[48 + t] = height
    return config


_tile_config = _jit(_tile_config)


def _tiled_rows(tiles: Any, x: Any, out: Any) -> None:  # pragma: no cover - compiled
    """bf16 `out[M, N]` (bits) = bf16 `x[M, K]` (bits) times the weight in `tiles`, rounded once
    from the fp32 sums."""
    if x.shape[1] != tiles.shape[1] * 32 or out.shape[0] != x.shape[0] or out.shape[1] != tiles.shape[0] * 16:
        raise ValueError("the rows, the tiles and the output disagree")
    sums = np.empty((x.shape[0], tiles.shape[0] * 16), dtype=np.float32)
    _tile_dots(tiles, x, sums, _tile_config(x.shape[0]))
    for i in range(sums.shape[0]):
        for j in range(sums.shape[1]):
            out[i, j] = _narrowed(sums[i, j])


_tiled_rows = _jit(_tiled_rows)


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


def _tiled_in(
    x: Any, norm: Any, eps: float, qkv: Any, rope: Any, rotated: int, dim: int, made: Any
) -> None:  # pragma: no cover - compiled
    """`staged_in` with the q|k|v product through AMX's tiles, in one call: bf16 rows `x`
    normed (`_normed16`), times `qkv`'s tiles into `made` (bf16 bits), RoPE on its first
    `rotated` outputs (`_rope16`)."""
    h = np.empty_like(x)
    _normed16(x, norm, eps, h)
    _tiled_rows(qkv, h, made)
    _rope16(made.view(np.uint32), rope, rotated, dim)


_tiled_in = _jit(_tiled_in)


def _tiled_out(
    attended: Any, o: Any, x: Any, norm: Any, eps: float, gate_up: Any, down: Any, out: Any
) -> None:  # pragma: no cover - compiled
    """`staged_out` with its three products through AMX's tiles, in one call: `out` (bf16 bits)
    = `x` plus the o product of `attended`, plus the SwiGLU MLP of that normed, rounded where
    the eager bf16 layer rounds."""
    made = np.empty_like(x)
    _tiled_rows(o, attended, made)
    h = np.empty_like(x)
    _residual_normed16(made, x, norm, eps, h)
    both = np.empty((x.shape[0], gate_up.shape[0] * 16), dtype=np.uint16)
    _tiled_rows(gate_up, h, both)
    act = np.empty((x.shape[0], both.shape[1] // 2), dtype=np.uint16)
    _swiglu16(both, act)
    _tiled_rows(down, act, out)
    for i in range(out.shape[0]):
        for c in range(out.shape[1]):
            out[i, c] = _narrowed(_wide(out[i, c]) + _wide(made[i, c]))


_tiled_out = _jit(_tiled_out)


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


@functools.cache
def _ready() -> bool:
    """Whether the loops compiled (or loaded from numba's cache); False, logged once, if not."""
    if numba is None:  # pragma: no cover - numba is in the engine extra
        logger.info("numba is not installed: decode products go through torch's kernels")
        return False
    try:
        for dtype in (torch.bfloat16, torch.float32):
            _compile_for(dtype)
    except Exception:  # an LLVM or numba failure must not stop the engine: it only costs speed
        logger.warning("numba could not compile the decode loops: using torch's kernels", exc_info=True)
        return False
    return True


def _compile_for(dtype: torch.dtype) -> None:
    """Call every loop once on tiny arrays of the engine's types, compiling it."""
    f32 = torch.float32
    w = torch.ones(4, 2, dtype=dtype)
    x = torch.ones(1, 2)
    small = np.empty((1, 4), dtype=np.float32)
    halves = dtype == torch.bfloat16
    _rows(_words(w), halves, x.numpy(), small)
    rope = torch.ones(1, 1, 2, dtype=f32).numpy()
    _layer_in(x.numpy(), torch.ones(2).numpy(), 1e-5, _words(w), halves, rope, 2, 2, small)
    square = _words(torch.ones(2, 2, dtype=dtype))
    out = np.empty((1, 2), dtype=np.float32)
    _layer_out(x.numpy(), square, x.numpy(), torch.ones(2).numpy(), 1e-5, _words(w), square, halves, out)
    # the stages the torch-products path calls on their own (`_normed` and `_rope` compile above)
    _swiglu(_residual_normed(out, x.numpy(), torch.ones(2).numpy(), 1e-5))
    for lane in (torch.bfloat16, torch.float32):  # the lane in the dtype attention runs in
        row = np.ones((1, 6), dtype=np.float32)
        pool, kept = torch.zeros(2, 1, 2, dtype=dtype), torch.zeros(1, 2, 2, dtype=lane)
        q = torch.empty(2, dtype=lane)
        _lane_put(row, 4, _array(pool), _array(pool), 1, _array(kept), _array(kept), 1, _array(q))
    bits = np.ones((2, 4), dtype=np.uint16)
    _normed16(bits, bits[0], 1e-5, bits.copy())
    _residual_normed16(bits.copy(), bits, bits[0], 1e-5, bits.copy())
    _rope16(bits.view(np.uint32).copy(), torch.ones(2, 1, 2).numpy(), 2, 2)
    _swiglu16(bits, bits[:, :2].copy())
    # a whole lone-lane step of a one-layer model: hidden 4, two heads of 2 over one KV head
    words = 2 if halves else 4  # a row of 4 values
    block = np.zeros(24 * words, dtype=np.uint32)
    table = np.array([[[0, 8, words], [8 * words, 4, words], [12 * words, 8, words], [20 * words, 4, words]]])
    norms = np.ones((1, 4), dtype=np.float32)
    rope = torch.ones(1, 1, 2).numpy()
    for lane in (torch.bfloat16, torch.float32):
        pool, kept = torch.zeros(1, 2, 1, 2, dtype=dtype), torch.zeros(1, 1, 2, 2, dtype=lane)
        h = np.ones((1, 4), dtype=np.float32)
        _lane_layers(h, norms, norms, block, table, halves, 1e-5, rope, 6, _array(pool), _array(pool), 1,
                     _array(kept), _array(kept), 1, halves)  # fmt: skip
    # shared-prefix attention in the dtype it runs in (the model's, or fp32 where bf16 is emulated)
    pool, index = torch.zeros(2, 1, 2, dtype=dtype), np.zeros(1, dtype=np.int64)
    acc = np.zeros((1, 2, 2), dtype=np.float32)
    for work in {dtype, torch.float32}:
        queries, answer = torch.ones(1, 2, 2, dtype=work), torch.empty(1, 4, dtype=work)
        scores = _array(torch.ones(1, 2, 1, dtype=work))
        _own_softmax(scores, _array(queries), index, _array(pool), _array(pool), index.reshape(1, 1), 2,
                     np.ones(1, dtype=np.int64), 1, scores.copy(), acc)  # fmt: skip
        _summed(acc, _array(queries), index, _array(answer))


def _words(weight: Tensor) -> Any:
    """A contiguous CPU weight's memory as uint32 words (see the loops)."""
    return weight.view(torch.int32).numpy().view(np.uint32)


def _array(tensor: Tensor) -> Any:
    """A contiguous CPU tensor's memory as numpy sees it: fp32 as float32, bf16 as its bits
    (uint16), as `_stored` writes them."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _takes(weight: Tensor) -> bool:
    """Whether the loops read `weight`: a contiguous CPU matrix in fp32, or bf16 of even width."""
    return (
        weight.device.type == "cpu"
        and weight.is_contiguous()
        and (weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and weight.shape[-1] % 2 == 0))
    )


def _rows_of(x: Tensor) -> Any:
    return x.float().contiguous().numpy()


def _threaded(packed: Tensor | Tiles | None, weight: Tensor) -> bool:
    """Whether products of `weight` go through torch's kernels rather than the loops: where the
    weight is fp32 or has a oneDNN-packed copy (bf16 where it is native) and torch reads faster
    at its thread count (the engine's `threads`). The loops use one core, which cannot keep the
    memory busy alone: torch's `mv` on two threads reads twice what it reads on one (the Xeon
    with AMX, a 3072 x 576 matrix from memory: fp32 `mv` 13.4 -> 25.8 GB/s, fp32 `F.linear` of
    two rows 24.1, oneDNN's packed bf16 product of one row 19.8; the loop 12.4 on either)."""
    if packed is None and weight.dtype != torch.float32:
        return False
    return _torch_reads_faster(torch.get_num_threads(), weight.dtype, weight.shape[1])


_TRIAL_BYTES = 32 << 20  # what `_torch_reads_faster` reads a pass, each way
_TRIAL_MATRIX = 2 << 20  # ... in matrices of about this size, as a small model's layers are


def _trial_matrices(dtype: torch.dtype, width: int, nbytes: int, multiple: int = 1) -> list[Tensor]:
    """Matrices `width` wide of about `_TRIAL_MATRIX` bytes each (rows a multiple of
    `multiple`), `nbytes` of them in all, one after another in an `Arena` as a model's layers
    lie: what the load-time trials read."""
    size = torch.empty((), dtype=dtype).element_size()
    rows = max(64, _TRIAL_MATRIX // (width * size)) // multiple * multiple
    count = max(2, nbytes // (rows * width * size))
    arena = Arena.of([(rows, width)] * count, dtype, torch.device("cpu"))
    return [arena.empty((rows, width)).fill_(0.5) for _ in range(count)]


def _best_of_three(runs: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Each run's best time of three, interleaved, after a first run of each (which faults the
    pages in): the load-time trials' measure."""
    times = dict.fromkeys(runs, float("inf"))
    for run in runs.values():
        run()
    for _ in range(3):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name] = min(times[name], time.perf_counter() - start)
    return times


@functools.cache
def _torch_reads_faster(threads: int, dtype: torch.dtype, width: int) -> bool:
    """Whether, on this machine at `threads` threads, torch's one-row products of `dtype`
    matrices `width` wide (fp32 `mv`, or oneDNN's packed bf16) read faster than the one-thread
    loop: measured once a process (tens of milliseconds), not assumed. Two threads read twice
    what one does only where they are two cores with memory to spare (not two hyperthreads of
    one), and which kernel streams a matrix fastest differs between CPUs and shapes (on a Xeon
    with AMX, one thread, bf16: 576 wide as SmolLM2's layers, the loop 13.0 GB/s and oneDNN
    10.6; 1024 wide, level). The matrices, 32 MiB, are read one after another as a decode step
    reads its layers, from where the model's lie (an `Arena`, on huge pages; the packed copies
    where oneDNN puts them)."""
    matrices = _trial_matrices(dtype, width, _TRIAL_BYTES)
    x = np.ones((1, width), dtype=np.float32)
    out = np.empty((1, matrices[0].shape[0]), dtype=np.float32)
    words = [_words(m) for m in matrices]
    try:
        copies = [pack(m) if dtype != torch.float32 else None for m in matrices]
    except (AttributeError, RuntimeError):  # a torch without oneDNN's packed products
        return False
    halves = dtype == torch.bfloat16

    def loop() -> None:
        for w in words:
            _rows(w, halves, x, out)

    def by_torch() -> None:
        for m, copy in zip(matrices, copies, strict=True):
            _by_torch(x, m, copy)

    times = _best_of_three({"loop": loop, "torch": by_torch})
    logger.debug("one-row products %d wide, %d threads, %s: %s", width, threads, dtype, times)
    return times["torch"] < times["loop"]


def pack(weight: Tensor) -> Tensor:
    """`weight` `[out, in]` copied into oneDNN's own layout (an opaque tensor oneDNN's
    `_linear_pointwise` takes; `.to_dense()` gives the weight back bit for bit)."""
    return cast(Tensor, torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1))


class Tiles(NamedTuple):
    """A bf16 weight `[N, K]` laid out for AMX's tiles (see `_tile_dots`), beside the weight
    itself (a product of more rows than `TILED_ROWS` goes through torch)."""

    tiles: Tensor  # int32 [N / 16, K / 32, 16, 16]
    weight: Tensor
    words: Any  # `tiles` as numpy uint32, as the loop reads them


TILED_ROWS = 128  # the most rows a tiled product takes (see `_tile_dots`)


def tiles_fit(weight: Tensor) -> bool:
    """Whether `tile` takes `weight`: a bf16 CPU matrix whose sides are multiples of 32."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.shape[0] % 32 == 0
        and weight.shape[1] % 32 == 0
    )


def tile_shape(weight: Tensor) -> tuple[int, int, int, int]:
    """The shape of `weight`'s tiles (int32)."""
    return (weight.shape[0] // 16, weight.shape[1] // 32, 16, 16)


def tile(weight: Tensor, memory: Arena | None = None) -> Tiles:
    """`weight` (`tiles_fit`) copied into AMX's tile layout, into `memory` (an int32 `Arena`)
    where given: for each 16 outputs and 32 inputs a tile whose row j holds each output's inputs
    2j and 2j + 1 side by side."""
    n, k = weight.shape
    words = weight.contiguous().view(torch.int32).view(n // 16, 16, k // 32, 16).permute(0, 2, 3, 1)
    shape = tile_shape(weight)
    tiles = memory.empty(shape) if memory is not None else torch.empty(shape, dtype=torch.int32)
    tiles.copy_(words)
    return Tiles(tiles, weight, tiles.numpy().view(np.uint32))


def tiled_linear(x: Tensor, weight: Tiles) -> Tensor:
    """`F.linear(x, weight.weight)` of bf16 rows `x` `[M, K]`: up to `TILED_ROWS` rows through
    AMX's tiles, more through torch. Sums in fp32, rounded to bf16 once."""
    if x.dim() != 2 or x.shape[0] > TILED_ROWS or x.dtype != torch.bfloat16 or x.device.type != "cpu":
        return F.linear(x, weight.weight)
    rows = x.contiguous()
    out = torch.empty((x.shape[0], weight.weight.shape[0]), dtype=torch.bfloat16)
    _tiled_rows(weight.words, _array(rows), _array(out))
    return out


_XCOMP_PERM, _XTILEDATA = 0x1023, 18  # arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)


@functools.cache
def _amx_ready() -> bool:
    """Whether the tiled products run here: a CPU with AMX (tiles and bf16) that LLVM targets,
    Linux granting this process the tiles' state (once a process; oneDNN asks the same), numba;
    and a small product through them equal to torch's. False, logged, where not."""
    if numba is None or not _ready() or sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        from llvmlite import binding

        features = binding.get_host_cpu_features()
        if not (features.get("amx-tile") and features.get("amx-bf16") and torch.cpu._is_amx_tile_supported()):
            return False
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(158, _XCOMP_PERM, _XTILEDATA) != 0:  # 158: arch_prctl on x86-64
            logger.info("Linux did not grant the AMX tiles' state: products go through oneDNN")
            return False
        g = torch.Generator().manual_seed(0)
        weight = torch.randn(64, 96, generator=g).bfloat16()
        x = torch.randn(19, 96, generator=g).bfloat16()
        want = F.linear(x.float(), weight.float())
        if not torch.allclose(tiled_linear(x, tile(weight)).float(), want, rtol=1e-2, atol=1e-2):
            return False
        # and compile the shared-prefix attention over tiles (its queries a strided view)
        row = torch.zeros(1, 6, 32, dtype=torch.bfloat16)
        prefix = torch.zeros(1, 2, 32, 32, dtype=torch.bfloat16)
        pool, index = torch.zeros(64, 2, 32, dtype=torch.bfloat16), np.zeros(1, dtype=np.int64)
        tiles = _prefix_tiles(prefix, prefix)
        words = (tiles[0][0].numpy().view(np.uint32), tiles[1][0].numpy().view(np.uint32))
        out = torch.empty(1, 64, dtype=torch.bfloat16)
        _tiled_attend(_array(row[:, :2]), index, *words, 32, _array(pool), _array(pool), index.reshape(1, 1),
                      16, np.full(1, 32, dtype=np.int64), _array(out))  # fmt: skip
        # and a layer's halves around attention over tiles (`staged_in`, `staged_out`)
        square = tile(torch.zeros(32, 32, dtype=torch.bfloat16)).words
        bits = np.zeros((1, 32), dtype=np.uint16)
        _tiled_in(bits, bits[0], 1e-5, square, np.ones((1, 16, 2), dtype=np.float32), 32, 32, bits.copy())
        wide = tile(torch.zeros(64, 32, dtype=torch.bfloat16)).words
        _tiled_out(bits, square, bits, bits[0], 1e-5, wide, square, bits.copy())
        _compile_tiled_layers()
        return True
    except Exception:  # an LLVM or numba failure must not stop the engine: it only costs speed
        logger.warning("the AMX tile products could not compile: using oneDNN's", exc_info=True)
        return False


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
def tiles_read_faster(threads: int, width: int) -> bool:
    """Whether, on this machine at `threads` threads, the tiled products of 8 rows (a decode
    step of a few lanes) over bf16 matrices `width` wide stream faster than oneDNN's packed ones:
    measured once a process (tens of milliseconds), as `_torch_reads_faster`. False without
    AMX (`_amx_ready`)."""
    if not _amx_ready():
        return False
    matrices = _trial_matrices(torch.bfloat16, width, _TRIAL_BYTES // 2, multiple=32)
    memory = Arena.of([tile_shape(m) for m in matrices], torch.int32, torch.device("cpu"))
    tiled = [tile(m, memory) for m in matrices]
    copies = [pack(m) for m in matrices]
    x = torch.full((8, width), 0.25, dtype=torch.bfloat16)

    def by_tiles() -> None:
        for t in tiled:
            tiled_linear(x, t)

    def by_onednn() -> None:
        for copy in copies:
            packed_linear(x, copy)

    times = _best_of_three({"tiles": by_tiles, "oneDNN": by_onednn})
    logger.debug("8-row products %d wide, %d threads: %s", width, threads, times)
    return times["tiles"] < times["oneDNN"]


def packed_linear(x: Tensor, packed: Tensor | Tiles) -> Tensor:
    """`F.linear(x, weight)` through oneDNN, `packed` being the weight `pack`ed, or through
    AMX's tiles where it is the weight `tile`d."""
    if isinstance(packed, Tiles):
        return tiled_linear(x, packed)
    return cast(Tensor, torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))


def _by_torch(x: Any, weight: Tensor, packed: Tensor | Tiles | None) -> Any:
    """fp32 numpy `[rows, out]`: the rows `x` (fp32 numpy) times `weight` through torch's
    threaded kernels (in the weight's dtype), or its packed copy."""
    rows = torch.from_numpy(x)
    if packed is not None:
        made = packed_linear(rows.to(weight.dtype), packed)
    elif rows.shape[0] == 1:  # F.linear of one row runs on one thread; mv on all of them
        made = torch.mv(weight, rows[0].to(weight.dtype))[None]
    else:
        made = F.linear(rows.to(weight.dtype), weight)
    return made.float().contiguous().numpy()


def staged_in(
    x: Tensor, norm: Tensor, eps: float, qkv: Tensor | Tiles, rope: Tensor, rotated: int, dim: int
) -> Tensor | None:
    """bf16 `[rows, outputs]`: bf16 rows `x` normed by the bf16 `norm`, times the packed q|k|v
    `qkv` (oneDNN's, or AMX's tiles), the first `rotated` outputs turned by `rope` (complex
    `[rows, dim / 2]`); as the eager layer computes them (RoPE within one fp32 rounding). None
    where it does not apply."""
    if x.dtype != torch.bfloat16 or norm.dtype != torch.bfloat16 or not x.is_contiguous() or not _ready():
        return None
    turns = torch.view_as_real(rope).contiguous().numpy()
    if isinstance(qkv, Tiles) and x.shape[0] <= TILED_ROWS:  # the whole stage in one call
        made = torch.empty((x.shape[0], qkv.weight.shape[0]), dtype=torch.bfloat16)
        _tiled_in(_array(x), _array(norm), eps, qkv.words, turns, rotated, dim, _array(made))
        return made
    h = torch.empty_like(x)
    _normed16(_array(x), _array(norm), eps, _array(h))
    made = packed_linear(h, qkv)
    _rope16(_words(made), turns, rotated, dim)
    return made


def staged_out(
    attended: Tensor,
    o: Tensor | Tiles,
    x: Tensor,
    norm: Tensor,
    eps: float,
    gate_up: Tensor | Tiles,
    down: Tensor | Tiles,
) -> Tensor | None:
    """The layer's bf16 output: `x` plus the packed `o`'s product of `attended`, plus the SwiGLU
    MLP (the packed `gate_up`, then `down`) of that normed by the bf16 `norm`; as the eager layer
    computes it. None where it does not apply."""
    if x.dtype != torch.bfloat16 or norm.dtype != torch.bfloat16 or not x.is_contiguous() or not _ready():
        return None
    rows = x.shape[0]
    if isinstance(o, Tiles) and isinstance(gate_up, Tiles) and isinstance(down, Tiles) and rows <= TILED_ROWS:
        out = torch.empty_like(x)  # the whole stage in one call
        attended = attended.to(torch.bfloat16).contiguous()
        _tiled_out(
            _array(attended), o.words, _array(x), _array(norm), eps, gate_up.words, down.words, _array(out)
        )
        return out
    made = packed_linear(attended.to(torch.bfloat16), o)
    h = torch.empty_like(x)
    _residual_normed16(_array(made), _array(x), _array(norm), eps, _array(h))
    both = packed_linear(h, gate_up)
    act = torch.empty((x.shape[0], both.shape[1] // 2), dtype=torch.bfloat16)
    _swiglu16(_array(both), _array(act))
    return packed_linear(act, down).add_(made)


def small_linear(x: Tensor, weight: Tensor, packed: Tensor | Tiles | None = None) -> Tensor | None:
    """`F.linear(x, weight)` for `x` of at most `ROWS` rows and a contiguous CPU `weight` in
    bf16 or fp32 (`packed`, its oneDNN copy where there is one), in `x`'s dtype; None where
    these loops do not apply (or numba is missing). Through torch where `_threaded` says so."""
    if x.shape[0] > ROWS or not _takes(weight) or not _ready():
        return None
    if _threaded(packed, weight):
        made = torch.from_numpy(_by_torch(_rows_of(x), weight, packed))
        return made if x.dtype == torch.float32 else made.to(x.dtype)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32)
    _rows(_words(weight), weight.dtype == torch.bfloat16, _rows_of(x), out.numpy())
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def layer_in(
    x: Tensor,
    norm: Tensor,
    eps: float,
    qkv: Tensor,
    rope: Tensor,
    rotated: int,
    dim: int,
    packed: Tensor | Tiles | None = None,
) -> Tensor | None:
    """fp32 `[rows, outputs]`: `x` normed by `norm` (fp32), times the fused `qkv` (`packed`, its
    oneDNN copy where there is one), its first `rotated` outputs turned by `rope` (complex
    `[rows, dim / 2]`); None where the loops do not apply."""
    if x.shape[0] > ROWS or not _takes(qkv) or not _ready():
        return None
    turns = torch.view_as_real(rope).contiguous().numpy()
    if _threaded(packed, qkv):
        made = _by_torch(_normed(_rows_of(x), norm.numpy(), eps), qkv, packed)
        _rope(made, turns, rotated, dim)
        return torch.from_numpy(made)
    out = torch.empty((x.shape[0], qkv.shape[0]), dtype=torch.float32)
    halves = qkv.dtype == torch.bfloat16
    _layer_in(_rows_of(x), norm.numpy(), eps, _words(qkv), halves, turns, rotated, dim, out.numpy())
    return out


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
    if not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors) or not _ready():
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
    first: tuple[Tensor, Tensor | Tiles | None]  # the first q|k|v and its packed copy: `_threaded` asks


def stack(
    layers: list[tuple[Tensor, ...]], block: Any, base: int, packed: Tensor | Tiles | None = None
) -> Stack | None:
    """The `Stack` of `layers`, each (input norm, post norm, qkv, o, gate_up, down), the norms
    fp32 and the matrices lying in `block` (numpy uint32 words whose first is at address
    `base`: the model's `_memory.Arena`); `packed`, the first qkv's oneDNN copy. None where the
    loops do not take them all (or numba is missing). One block and a table, not a list of
    arrays: numba's typed lists cost 0.3 s of every process's first use."""
    if not layers or not _ready():
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
    return Stack(norms, posts, block, table, dtype == torch.bfloat16, (layers[0][2], packed))


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
    where it does not apply: other dtypes, a device, or torch's products read faster."""
    tensors = (*cache, *lane)
    if x.shape[0] != 1 or not all(t.device.type == "cpu" and t.is_contiguous() for t in tensors):
        return None
    if any(t.dtype not in (torch.float32, torch.bfloat16) for t in tensors) or _threaded(
        layers.first[1], layers.first[0]
    ):
        return None
    out = x.float().clone()  # (a fresh tensor: the loop works in place)
    k, v, keys, values = (_array(t) for t in tensors)
    turns = torch.view_as_real(rope).contiguous().numpy()
    _lane_layers(
        out.numpy(), layers.norms, layers.posts, layers.block, layers.table, layers.halves, eps, turns,
        rotated, k, v, slot, keys, values, at, x.dtype == torch.bfloat16,
    )  # fmt: skip
    return out


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
    return _tile_stack(layers, block, base) if layers and _amx_ready() else None


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


def layer_out(
    attended: Tensor,
    o: Tensor,
    x: Tensor,
    norm: Tensor,
    eps: float,
    gate_up: Tensor,
    down: Tensor,
    packed: tuple[Tensor | Tiles, Tensor | Tiles, Tensor | Tiles] | None = None,
) -> Tensor | None:
    """The layer's output in `x`'s dtype: `x` plus the o product of `attended`, plus the SwiGLU
    MLP (the fused `gate_up`, then `down`) of that normed by `norm` (fp32); None where the loops
    do not apply."""
    if x.shape[0] > ROWS or not all(_takes(w) for w in (o, gate_up, down)) or not _ready():
        return None
    if not o.dtype == gate_up.dtype == down.dtype:
        return None
    if _threaded(packed and packed[0], o):
        copies = packed or (None, None, None)
        made = _by_torch(_rows_of(attended), o, copies[0])
        act = _swiglu(_by_torch(_residual_normed(made, _rows_of(x), norm.numpy(), eps), gate_up, copies[1]))
        made += _by_torch(act, down, copies[2])
        result = torch.from_numpy(made)
        return result if x.dtype == torch.float32 else result.to(x.dtype)
    out = torch.empty(x.shape, dtype=torch.float32)
    halves = o.dtype == torch.bfloat16
    words = (_words(o), _words(gate_up), _words(down))
    _layer_out(
        _rows_of(attended), words[0], _rows_of(x), norm.numpy(), eps, words[1], words[2], halves, out.numpy()
    )
    return out if x.dtype == torch.float32 else out.to(x.dtype)


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
    return _prefix_tiles(keys, values) if _amx_ready() else None


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
    if any(t.dtype not in (torch.float32, torch.bfloat16) for t in (q, *arrays)) or not _ready():
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


def warm(dtype: torch.dtype = torch.float32, width: int = 1024) -> None:
    """Compile (or load from numba's cache) the loops now, and measure whether torch's products
    of `dtype` matrices `width` wide (the model's hidden size) beat them at torch's thread count
    now, so no request pays for either."""
    if _ready() and dtype in (torch.float32, torch.bfloat16):
        _torch_reads_faster(torch.get_num_threads(), dtype, width)
