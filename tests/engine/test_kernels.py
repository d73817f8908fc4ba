"""The CPU paths beside torch's kernels (compiled small products, chunked prefill attention)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import torch.nn.functional as F  # noqa: E402

from lanefold.backends.engine._arith import onednn_bf16  # noqa: E402
from lanefold.backends.engine._kernels import ROWS, small_linear  # noqa: E402


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


@pytest.mark.parametrize("lengths", [[65], [200, 64], [1024], [1025, 130]])
def test_a_prefill_attended_in_chunks_equals_one_causal_product(lengths: list[int]) -> None:
    from lanefold.backends.engine._attention import causal_attention

    g = torch.Generator().manual_seed(sum(lengths))
    n = sum(lengths)
    q, k, v = (
        torch.randn(n, 6, 16, generator=g),
        torch.randn(n, 2, 16, generator=g),
        torch.randn(n, 2, 16, generator=g),
    )
    spans, start = [], 0
    for length in lengths:
        spans.append((start, length))
        start += length
    out = causal_attention(q, k, v, spans)
    for start, length in spans:
        qs, ks, vs = (t[start : start + length].transpose(0, 1)[None] for t in (q, k, v))
        whole = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        expected = whole[0].transpose(0, 1).reshape(length, -1)
        torch.testing.assert_close(out[start : start + length], expected, atol=1e-5, rtol=1e-5)


def test_with_nowhere_to_cache_the_loops_compile_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import numba.core.caching

    from lanefold.backends.engine import _kernels

    def double(x: Any) -> Any:
        return x * 2

    monkeypatch.setattr(numba.core.caching.CacheImpl, "_locator_classes", [])  # a read-only install
    with pytest.raises(RuntimeError):  # what numba does with cache=True there
        numba.njit(cache=True)(double)
    assert _kernels._jit(double)(21) == 42


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
    from lanefold.backends.engine._kernels import layer_in, layer_out
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
    """Where torch's products read faster (`_torch_reads_faster`, measured once a process for
    each thread count, here two), the layer's halves and the small products take them between
    the same compiled stages, and give what the loops give (within one bf16 rounding of the
    rows, in bf16)."""
    from lanefold.backends.engine import _kernels
    from lanefold.backends.engine._kernels import layer_in, layer_out, pack

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

    def both_halves_and_a_product() -> list[torch.Tensor]:
        made = layer_in(x, norm, 1e-5, qkv, rope, (heads + kv_heads) * dim, dim, copies[0])
        out = layer_out(attended, o, x, post, 1e-5, gate_up, down, (copies[1], copies[2], copies[3]))
        small = _kernels.small_linear(x, gate_up, copies[2])
        assert made is not None and out is not None and small is not None
        return [made, out, small]

    taken: list[int] = []
    by_torch = _kernels._by_torch
    monkeypatch.setattr(_kernels, "_by_torch", lambda *a: taken.append(1) or by_torch(*a))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(_kernels, "_torch_reads_faster", lambda threads, dtype, width: False)
        loops = both_halves_and_a_product()
        assert not taken
        monkeypatch.setattr(_kernels, "_torch_reads_faster", lambda threads, dtype, width: True)
        threaded = both_halves_and_a_product()
        assert len(taken) == 5  # q|k|v; o, gate|up, down; the small product
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(threaded, loops, strict=True):
        assert a.dtype == b.dtype
        if dtype == torch.float32:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        else:
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2**-6)


@pytest.mark.parametrize("pool", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kept", [torch.float32, torch.bfloat16])
def test_a_lone_lanes_queries_keys_and_values_are_stored_as_torch_rounds_them(
    pool: torch.dtype, kept: torch.dtype
) -> None:
    """`lane_put` stores one token's K and V in the pool and the lane and returns its queries,
    each rounded to its dtype exactly as torch's conversion rounds (ties to even, NaN, inf)."""
    from lanefold.backends.engine._kernels import lane_put

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


