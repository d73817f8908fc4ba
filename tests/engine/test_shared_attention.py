"""Decode attention over a shared prefix (`_shared_attention`: compiled, over AMX's tiles, or
torch's products), and the chunked causal prefill beside it (`_attention`)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import torch.nn.functional as F  # noqa: E402


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
    from lanefold.backends.engine._shared_attention import prefix_tiles

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
