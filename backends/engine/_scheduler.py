"""Continuous batching: which sequences the next model step computes.

A step is either a prefill (new prompts, and sequences preempted earlier, admitted while blocks,
lanes and a token budget allow) or a decode of every running branch at once. When the pool
cannot give a running branch its next slot, the most recently admitted branch is preempted:
its blocks are freed and it is recomputed later (its prompt usually comes back from the prefix
cache). A lone sequence always fits, because requests bigger than the pool are refused up front.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from lanefold.backends.engine._blocks import BlockPool
from lanefold.backends.engine._sequence import Sequence, Status

__all__ = ("PREFILL_TOKEN_BUDGET", "Scheduler", "Step")

PREFILL_TOKEN_BUDGET = 4096  # tokens computed by one prefill step, past its first sequence


@dataclass(slots=True)
class Step:
    """One model step: its sequences and the block copies (src, dst) to make before it."""

    kind: Literal["prefill", "decode"]
    sequences: list[Sequence]
    copies: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    """Queues of waiting and running sequences over one block pool."""

    def __init__(self, pool: BlockPool, max_lanes: int) -> None:
        self.pool = pool
        self.max_lanes = max_lanes
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0

    def add(self, leader: Sequence) -> None:
        """Queue a prompt's leading sequence (its followers are forked after its prefill)."""
        self.waiting.append(leader)

    def has_work(self) -> bool:
        """Whether any sequence waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> Step | None:
        """The next step, or None when there is nothing to do."""
        prefill = self._admit()
        if prefill:
            return Step("prefill", prefill)
        if self.running:
            return self._decode()
        return None

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out of the queues and give back its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.pool.free(seq.block_table)
        seq.block_table = []

    def _admit(self) -> list[Sequence]:
        batch: list[Sequence] = []
        tokens = 0
        lanes = len(self.running)
        while self.waiting:
            seq = self.waiting[0]
            width = 1 + len(seq.followers)
            if batch and tokens + len(seq.tokens) > PREFILL_TOKEN_BUDGET:
                break
            if lanes + width > self.max_lanes and (batch or self.running):
                break
            if not self.pool.can_allocate(seq.tokens):
                break
            self.waiting.popleft()
            seq.block_table, seq.num_computed = self.pool.allocate(seq.tokens)
            seq.status = Status.RUNNING
            batch.append(seq)
            tokens += len(seq.tokens) - seq.num_computed
            lanes += width
        return batch

    def _decode(self) -> Step:
        step = Step("decode", [])
        queue = deque(self.running)
        while queue:
            seq = queue.popleft()
            while not self.pool.can_append(seq.block_table, len(seq.tokens)):
                if not queue:
                    break
                self._preempt(queue.pop())
            if not self.pool.can_append(seq.block_table, len(seq.tokens)):
                self._preempt(seq)
                continue
            copy = self.pool.append(seq.block_table, seq.tokens)
            if copy is not None:
                step.copies.append(copy)
                seq.metrics.cow_block_copies += 1
            step.sequences.append(seq)
        self.running = list(step.sequences)
        return step

    def _preempt(self, seq: Sequence) -> None:
        self.pool.free(seq.block_table)
        seq.block_table, seq.num_computed = [], 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.preemptions += 1