@pytest.mark.parametrize("rows", [3, 8, 70])
def test_a_bf16_layers_stages_between_packed_products_equal_the_eager_operations(rows: int) -> None:
    """Three rows and more of a bf16 model with packed copies: the norms, SwiGLU and residuals
    compiled on the rows' bits round where the eager bf16 operations round (equal, within one
    bf16 step where an exp differs in its last fp32 bit), RoPE within one rounding."""
    import torch.nn.functional as F

    from lanefold.backends.engine._kernels import pack, packed_linear, staged_in, staged_out
    from lanefold.backends.engine._model import _rms_norm, _rotate

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("path", ["tiles", "compiled", "torch"])
@pytest.mark.parametrize("kept", [True, False])
@pytest.mark.parametrize(
    "groups",
    [
        [(None, 5)],  # K forks of one prompt
        [([0, 2], 3), ([1, 3], 2)],  # two prompts behind cached preambles
        [([1, 2], 4)],  # and sequences 0 and 3 in no group: their own blocks alone
    ],
)
def test_shared_prefix_decode_equals_attention_over_each_whole_context(
    dtype: torch.dtype,
    path: str,
    kept: bool,
    groups: list[tuple[list[int] | None, int]],
    monkeypatch: Any,
) -> None:
    """A decode step's queries over the blocks their group shares and then their own ones (of
    different lengths, in blocks scattered over the pool) equal each sequence's attention over
    its whole context: compiled (`shared_attend`), with the kept prefix in AMX's tiles as well
    (bf16 on a CPU with them), or through torch's products; the shared blocks kept for every
    layer by the runner or gathered by the layer."""
    import lanefold.backends.engine._attention as attention
    from lanefold.backends.engine._attention import AttentionBatch, Prefix, paged_attention
    from lanefold.backends.engine._kernels import prefix_tiles

    if path == "tiles" and not (dtype == torch.bfloat16 and kept and torch.cpu._is_amx_tile_supported()):
        pytest.skip("tiles are kept with a bf16 prefix on a CPU with AMX")
    if path == "torch":
        monkeypatch.setattr(attention, "shared_attend", lambda *args: None)
    g = torch.Generator().manual_seed(len(groups) + len(path))
    b, heads, kv_heads, dim, size = 4, 6, 2, 32, 4
    pool = 64 * size
    k_cache = torch.randn(pool, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(pool, kv_heads, dim, generator=g).to(dtype)
    q = (torch.randn(b, heads, dim, generator=g) * 2).to(dtype)
    free = torch.randperm(64, generator=g).tolist()
    shared = [0] * b  # blocks each sequence shares
    prefixes, contexts = [], {}
    for rows, blocks in groups:
        table = [free.pop() for _ in range(blocks)]
        for row in range(b) if rows is None else rows:
            shared[row] = blocks
            contexts[row] = list(table)
        slots = (torch.tensor(table)[:, None] * size + torch.arange(size)).flatten()
        keys, values = (c[slots].transpose(0, 1).contiguous()[None] for c in (k_cache, v_cache))
        tiles = prefix_tiles(keys, values) if path == "tiles" else None
        assert (tiles is not None) == (path == "tiles")
        prefix = Prefix(rows=None if rows is None else torch.tensor(rows), blocks=torch.tensor(table))
        if kept:
            prefix.keys, prefix.values, prefix.tiles = keys, values, tiles
        prefixes.append(prefix)
    own_lengths = [1, 6, 3, 9]  # positions after the shared blocks, the new token's included
    own = []
    for row in range(b):
        table = [free.pop() for _ in range((own_lengths[row] + size - 1) // size)]
        contexts.setdefault(row, []).extend(table)
        own.append(table + [0] * (3 - len(table)))
    positions = torch.tensor([shared[r] * size + own_lengths[r] - 1 for r in range(b)])
    key_pos = torch.tensor(shared)[:, None] * size + torch.arange(3 * size)[None, :]
    mask = (key_pos <= positions[:, None])[:, None, None, :]
    work = torch.float32 if dtype == torch.float32 else torch.bfloat16
    bias = torch.zeros(mask.shape, dtype=work).masked_fill_(~mask, -torch.inf)
    batch = AttentionBatch(
        positions=positions, write_slots=positions, query_index=torch.zeros(b, 1, dtype=torch.long),
        query_valid=torch.arange(b), block_tables=torch.tensor(own), block_size=size, mask=mask,
        prefixes=prefixes, bias=bias,
    )  # fmt: skip

    out = paged_attention(q, k_cache, v_cache, batch)
    assert out.shape == (b, heads * dim) and out.dtype == dtype
    for row in range(b):
        slots = (torch.tensor(contexts[row])[:, None] * size + torch.arange(size)).flatten()
        slots = slots[: positions[row] + 1]
        k, v = (c[slots].double().repeat_interleave(heads // kv_heads, 1) for c in (k_cache, v_cache))
        weights = torch.einsum("hd,lhd->hl", q[row].double(), k).mul(dim**-0.5).softmax(-1)
        want = torch.einsum("hl,lhd->hd", weights, v).reshape(-1)
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out[row].double(), want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 40, 129])
@pytest.mark.parametrize("shape", [(32, 32), (96, 64), (64, 160)])
def test_amx_tiles_multiply_as_fp32_sums_of_the_bf16_products_rounded_once(
    rows: int, shape: tuple[int, int]
) -> None:
    """A bf16 product through AMX's tiles (16 rows at a time and the rest, 32 outputs at a
    time) equals fp32 sums of the exact bf16 products rounded to bf16 once, within the sums'
    order; past `TILED_ROWS` rows it is torch's product."""
    import torch.nn.functional as F

    from lanefold.backends.engine._kernels import TILED_ROWS, _amx_ready, tile, tiled_linear, tiles_fit
    from lanefold.backends.engine._memory import Arena

    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("this CPU has no AMX tiles")
    assert _amx_ready()  # (it checks a product of its own, and would rather fall back than fail)
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
