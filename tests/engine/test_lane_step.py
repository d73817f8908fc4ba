"""A lone lane's step pieces (`_lane_step`); its whole step is held to the reference in test_exactness."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")


@pytest.mark.parametrize("pool", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kept", [torch.float32, torch.bfloat16])
def test_a_lone_lanes_queries_keys_and_values_are_stored_as_torch_rounds_them(
    pool: torch.dtype, kept: torch.dtype
) -> None:
    """`lane_put` stores one token's K and V in the pool and the lane and returns its queries,
    each rounded to its dtype exactly as torch's conversion rounds (ties to even, NaN, inf)."""
    from lanefold.backends.engine._lane_step import lane_put

    heads, kv_heads, dim = 4, 2, 8
    g = torch.Generator().manual_seed(3)
    made = torch.randn(1, (heads + 2 * kv_heads) * dim, generator=g) * 1000
    made[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1 + 2**-8, 1 + 3 * 2**-8, -0.0])
    cache = (torch.zeros(5, kv_heads, dim, dtype=pool), torch.zeros(5, kv_heads, dim, dtype=pool))
    lane = (torch.zeros(kv_heads, 7, dim, dtype=kept), torch.zeros(kv_heads, 7, dim, dtype=kept))
    q = lane_put(made, (heads + kv_heads) * dim, cache, 3, lane, 4)
    assert q is not None and q.dtype == kept
    want_q, want_k, want_v = torch.split(made[0], [heads * dim, kv_heads * dim, kv_heads * dim])
    torch.testing.assert_close(q, want_q.to(kept), rtol=0, atol=0, equal_nan=True)
    for stored, want in ((cache[0][3], want_k), (cache[1][3], want_v)):
        assert torch.equal(stored, want.view(kv_heads, dim).to(pool))
    for stored, want in ((lane[0][:, 4], want_k), (lane[1][:, 4], want_v)):
        assert torch.equal(stored, want.view(kv_heads, dim).to(kept))
    assert not cache[0][[0, 1, 2, 4]].any() and not lane[0][:, [0, 1, 2, 3, 5, 6]].any()
