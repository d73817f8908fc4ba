"""One or two rows by a CPU matrix through the compiled loops (`_products`)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import torch.nn.functional as F  # noqa: E402

from lanefold.backends.engine._products import ROWS, small_linear  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("shape", [(64, 32), (5, 2), (1000, 576), (3, 1538)])
def test_fp32_rows_equal_torch_within_accumulation_order(rows: int, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(sum(shape) + rows)
    weight = torch.randn(shape, generator=g)
    x = torch.randn(rows, shape[1], generator=g)
    out = small_linear(x, weight)
    assert out is not None and out.dtype == torch.float32 and out.shape == (rows, shape[0])
    torch.testing.assert_close(out, F.linear(x.double(), weight.double()).float(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("shape", [(64, 32), (7, 2), (1000, 576)])
def test_bf16_weights_are_widened_exactly_and_accumulated_in_fp32(rows: int, shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(sum(shape) * rows)
    weight = torch.randn(shape, generator=g).bfloat16()
    x = torch.randn(rows, shape[1], generator=g)
    exact = F.linear(x.double(), weight.double())  # the bf16 weights as they are, in fp64
    out = small_linear(x, weight)  # fp32 rows: fp32 out, no rounding to bf16
    assert out is not None and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), exact, atol=1e-4, rtol=1e-5)
    out16 = small_linear(x.bfloat16(), weight)  # a bf16 model's rows: bf16 out
    assert out16 is not None and out16.dtype == torch.bfloat16
    exact16 = F.linear(x.bfloat16().double(), weight.double()).bfloat16()
    torch.testing.assert_close(out16, exact16, atol=0, rtol=2**-7)  # one bf16 rounding at most


def test_the_layer_views_a_model_keeps_are_read_in_place() -> None:
    matrix = torch.randn(12, 8)
    _, kv = torch.split(matrix, [8, 4])  # the fused rows' views: contiguous
    x = torch.randn(1, 8)
    out = small_linear(x, kv)
    assert out is not None
    torch.testing.assert_close(out, F.linear(x, kv), atol=1e-5, rtol=0)


def test_what_the_loops_do_not_take_is_left_to_torch() -> None:
    weight = torch.randn(16, 8)
    assert small_linear(torch.randn(ROWS + 1, 8), weight) is None  # too many rows
    assert small_linear(torch.randn(1, 16), weight.t()) is None  # not contiguous
    assert small_linear(torch.randn(1, 8), weight.half()) is None  # neither bf16 nor fp32
    assert small_linear(torch.randn(1, 7), torch.randn(4, 7).bfloat16()) is None  # odd bf16 width
    assert small_linear(torch.randn(1, 8, device="meta"), weight.to("meta")) is None  # not a CPU
