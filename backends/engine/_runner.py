"""Turns a scheduled step into tensors, runs the model and returns next-token logits."""

from __future__ import annotations

import torch
from torch import Tensor

from lanefold.backends.engine._arith import compute_dtype, sdpa_dtype
from lanefold.backends.engine._attention import AttentionBatch, Lane, Prefix
from lanefold.backends.engine._model import CausalLM, KVCache
from lanefold.backends.engine._scheduler import Step
from lanefold.backends.engine._sequence import Sequence
from lanefold.backends.engine._shared_attention import prefix_tiles

__all__ = ("ModelRunner",)


class ModelRunner:
    """Owns the model and the paged KV storage on one device."""

    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, kv_dtype: torch.dtype) -> None:
        self.model = model
        self.block_size = block_size
        self.device = model.lm_head.weight.device
        self.cache = KVCache.empty(model.args, num_blocks * block_size, kv_dtype, self.device)
        self.block_bytes = self.cache.k[:, :block_size].nbytes * 2
        # what attention computes in, and so what kept prompts and lanes are stored in: the
        # shared-prefix products in the arithmetic's dtype, the lane's SDPA in its own
        self._work = compute_dtype(model.lm_head.weight.dtype, self.device)
        self._lane_dtype = sdpa_dtype(model.lm_head.weight.dtype, self.device)
        self._lane_block_bytes = self.block_bytes * self._lane_dtype.itemsize // self.cache.k.dtype.itemsize
        self._kept_block_bytes = self.block_bytes * self._work.itemsize // self.cache.k.dtype.itemsize
        # Shared prompts gathered once for every layer, laid out for the products, kept while
        # their groups decode: full shared blocks are never written, and a block can only come
        # back with other contents through a prefill, which clears this. Capped at an eighth of
        # the pool's memory; groups past the cap gather layer by layer.
        self._prefix_kv: dict[tuple[int, ...], tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]] = {}
        self._prefix_cap = (self.cache.k.nbytes + self.cache.v.nbytes) // 8
        # A lone decoding sequence's context, contiguous (see `Lane`), kept while it decodes
        # alone; under the same cap. One lane decoding is the step where the work around the
        # matrix products shows most: against attention over paged blocks, a SmolLM2 step
        # went from 56.7 to 54.1 ms in fp32, 67.7 to 46.9 in bf16 (one thread, P = 512).
        self._lane: tuple[Sequence, Lane] | None = None

    def run(self, step: Step) -> Tensor:
        """Make the step's block copies, compute its tokens; fp32 logits `[sequences, vocab]`."""
        self._copy_blocks(step.copies)
        prefill = step.kind == "prefill"
        if prefill:
            self._prefix_kv.clear()
        starts = [s.num_computed if prefill else len(s.tokens) - 1 for s in step.sequences]
        lane = self._lane_of(step)
        batch, input_ids, last = self._batch(step, starts, lane)
        hidden = self.model(input_ids, self.cache, batch)
        if lane is not None:
            lane.length += 1
        return self.model.logits(hidden[last])

    def _lane_of(self, step: Step) -> Lane | None:
        """The step's `Lane` where it decodes one sequence (kept from its last step, or
        gathered from the pool), else None (and any kept lane is dropped)."""
        if step.kind != "decode" or len(step.sequences) != 1:
            self._lane = None
            return None
        seq = step.sequences[0]
        length = len(seq.tokens) - 1  # positions whose K/V are in the pool
        lane = self._lane[1] if self._lane is not None and self._lane[0] is seq else None
        if lane is not None and lane.length != length:
            lane = None  # it decoded among others since: gather afresh
        if lane is None or lane.keys.shape[2] <= length:
            # a decoding sequence has len(tokens) = length + 1 <= num_prompt + max_tokens;
            # doubled, but no further than the cap allows (then the paged path once it is full)
            most = self._prefix_cap * self.block_size // self._lane_block_bytes
            capacity = min(seq.num_prompt + seq.max_tokens, 2 * (length + 1), most)
            lane = self._gather_lane(seq, length, capacity, lane) if capacity > length else None
        self._lane = None if lane is None else (seq, lane)
        return lane

    def _gather_lane(self, seq: Sequence, length: int, capacity: int, old: Lane | None) -> Lane:
        layers, _, kv_heads, dim = self.cache.k.shape
        shape = (layers, kv_heads, capacity, dim)
        keys = torch.empty(shape, dtype=self._lane_dtype, device=self.device)
        values = torch.empty(shape, dtype=self._lane_dtype, device=self.device)
        if old is not None:  # grown: the old lane holds every position already
            keys[:, :, :length] = old.keys[:, :, :length]
            values[:, :, :length] = old.values[:, :, :length]
        else:
            slots = self._slots(seq.block_table)[:length]
            keys[:, :, :length] = self.cache.k.index_select(1, slots).transpose(1, 2)
            values[:, :, :length] = self.cache.v.index_select(1, slots).transpose(1, 2)
        return Lane(keys=keys, values=values, length=length)

    def _batch(
        self, step: Step, starts: list[int], lane: Lane | None = None
    ) -> tuple[AttentionBatch, Tensor, Tensor]:
        """The step's attention batch, its input ids and each sequence's last token's row.

        Every integer tensor is built on the host and crosses to the device in one copy; the
        mask is computed there from the positions.
        """
        bs, seqs = self.block_size, step.sequences
        input_ids = torch.tensor(
            [t for s, a in zip(seqs, starts, strict=True) for t in s.tokens[a:]], dtype=torch.long
        )
        shared, prefixes = (
            _shared_prefixes(seqs, bs) if step.kind == "decode" and lane is None else ([0] * len(seqs), [])
        )
        ends = torch.tensor([len(s.tokens) for s in seqs])
        start = torch.tensor(starts)
        query_lens = ends - start
        width_q = int(query_lens.max())
        full = _pad([s.block_table for s in seqs])
        own = _pad([s.block_table[n:] for s, n in zip(seqs, shared, strict=True)])
        column = torch.arange(width_q)[None, :]
        real = column < query_lens[:, None]  # [B, Lq]: which padded queries are real tokens
        query_pos = torch.where(real, start[:, None] + column, 0)
        slots = (full[:, :, None] * bs + torch.arange(bs)).reshape(len(seqs), -1)
        key_pos = torch.tensor(shared)[:, None] * bs + torch.arange(own.shape[1] * bs)[None, :]
        offsets = torch.cumsum(query_lens, 0) - query_lens
        device = self.device
        spans = None
        if step.kind == "prefill" and not any(starts):  # nothing cached: causal over new tokens
            spans = list(zip(offsets.tolist(), query_lens.tolist(), strict=True))
        host = {
            "input_ids": input_ids,
            "positions": query_pos[real],
            "write_slots": slots.gather(1, query_pos)[real],
            "query_index": torch.where(real, offsets[:, None] + column, 0),
            "query_valid": real.flatten().nonzero().squeeze(1),
            "block_tables": own,
            "last": offsets + query_lens - 1,
            "key_pos": key_pos,
            "query_pos": query_pos,
        }
        if lane is not None:  # one sequence, one new token: where its K/V go
            lane.slot = int(host["write_slots"][0])
        packed = torch.cat([t.flatten() for t in host.values()]).to(device)
        on = {
            name: part.view(t.shape)
            for (name, t), part in zip(
                host.items(), packed.split_with_sizes([t.numel() for t in host.values()]), strict=True
            )
        }
        mask = None if spans or lane else (on["key_pos"][:, None, :] <= on["query_pos"][:, :, None])[:, None]
        bias = None
        if prefixes and mask is not None:  # the shared-prefix decode adds the mask as a bias
            bias = torch.zeros(mask.shape, dtype=self._work, device=device)
            bias.masked_fill_(~mask, -torch.inf)  # [B, 1, 1, Lk]: one query per sequence
        batch = AttentionBatch(
            positions=on["positions"],
            write_slots=on["write_slots"],
            query_index=on["query_index"],
            query_valid=on["query_valid"],
            block_tables=on["block_tables"],
            block_size=bs,
            mask=mask,
            prefixes=self._prefixes(prefixes),
            bias=bias,
            spans=spans,
            lane=lane,
        )
        return batch, on["input_ids"], on["last"]

    def _prefixes(self, groups: list[tuple[list[int] | None, list[int]]]) -> list[Prefix]:
        """The step's groups as `Prefix`es, each gathered for every layer once while it lasts."""
        kept: dict[tuple[int, ...], tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]] = {}
        used = 0
        out = []
        for rows, blocks in groups:
            key = tuple(blocks)
            kv = self._prefix_kv.get(key)  # groups differ in their first block, so keys are unique
            size = self._kept_block_bytes * len(blocks)
            if kv is None and used + size <= self._prefix_cap:
                kv = self._gather_prefix(blocks)
            if kv is not None:
                used += size if kv[2] is None else 2 * size  # (tiles: as many bytes again)
                kept[key] = kv
            out.append(
                Prefix(
                    rows=None if rows is None else torch.tensor(rows, device=self.device),
                    blocks=torch.tensor(blocks, device=self.device),
                    keys=None if kv is None else kv[0],
                    values=None if kv is None else kv[1],
                    tiles=None if kv is None else kv[2],
                )
            )
        self._prefix_kv = kept
        return out

    def _slots(self, blocks: list[int]) -> Tensor:
        """Every slot of `blocks`, in order, on the device."""
        bs = self.block_size
        return (torch.tensor(blocks)[:, None] * bs + torch.arange(bs)).flatten().to(self.device)

    def _gather_prefix(self, blocks: list[int]) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]:
        """The prefix's keys and values `[layers, kv_heads, Lp, D]`, and where the model's
        shared-prefix attention goes over AMX's tiles the same as tiles (`prefix_tiles`; as many
        bytes again)."""
        slots = self._slots(blocks)
        k = self.cache.k.index_select(1, slots)  # [layers, Lp, kv_heads, D]
        v = self.cache.v.index_select(1, slots)
        keys, values = self._dense(k.transpose(1, 2)), self._dense(v.transpose(1, 2))
        tiled = self.model.decode_paths().shared_prefix == "tiles"
        return keys, values, prefix_tiles(keys, values) if tiled else None

    def _dense(self, t: Tensor) -> Tensor:
        """`t` laid out contiguously in the dtype attention runs in, in one copy."""
        return torch.empty(t.shape, dtype=self._work, device=self.device).copy_(t)

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        offsets = torch.arange(self.block_size)
        src = torch.cat([torch.full((self.block_size,), s * self.block_size) + offsets for s, _ in copies])
        dst = torch.cat([torch.full((self.block_size,), d * self.block_size) + offsets for _, d in copies])
        src, dst = src.to(self.device), dst.to(self.device)
        for layer_store in (self.cache.k, self.cache.v):
            layer_store[:, dst] = layer_store[:, src]


