"""A bf16 product through AMX's tiles (`_tiles`), where this CPU has them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40, 129])
@pytest.mark.parametrize("shape", [(32, 32), (96, 64), (64, 160)])
def test_amx_tiles_multiply_as_fp32_sums_of_the_bf16_products_rounded_once(
    rows: int, shape: tuple[int, int]
) -> None:
    """A bf16 product through AMX's tiles (16 rows at a time and the rest, 32 outputs at a
    time) equals fp32 sums of the exact bf16 products rounded to bf16 once, within the sums'
    order; past `TILED_ROWS` rows it is torch's product."""
    import torch.nn.functional as F

    from lanefold.backends.engine._memory import Arena
    from lanefold.backends.engine._tiles import TILED_ROWS, amx_ready, tile, tiled_linear, tiles_fit

    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("this CPU has no AMX tiles")
    assert amx_ready()  # (it checks a product of its own, and would rather fall back than fail)
    g = torch.Generator().manual_seed(rows * shape[0] + shape[1])
    weight = torch.randn(*shape, generator=g).bfloat16()
    x = torch.randn(rows, shape[1], generator=g).bfloat16()
    assert tiles_fit(weight) and not tiles_fit(weight[:16])
    memory = Arena.of([(shape[0] // 16, shape[1] // 32, 16, 16)], torch.int32, torch.device("cpu"))
    made = tiled_linear(x, tile(weight, memory))
    assert made.dtype == torch.bfloat16 and made.shape == (rows, shape[0])
    if rows > TILED_ROWS:
        assert torch.equal(made, F.linear(x, weight))
    else:
        want = F.linear(x.double(), weight.double())
        torch.testing.assert_close(made.double(), want, rtol=2**-8, atol=1e-4)
