"""The KV block pool: fixed-size blocks, reference counts, copy-on-write and a prefix cache.

A sequence's KV lives in a block table (a list of block ids). Full blocks are immutable and may
be shared: between the branches of one request (`fork`) and, through a chained hash of their
tokens, across requests (the prefix cache). Only a sequence's partial last block is written; if
it is shared, `append` copies it first (copy-on-write), so a fork copies at most one block.
Unreferenced blocks that still hold a cached prefix stay findable until the pool needs them
back, least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ("Block", "BlockPool")

_ROOT = 0  # chain hash "before" the first block


@dataclass(slots=True)
class Block:
    """One block of `block_size` token slots. `hash` is set once the block is full."""

    id: int
    ref_count: int = 0
    hash: int | None = None
    tokens: tuple[int, ...] = ()


class BlockPool:
    """Bookkeeping of the KV pool; the runner moves the data (`append` returns copies to make)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))  # unreferenced, holding nothing
        self.lru: OrderedDict[int, None] = OrderedDict()  # unreferenced, holding a cached prefix
        self.by_hash: dict[int, int] = {}
        self.copies = 0
        self.peak_used = 0

    @property
    def num_blocks(self) -> int:
        """Size of the pool."""
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks an allocation may take (cached-but-unreferenced ones are evicted on demand)."""
        return len(self.free_ids) + len(self.lru)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a table of `num_tokens` tokens spans."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, tokens: Sequence[int]) -> bool:
        """Whether `allocate(tokens)` would succeed now."""
        hits = self._cache_hits(tokens)
        live_hits = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return self.blocks_for(len(tokens)) - live_hits <= self.num_free

    def allocate(self, tokens: Sequence[int]) -> tuple[list[int], int]:
        """A table for `tokens`, reusing cached full blocks; returns it and the tokens cached.

        The last token is never served from the cache: its logits must be computed.
        """
        hits = self._cache_hits(tokens)
        table = []
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.lru[block_id]
            block.ref_count += 1
            table.append(block_id)
        for _ in range(len(hits), self.blocks_for(len(tokens))):
            table.append(self._take())
        for index in range(len(hits), len(tokens) // self.block_size):
            self._seal(table, tokens, index)
        self._note_usage()
        return table, len(hits) * self.block_size

    def fork(self, table: Sequence[int]) -> list[int]:
        """A new table sharing every block of `table`; nothing is allocated or copied here."""
        for block_id in table:
            self.blocks[block_id].ref_count += 1
        return list(table)

    def can_append(self, table: Sequence[int], num_tokens: int) -> bool:
        """Whether `append` can make room for token number `num_tokens` (1-based) now."""
        return not self._append_needs_block(table, num_tokens) or self.num_free > 0

    def append(self, table: list[int], tokens: Sequence[int]) -> tuple[int, int] | None:
        """Make `table` ready to take the K/V of `tokens[-1]`; returns a block copy (src, dst)
        to perform first when the target block was shared (copy-on-write), else None."""
        position = len(tokens) - 1
        index = position // self.block_size
        copy = None
        if index == len(table):
            table.append(self._take())
        elif self.blocks[table[index]].ref_count > 1:
            source = table[index]
            self.blocks[source].ref_count -= 1
            table[index] = self._take()
            copy = (source, table[index])
            self.copies += 1
        if len(tokens) % self.block_size == 0:
            self._seal(table, tokens, index)
        self._note_usage()
        return copy

    def free(self, table: Sequence[int]) -> None:
        """Drop one reference to every block of `table`; the deepest blocks are evicted first."""
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.hash is not None and self.by_hash.get(block.hash) == block_id:
                self.lru[block_id] = None
            else:
                self._reset(block)
                self.free_ids.append(block_id)

    def _append_needs_block(self, table: Sequence[int], num_tokens: int) -> bool:
        index = (num_tokens - 1) // self.block_size
        return index == len(table) or self.blocks[table[index]].ref_count > 1

    def _cache_hits(self, tokens: Sequence[int]) -> list[int]:
        hits: list[int] = []
        parent = _ROOT
        for index in range((len(tokens) - 1) // self.block_size):
            chunk = tuple(tokens[index * self.block_size : (index + 1) * self.block_size])
            parent = hash((parent, chunk))
            block_id = self.by_hash.get(parent)
            if block_id is None or self.blocks[block_id].tokens != chunk:
                break
            hits.append(block_id)
        return hits

    def _seal(self, table: Sequence[int], tokens: Sequence[int], index: int) -> None:
        """Record the now-full block `table[index]` in the prefix cache."""
        block = self.blocks[table[index]]
        parent = self.blocks[table[index - 1]].hash if index > 0 else _ROOT
        block.tokens = tuple(tokens[index * self.block_size : (index + 1) * self.block_size])
        block.hash = hash((parent, block.tokens))
        self.by_hash.setdefault(block.hash, block.id)

    def _take(self) -> int:
        if self.free_ids:
            block_id = self.free_ids.popleft()
        elif self.lru:
            block_id, _ = self.lru.popitem(last=False)
            self._reset(self.blocks[block_id])
        else:
            raise RuntimeError("KV block pool exhausted; the scheduler should have checked")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _reset(self, block: Block) -> None:
        if block.hash is not None and self.by_hash.get(block.hash) == block.id:
            del self.by_hash[block.hash]
        block.hash, block.tokens = None, ()

    def _note_usage(self) -> None:
        self.peak_used = max(self.peak_used, self.num_blocks - self.num_free)
