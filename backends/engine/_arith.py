"""The dtype the engine's arithmetic runs in, where the dtype it stores has no fast kernels.

On a CPU without native bf16 (no AVX512-BF16, no AMX: every AVX2 machine), torch emulates bf16
matrix products: on an AVX2 EPYC a 1536 x 576 bf16 product of 8 rows took 1.4 ms against 0.3 ms
in fp32, of 512 rows 93 ms against 10 ms. There the weights and the KV cache stay bf16 (half the
memory, half the bytes a batch-1 step reads) and the products of several rows, the logits and
attention run in fp32 on exact upcasts, which also puts them nearer the fp32 reference. A lone
row keeps the bf16 product: reading half the bytes pays for the emulation there.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from lanefold.backends.engine._products import pack, packed_linear, small_linear
from lanefold.backends.engine._tiles import Tiles

__all__ = ("amx", "compute_dtype", "linear", "native_half", "onednn_bf16", "pack", "packs", "sdpa_dtype")


@functools.cache
def native_half(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies `dtype` (bf16 or fp16) natively; True where torch cannot say."""
    cpu = torch.cpu
    try:
        if dtype == torch.bfloat16:
            return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
        return bool(cpu._is_amx_fp16_supported())
    except AttributeError:  # a torch without these probes: trust its kernels
        return True


def compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """fp32 for a half-precision `dtype` this CPU only emulates; `dtype` itself otherwise."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) and not native_half(dtype):
        return torch.float32
    return dtype


@functools.cache
def amx() -> bool:
    """Whether this CPU has AMX tiles (where oneDNN's bf16 kernels use them)."""
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without the probe
        return False


def sdpa_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """What torch's fused attention (`scaled_dot_product_attention`) runs in: on a CPU, bf16
    where it has AMX and fp32 otherwise, whatever the model's half dtype; `dtype` elsewhere.
    Without AMX its CPU kernels are slower in bf16 even where bf16 is native (one thread,
    AVX512-BF16 EPYC, SmolLM2's heads: one query over 530 positions 0.51 against 0.065 ms,
    causal over 512 new tokens 8.1 against 7.4 ms); with AMX they are faster (one thread, a
    Xeon with AMX: one query over 528 positions 40 against 71 us, causal over 512 new tokens
    1.6 against 3.4 ms, over 2048 15 against 42 ms)."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return torch.bfloat16 if dtype == torch.bfloat16 and amx() else torch.float32
    return dtype


def packs(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a model of `dtype` on `device` keeps a packed copy of its matrices for products
    of three rows and more: bf16 on a CPU with native bf16. There oneDNN's kernel on its own
    layout (`pack`) streams the weights about twice as fast as `F.linear` on `[out, in]` (one
    thread, AVX512-BF16 EPYC, a 1536 x 576 matrix read from memory: 120 against 240 us at 3
    rows, 153 against 285 at 8, 340 against 470 at 32; level at 512); on a CPU with AMX the
    copy may be in AMX's tiles instead (`_tiles.tile`, where they stream faster still)."""
    return device.type == "cpu" and dtype == torch.bfloat16 and native_half(dtype) and onednn_bf16()


@functools.cache
def onednn_bf16() -> bool:
    """Whether oneDNN packs and multiplies bf16 matrices here: its own check, which asks what
    oneDNN may use (`ONEDNN_MAX_CPU_ISA` holds it back) where `native_half` asks what the CPU
    has. On an AVX2-only CPU, or one held to AVX2, `pack` raises."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):  # type: ignore[no-untyped-call]
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch without the check: as before it, trust oneDNN
        return True


def linear(x: Tensor, weight: Tensor, packed: Tensor | Tiles | None = None, by_torch: bool = False) -> Tensor:
    """`F.linear`: one or two rows on a CPU through `_products` (through torch's kernels where
    `by_torch`, as the model's decode paths say); more through oneDNN where `packed` (the same
    weight, `pack`ed) is given; several rows of an emulated dtype in fp32 (then back to `x`'s
    dtype)."""
    small = small_linear(x, weight, packed, by_torch)
    if small is not None:
        return small
    if packed is not None:
        return packed_linear(x, packed)
    if x.shape[0] > 1:
        work = compute_dtype(weight.dtype, weight.device)
        if work != weight.dtype:
            return F.linear(x.to(work), weight.to(work)).to(x.dtype)
    return F.linear(x, weight)