def _pad(tables: list[list[int]]) -> Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def _shared_prefixes(
    seqs: list[Sequence], block_size: int
) -> tuple[list[int], list[tuple[list[int] | None, list[int]]]]:
    """Leading blocks shared by sequences that start with the same block (forks of one prompt,
    or prompts behind one cached preamble): per sequence, how many; per group, (rows, blocks).
    A sequence's current block is its own after `append`, so shared blocks are full and fully
    before its query. A step's only sequence is a group of one over its prompt's full blocks:
    they are gathered once for every layer while it decodes, not once per layer each step."""
    groups: dict[int, list[int]] = {}
    for row, seq in enumerate(seqs):
        groups.setdefault(seq.block_table[0], []).append(row)
    shared = [0] * len(seqs)
    prefixes: list[tuple[list[int] | None, list[int]]] = []
    for rows in groups.values():
        tables = [seqs[r].block_table for r in rows]
        length = 0
        if len(seqs) == 1:  # fixed while it decodes, so the gathered prompt is kept
            length = min(len(tables[0]) - 1, seqs[0].num_prompt // block_size)
        while len(rows) > 1 and all(len(t) > length + 1 and t[length] == tables[0][length] for t in tables):
            length += 1
        if length:
            for r in rows:
                shared[r] = length
            everyone = len(rows) == len(seqs)  # rows are ascending: all of them is in order
            prefixes.append((None if everyone else rows, tables[0][:length]))
    return shared, prefixes
