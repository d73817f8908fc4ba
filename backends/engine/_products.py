"""One or two rows by a CPU matrix kept `[out, in]`, as loops numba compiles; and the products
the engine takes instead where they read faster (torch's, oneDNN's packed copies).

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

The loops run on the calling thread. Where torch runs two threads or more, its own threaded
products can read faster than one core does (two real cores with memory to spare; not two
hyperthreads of one), and on some CPUs its kernels stream faster even on one thread, so which
of the two a model's products take is measured once per machine, model, dtype and thread count
(`_trials.torch_reads_faster`, kept by `_decode_paths`), and a caller says which with
`by_torch`. Everything takes the weights in the layout `F.linear` reads, so nothing is copied or
kept twice.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lanefold.backends.engine._compiled import (
    _LINE,
    _jit,
    _prefetch,
    _rows_of,
    _takes,
    _words,
    compiled,
)
from lanefold.backends.engine._tiles import Tiles, tiled_linear

__all__ = ("ROWS", "pack", "packed_linear", "ready", "small_linear", "torch_rows")

ROWS = 2  # the most rows these loops take; from four rows up oneDNN's bf16 product was faster


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


@functools.cache
def ready() -> bool:
    """Whether the loops compiled (or loaded from numba's cache); False, logged once, if not."""

    def calls() -> None:
        for dtype in (torch.bfloat16, torch.float32):
            w = torch.ones(4, 2, dtype=dtype)
            x = torch.ones(1, 2)
            _rows(_words(w), dtype == torch.bfloat16, x.numpy(), np.empty((1, 4), dtype=np.float32))

    return compiled("decode products", calls)


def pack(weight: Tensor) -> Tensor:
    """`weight` `[out, in]` copied into oneDNN's own layout (an opaque tensor oneDNN's
    `_linear_pointwise` takes; `.to_dense()` gives the weight back bit for bit)."""
    return cast(Tensor, torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1))


def packed_linear(x: Tensor, packed: Tensor | Tiles) -> Tensor:
    """`F.linear(x, weight)` through oneDNN, `packed` being the weight `pack`ed, or through
    AMX's tiles where it is the weight `tile`d."""
    if isinstance(packed, Tiles):
        return tiled_linear(x, packed)
    return cast(Tensor, torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""))


def torch_rows(x: Any, weight: Tensor, packed: Tensor | Tiles | None) -> Any:
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


def _threaded(packed: Tensor | Tiles | None, weight: Tensor, by_torch: bool) -> bool:
    """Whether products of `weight` go through torch's kernels rather than the loops: where the
    caller says torch reads faster (`by_torch`, the model's decode paths) and the weight is fp32
    or has a oneDNN-packed copy (bf16 where it is native). The loops use one core, which cannot
    keep the memory busy alone: torch's `mv` on two threads reads twice what it reads on one
    (the Xeon with AMX, a 3072 x 576 matrix from memory: fp32 `mv` 13.4 -> 25.8 GB/s, fp32
    `F.linear` of two rows 24.1, oneDNN's packed bf16 product of one row 19.8; the loop 12.4 on
    either)."""
    return by_torch and (packed is not None or weight.dtype == torch.float32)


def small_linear(
    x: Tensor, weight: Tensor, packed: Tensor | Tiles | None = None, by_torch: bool = False
) -> Tensor | None:
    """`F.linear(x, weight)` for `x` of at most `ROWS` rows and a contiguous CPU `weight` in
    bf16 or fp32 (`packed`, its oneDNN copy where there is one), in `x`'s dtype; None where
    these loops do not apply (or numba is missing). Through torch where `_threaded` says so."""
    if x.shape[0] > ROWS or not _takes(weight) or not ready():
        return None
    if _threaded(packed, weight, by_torch):
        made = torch.from_numpy(torch_rows(_rows_of(x), weight, packed))
        return made if x.dtype == torch.float32 else made.to(x.dtype)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32)
    _rows(_words(weight), weight.dtype == torch.bfloat16, _rows_of(x), out.numpy())
    return out if x.dtype == torch.float32 else out.to(x.dtype)
