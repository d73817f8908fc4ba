"""A decoder layer's work around attention on a CPU, compiled by numba: one or two rows in fp32
(`layer_in`, `layer_out`), three rows and more of a bf16 model between packed products
(`staged_in`, `staged_out`; with AMX's tiles each half in one call, `_tiled_in`, `_tiled_out`).

Around the products, eager PyTorch pays a few microseconds an operation, some 40 a layer
(norms, RoPE, SwiGLU, residuals, casts). `layer_in` and `layer_out` do a layer's work before and
after attention in one call each, in fp32 throughout:

- `layer_in`: RMSNorm, the q|k|v product, RoPE on q and k (pairs side by side, as `_model`
  keeps the rows);
- `layer_out`: the o product and its residual, RMSNorm, the gate|up product, SwiGLU, the down
  product and its residual.

Where the model's decode paths say torch's products read faster (`by_torch`), the products go
through torch (fp32 `mv` or `F.linear`, bf16 through oneDNN's packed copies) between the same
compiled stages (`_normed`, `_rope`, `_residual_normed`, `_swiglu`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lanefold.backends.engine._compiled import (
    _array,
    _exp,
    _jit,
    _narrowed,
    _rows_of,
    _takes,
    _wide,
    _words,
    compiled,
)
from lanefold.backends.engine._products import ROWS, _rows, _threaded, packed_linear, torch_rows
from lanefold.backends.engine._products import ready as products_ready
from lanefold.backends.engine._tiles import TILED_ROWS, Tiles, _tiled_rows

__all__ = ("layer_in", "layer_out", "ready", "staged_in", "staged_out")


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


@functools.cache
def ready() -> bool:
    """Whether the layer's compiled halves and stages compiled (or loaded from numba's cache);
    False, logged once, if not."""

    def calls() -> None:
        for dtype in (torch.bfloat16, torch.float32):
            f32 = torch.float32
            w = torch.ones(4, 2, dtype=dtype)
            x = torch.ones(1, 2)
            small = np.empty((1, 4), dtype=np.float32)
            halves = dtype == torch.bfloat16
            rope = torch.ones(1, 1, 2, dtype=f32).numpy()
            _layer_in(x.numpy(), torch.ones(2).numpy(), 1e-5, _words(w), halves, rope, 2, 2, small)
            square = _words(torch.ones(2, 2, dtype=dtype))
            out = np.empty((1, 2), dtype=np.float32)
            norm = torch.ones(2).numpy()
            _layer_out(x.numpy(), square, x.numpy(), norm, 1e-5, _words(w), square, halves, out)
            # the stages the torch-products path calls on their own (`_normed` and `_rope` compile above)
            _swiglu(_residual_normed(out, x.numpy(), torch.ones(2).numpy(), 1e-5))
        bits = np.ones((2, 4), dtype=np.uint16)
        _normed16(bits, bits[0], 1e-5, bits.copy())
        _residual_normed16(bits.copy(), bits, bits[0], 1e-5, bits.copy())
        _rope16(bits.view(np.uint32).copy(), torch.ones(2, 1, 2).numpy(), 2, 2)
        _swiglu16(bits, bits[:, :2].copy())

    return products_ready() and compiled("layer stages", calls)


def staged_in(
    x: Tensor, norm: Tensor, eps: float, qkv: Tensor | Tiles, rope: Tensor, rotated: int, dim: int
) -> Tensor | None:
    """bf16 `[rows, outputs]`: bf16 rows `x` normed by the bf16 `norm`, times the packed q|k|v
    `qkv` (oneDNN's, or AMX's tiles), the first `rotated` outputs turned by `rope` (complex
    `[rows, dim / 2]`); as the eager layer computes them (RoPE within one fp32 rounding). None
    where it does not apply."""
    if x.dtype != torch.bfloat16 or norm.dtype != torch.bfloat16 or not x.is_contiguous() or not ready():
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
    if x.dtype != torch.bfloat16 or norm.dtype != torch.bfloat16 or not x.is_contiguous() or not ready():
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


def layer_in(
    x: Tensor,
    norm: Tensor,
    eps: float,
    qkv: Tensor,
    rope: Tensor,
    rotated: int,
    dim: int,
    packed: Tensor | Tiles | None = None,
    by_torch: bool = False,
) -> Tensor | None:
    """fp32 `[rows, outputs]`: `x` normed by `norm` (fp32), times the fused `qkv` (`packed`, its
    oneDNN copy where there is one), its first `rotated` outputs turned by `rope` (complex
    `[rows, dim / 2]`); None where the loops do not apply. The product through torch where
    `by_torch` (see the module)."""
    if x.shape[0] > ROWS or not _takes(qkv) or not ready():
        return None
    turns = torch.view_as_real(rope).contiguous().numpy()
    if _threaded(packed, qkv, by_torch):
        made = torch_rows(_normed(_rows_of(x), norm.numpy(), eps), qkv, packed)
        _rope(made, turns, rotated, dim)
        return torch.from_numpy(made)
    out = torch.empty((x.shape[0], qkv.shape[0]), dtype=torch.float32)
    halves = qkv.dtype == torch.bfloat16
    _layer_in(_rows_of(x), norm.numpy(), eps, _words(qkv), halves, turns, rotated, dim, out.numpy())
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
    by_torch: bool = False,
) -> Tensor | None:
    """The layer's output in `x`'s dtype: `x` plus the o product of `attended`, plus the SwiGLU
    MLP (the fused `gate_up`, then `down`) of that normed by `norm` (fp32); None where the loops
    do not apply. The products through torch where `by_torch` (see the module)."""
    if x.shape[0] > ROWS or not all(_takes(w) for w in (o, gate_up, down)) or not ready():
        return None
    if not o.dtype == gate_up.dtype == down.dtype:
        return None
    if _threaded(packed and packed[0], o, by_torch):
        copies = packed or (None, None, None)
        made = torch_rows(_rows_of(attended), o, copies[0])
        act = _swiglu(torch_rows(_residual_normed(made, _rows_of(x), norm.numpy(), eps), gate_up, copies[1]))
        made += torch_rows(act, down, copies[2])
        result = torch.from_numpy(made)
        return result if x.dtype == torch.float32 else result.to(x.dtype)
    out = torch.empty(x.shape, dtype=torch.float32)
    halves = o.dtype == torch.bfloat16
    words = (_words(o), _words(gate_up), _words(down))
    _layer_out(
        _rows_of(attended), words[0], _rows_of(x), norm.numpy(), eps, words[1], words[2], halves, out.numpy()
    )
    return out if x.dtype == torch.float32 else out.to(x.dtype)
