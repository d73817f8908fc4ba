"""Matrix products of one or two rows on a CPU, compiled by numba: the decode step's kernel.

A decode step of one or two lanes reads every weight of the model for one or two tokens, so its
time is the weights' bytes over the rate a product streams them. torch's kernels stream a
weight kept `[out, in]` well below what one core can read (one thread, 2-core AVX512-BF16
EPYC, each matrix read from memory, not cache: oneDNN's bf16 product 12-14 GB/s, torch's own
bf16 `mv` 5.5, MKL's fp32 product 18-19 on the transposed layout the engine used to keep for
it), where a plain `sum` reads 31 GB/s. The loops below read each weight row once, front to
back, and keep two fp32 accumulators: LLVM vectorises them, and they read 22-32 GB/s on that
machine (`bench/decode_limit.py` prints what they get on yours). bf16 weights are widened to
fp32 by a shift (a bf16 is the high half of an fp32), so the same code serves a CPU without
native bf16; the products accumulate in fp32, which is at least as exact as torch's bf16 ones.

`small_linear` takes the weight in the layout `F.linear` reads, so nothing is copied or kept
twice. Without numba (it is part of the `engine` extra) `small_linear` returns None and the
engine uses torch's kernels. The first call compiles the loops, about 0.3 s a dtype, once per
machine: numba caches them on disk.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ("ROWS", "small_linear", "warm")

logger = logging.getLogger(__name__)

ROWS = 2  # the most rows these loops take; from four rows up oneDNN's bf16 product was faster


@functools.cache
def _loops() -> tuple[Any, Any] | None:
    """(bf16 loop, fp32 loop), compiled on first use; None where numba cannot be imported."""
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is in the engine extra
        logger.info("numba is not installed: decode products go through torch's kernels")
        return None
    jit = numba.njit(fastmath={"reassoc", "contract"}, nogil=True, cache=True, boundscheck=False)

    def bf16_rows(w: Any, x: Any, out: Any) -> None:  # pragma: no cover - compiled
        # w: uint32 [out, in / 2], two bf16 a word (the even column in the low half);
        # x: fp32 [rows, in], split into its even and odd columns first
        even = np.empty((x.shape[0], w.shape[1]), dtype=np.float32)
        odd = np.empty((x.shape[0], w.shape[1]), dtype=np.float32)
        for i in range(x.shape[0]):
            for c in range(w.shape[1]):
                even[i, c] = x[i, 2 * c]
                odd[i, c] = x[i, 2 * c + 1]
        mask = np.uint32(0xFFFF0000)
        shift = np.uint32(16)
        for r in range(w.shape[0]):
            for i in range(even.shape[0]):
                acc = np.float32(0.0)
                for c in range(w.shape[1]):
                    word = w[r, c]
                    low = np.uint32(word << shift).view(np.float32)
                    high = np.uint32(word & mask).view(np.float32)
                    acc += low * even[i, c] + high * odd[i, c]
                out[i, r] = acc

    def f32_rows(w: Any, x: Any, out: Any) -> None:  # pragma: no cover - compiled
        for r in range(w.shape[0]):
            for i in range(x.shape[0]):
                acc = np.float32(0.0)
                for c in range(w.shape[1]):
                    acc += w[r, c] * x[i, c]
                out[i, r] = acc

    try:
        loops = _compiled(jit, bf16_rows, f32_rows)
    except RuntimeError:  # numba found nowhere to write its cache (a read-only install)
        logger.info("numba cannot cache its compiled loops here: compiling them in memory")
        loops = _compiled(numba.njit(fastmath={"reassoc", "contract"}, nogil=True), bf16_rows, f32_rows)
    return loops


def _compiled(jit: Any, *loops: Any) -> tuple[Any, Any] | None:
    """`loops` jitted and compiled for the engine's arrays (or read from numba's cache) now;
    None, logged once, where compiling fails (the engine then uses torch's kernels)."""
    compiled = tuple(jit(loop) for loop in loops)
    bf16_rows, f32_rows = compiled
    try:
        out = np.empty((1, 1), dtype=np.float32)
        bf16_rows(np.ones((1, 1), dtype=np.uint32), np.ones((1, 2), dtype=np.float32), out)
        f32_rows(np.ones((1, 2), dtype=np.float32), np.ones((1, 2), dtype=np.float32), out)
    except Exception:  # an LLVM or numba failure must not stop the engine: it only costs speed
        logger.warning("numba could not compile the decode loops: using torch's kernels", exc_info=True)
        return None
    return bf16_rows, f32_rows


def small_linear(x: Tensor, weight: Tensor) -> Tensor | None:
    """`F.linear(x, weight)` for `x` of at most `ROWS` rows and a contiguous CPU `weight` in
    bf16 or fp32, in `x`'s dtype; None where these loops do not apply (or numba is missing)."""
    if x.shape[0] > ROWS or weight.device.type != "cpu" or not weight.is_contiguous():
        return None
    bf16 = weight.dtype == torch.bfloat16
    if not (bf16 and weight.shape[1] % 2 == 0) and weight.dtype != torch.float32:
        return None
    loops = _loops()
    if loops is None:
        return None
    rows = x.float().contiguous().numpy()
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32)
    if bf16:
        loops[0](weight.view(torch.int32).numpy().view(np.uint32), rows, out.numpy())
    else:
        loops[1](weight.numpy(), rows, out.numpy())
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def warm() -> None:
    """Compile (or load from numba's cache) both loops now, so no request pays for it."""
    _loops()
