"""Turns a scheduled step into tensors, runs the model and returns next-token logits."""

from __future__ import annotations

import torch
from torch import Tensor

from backends.engine._model import AttentionBatch, CausalLM, KVCache
from backends.engine._scheduler import Step

__all__ = ("ModelRunner",)


class ModelRunner:
    """Owns the model and the paged KV storage on one device."""

    def __init__(
        self, model: CausalLM, num_blocks: int, block_size: int, kv_dtype: torch.dtype
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.device = model.lm_head.weight.device
        self.cache = KVCache.empty(model.args, num_blocks * block_size, kv_dtype, self.device)
        self.block_bytes = self.cache.k[:, :block_size].nbytes * 2

    def run(self, step: Step) -> Tensor:
        """Make the step's block copies, compute its tokens; fp32 logits `[sequences, vocab]`."""
        self._copy_blocks(step.copies)
        prefill = step.kind == "prefill"
        starts = [s.num_computed if prefill else len(s.tokens) - 1 for s in step.sequences]
        input_ids = torch.tensor(
            [t for s, a in zip(step.sequences, starts, strict=True) for t in s.tokens[a:]],
            dtype=torch.long,
        )
        batch = self._batch(step, starts)
        hidden = self.model(input_ids.to(self.device), self.cache, batch)
        query_lens = torch.tensor(
            [len(s.tokens) - a for s, a in zip(step.sequences, starts, strict=True)]
        )
        last = torch.cumsum(query_lens, 0) - 1
        return self.model.logits(hidden[last.to(self.device)])

    def _batch(self, step: Step, starts: list[int]) -> AttentionBatch:
        bs = self.block_size
        ends = torch.tensor([len(s.tokens) for s in step.sequences])
        start = torch.tensor(starts)
        query_lens = ends - start
        width_q, width_k = int(query_lens.max()), int(ends.max())
        width_b = max(len(s.block_table) for s in step.sequences)
        tables = torch.tensor(
            [s.block_table + [0] * (width_b - len(s.block_table)) for s in step.sequences]
        )
        slots = (tables[:, :, None] * bs + torch.arange(bs)).reshape(len(tables), -1)[:, :width_k]
        column = torch.arange(width_q)[None, :]
        real = column < query_lens[:, None]  # [B, Lq]: which padded queries are real tokens
        query_pos = torch.where(real, start[:, None] + column, 0)
        offsets = torch.cumsum(query_lens, 0) - query_lens
        mask = torch.arange(width_k)[None, None, :] <= query_pos[:, :, None]
        return AttentionBatch(
            positions=query_pos[real].to(self.device),
            write_slots=slots.gather(1, query_pos)[real].to(self.device),
            query_index=torch.where(real, offsets[:, None] + column, 0).to(self.device),
            query_valid=real.flatten().nonzero().squeeze(1).to(self.device),
            context_slots=slots.to(self.device),
            mask=mask[:, None].to(self.device),
        )

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        offsets = torch.arange(self.block_size)
        src = torch.cat(
            [torch.full((self.block_size,), s * self.block_size) + offsets for s, _ in copies]
        )
        dst = torch.cat(
            [torch.full((self.block_size,), d * self.block_size) + offsets for _, d in copies]
        )
        src, dst = src.to(self.device), dst.to(self.device)
        for layer_store in (self.cache.k, self.cache.v):
            layer_store[:, dst] = layer_store[:, src]
