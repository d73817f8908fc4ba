"""A bf16 product of up to 128 rows on a CPU with AMX (Intel's tile unit), and the tiles' layout.

`_tile_dots` is written against LLVM's AMX intrinsics (`tileloadd64`, `tdpbf16ps`,
`tilestored64`) as a numba intrinsic; `tile` lays a weight out for it and `tiled_linear`
multiplies. `amx_ready` says whether any of it runs here. Where the tiles pay for their copies
(`_trials.tiles_read_faster`), a bf16 model keeps its packed copies as tiles (`_model`), the
shared-prefix attention and the whole decode steps over them live in `_shared_attention` and
`_tiled_step`.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
import sys
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lanefold.backends.engine._compiled import _array, _jit, _narrowed
from lanefold.backends.engine._memory import Arena

try:
    import numba
except ImportError:  # pragma: no cover - numba is in the engine extra
    numba = None  # type: ignore[assignment]

__all__ = ("TILED_ROWS", "Tiles", "amx_ready", "tile", "tile_shape", "tiled_linear", "tiles_fit")

logger = logging.getLogger(__name__)

if numba is not None:
    from numba.extending import intrinsic

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
    from llvmlite import ir  # type: ignore[import-untyped]
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
def amx_ready() -> bool:
    """Whether the tiled products run here: a CPU with AMX (tiles and bf16) that LLVM targets,
    Linux granting this process the tiles' state (once a process; oneDNN asks the same), numba;
    and a small product through them equal to torch's. False, logged, where not."""
    if numba is None or sys.platform != "linux" or platform.machine() != "x86_64":
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
        return bool(torch.allclose(tiled_linear(x, tile(weight)).float(), want, rtol=1e-2, atol=1e-2))
    except Exception:  # an LLVM or numba failure must not stop the engine: it only costs speed
        logger.warning("the AMX tile products could not compile: using oneDNN's", exc_info=True)
        return False
