"""A layer's work around attention, compiled (`_layers`): the fp32 halves of one or two rows, with
the loops or torch's products, and a bf16 model's stages between packed products."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import torch.nn.functional as F  # noqa: E402

from lanefold.backends.engine._arith import onednn_bf16  # noqa: E402


def layer(g: Any, dtype: Any, shape: tuple[int, int, int, int, int], scale: float) -> tuple[Any, ...]:
    """A random layer's q|k|v, o, gate|up and down in `dtype` and its two fp32 norms, for
    `shape` = (hidden, heads, kv_heads, head dim, intermediate)."""
    hidden, heads, kv_heads, dim, inter = shape
    qkv = (torch.randn((heads + 2 * kv_heads) * dim, hidden, generator=g) / scale).to(dtype)
    o = (torch.randn(hidden, heads * dim, generator=g) / scale).to(dtype)
    gate_up = (torch.randn(2 * inter, hidden, generator=g) / scale).to(dtype)
    down = (torch.randn(hidden, inter, generator=g) / scale).to(dtype)
    norm, post = torch.rand(hidden, generator=g) + 0.5, torch.rand(hidden, generator=g) + 0.5
    return qkv, o, gate_up, down, norm, post


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2])
def test_a_layers_halves_in_one_call_each_equal_the_eager_operations(dtype: torch.dtype, rows: int) -> None:
    from lanefold.backends.engine._layers import layer_in, layer_out
    from lanefold.backends.engine._model import _rms_norm, _rotate

    g = torch.Generator().manual_seed(rows)
    hidden, heads, kv_heads, dim, inter = 48, 6, 2, 8, 40
    qkv, o, gate_up, down, norm, post = layer(g, dtype, (hidden, heads, kv_heads, dim, inter), 7)
    x = torch.randn(rows, hidden, generator=g)
    angles = torch.rand(rows, dim // 2, generator=g) * 6
    rope = torch.polar(torch.ones_like(angles), angles)
    wide = {name: t.double() for name, t in {"qkv": qkv, "o": o, "gate_up": gate_up, "down": down}.items()}

    made = layer_in(x, norm, 1e-5, qkv, rope, (heads + kv_heads) * dim, dim)
    assert made is not None and made.dtype == torch.float32
    h = _rms_norm(x.double(), norm.double(), 1e-5)
    q, k, v = torch.split(h @ wide["qkv"].T, [heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    turned = torch.cat(
        [
            _rotate(q.float().view(rows, heads, dim), rope[:, None]).view(rows, -1),
            _rotate(k.float().view(rows, kv_heads, dim), rope[:, None]).view(rows, -1),
            v.float(),
        ],
        dim=-1,
    )
    torch.testing.assert_close(made, turned, atol=1e-4, rtol=1e-4)

    attended = torch.randn(rows, heads * dim, generator=g)
    out = layer_out(attended, o, x.to(dtype), post, 1e-5, gate_up, down)
    assert out is not None and out.dtype == dtype
    x1 = x.to(dtype).double() + attended.double() @ wide["o"].T
    gate, up = (_rms_norm(x1, post.double(), 1e-5) @ wide["gate_up"].T).chunk(2, -1)
    expected = x1 + (F.silu(gate) * up) @ wide["down"].T
    torch.testing.assert_close(out.double(), expected.to(dtype).double(), atol=1e-4, rtol=2**-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 2])
def test_where_torchs_products_read_faster_they_stand_in_for_the_loops(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int
) -> None:
    """Where the decode paths say torch's products read faster (`by_torch`: measured once per
    machine, model, dtype and threads), the layer's halves and the small products take them
    between the same compiled stages, and give what the loops give (within one bf16 rounding of
    the rows, in bf16); where they say not, no torch product is called."""
    from lanefold.backends.engine import _layers, _products
    from lanefold.backends.engine._layers import layer_in, layer_out
    from lanefold.backends.engine._products import pack, small_linear

    if dtype == torch.bfloat16 and not onednn_bf16():
        pytest.skip("bf16 goes through oneDNN's packed copies, which oneDNN does not make here")
    g = torch.Generator().manual_seed(10 + rows)
    hidden, heads, kv_heads, dim, inter = 64, 4, 2, 16, 96
    qkv, o, gate_up, down, norm, post = layer(g, dtype, (hidden, heads, kv_heads, dim, inter), 8)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    attended = torch.randn(rows, heads * dim, generator=g)
    angles = torch.rand(rows, dim // 2, generator=g) * 6
    rope = torch.polar(torch.ones_like(angles), angles)
    copies = (pack(qkv), pack(o), pack(gate_up), pack(down)) if dtype == torch.bfloat16 else (None,) * 4

    def both_halves_and_a_product(by_torch: bool) -> list[torch.Tensor]:
        made = layer_in(x, norm, 1e-5, qkv, rope, (heads + kv_heads) * dim, dim, copies[0], by_torch)
        out = layer_out(
            attended, o, x, post, 1e-5, gate_up, down, (copies[1], copies[2], copies[3]), by_torch
        )
        small = small_linear(x, gate_up, copies[2], by_torch)
        assert made is not None and out is not None and small is not None
        return [made, out, small]

    taken: list[int] = []
    torch_rows = _products.torch_rows

    def counted(*a: Any) -> Any:
        taken.append(1)
        return torch_rows(*a)

    monkeypatch.setattr(_products, "torch_rows", counted)
    monkeypatch.setattr(_layers, "torch_rows", counted)
    loops = both_halves_and_a_product(by_torch=False)
    assert not taken
    threaded = both_halves_and_a_product(by_torch=True)
    assert len(taken) == 5  # q|k|v; o, gate|up, down; the small product
    for a, b in zip(threaded, loops, strict=True):
        assert a.dtype == b.dtype
        if dtype == torch.float32:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2**-6)


@pytest.mark.parametrize("rows", [3, 8, 70])
def test_a_bf16_layers_stages_between_packed_products_equal_the_eager_operations(rows: int) -> None:
    """Three rows and more of a bf16 model with packed copies: the norms, SwiGLU and residuals
    compiled on the rows' bits round where the eager bf16 operations round (equal, within one
    bf16 step where an exp differs in its last fp32 bit), RoPE within one rounding."""
    import torch.nn.functional as F

    from lanefold.backends.engine._layers import staged_in, staged_out
    from lanefold.backends.engine._model import _rms_norm, _rotate
    from lanefold.backends.engine._products import pack, packed_linear

    if not onednn_bf16():
        pytest.skip("the stages sit between oneDNN's packed products, which oneDNN does not make here")
    g = torch.Generator().manual_seed(rows)
    hidden, heads, kv_heads, dim, inter = 48, 6, 2, 8, 40
    qkv, o, gate_up, down, norm, post = layer(g, torch.bfloat16, (hidden, heads, kv_heads, dim, inter), 7)
    norm, post = norm.bfloat16(), post.bfloat16()  # a bf16 model's norms, as `_rms_norm` reads them
    x = torch.randn(rows, hidden, generator=g).bfloat16()
    angles = torch.rand(rows, dim // 2, generator=g) * 6
    rope = torch.polar(torch.ones_like(angles), angles)
    rotated = (heads + kv_heads) * dim

    made = staged_in(x, norm, 1e-5, pack(qkv), rope, rotated, dim)
    assert made is not None and made.dtype == torch.bfloat16
    eager = F.linear(_rms_norm(x, norm, 1e-5), qkv)
    turned = _rotate(eager[:, :rotated].reshape(rows, -1, dim), rope[:, None]).reshape(rows, rotated)
    torch.testing.assert_close(made[:, rotated:], eager[:, rotated:], rtol=0, atol=0)
    torch.testing.assert_close(made[:, :rotated].float(), turned.float(), rtol=2**-7, atol=1e-6)

    attended = torch.randn(rows, heads * dim, generator=g).bfloat16()
    out = staged_out(attended, pack(o), x, post, 1e-5, pack(gate_up), pack(down))
    assert out is not None and out.dtype == torch.bfloat16
    residual = packed_linear(attended, pack(o)).add_(x)
    gate, up = F.linear(_rms_norm(residual, post, 1e-5), gate_up).chunk(2, -1)
    want = F.linear(F.silu(gate).mul_(up), down).add_(residual)
    torch.testing.assert_close(out.float(), want.float(), rtol=2**-7, atol=1e-6)
