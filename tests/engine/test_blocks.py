"""Block accounting: reference counts, copy-on-write, the prefix cache and the free list."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from lanefold.backends.engine._blocks import BlockPool
from lanefold.backends.engine._engine import Engine
from lanefold.primitives import ContextLengthError, LaneRequest, SamplingParams


def test_fork_shares_every_block_and_allocates_nothing() -> None:
    pool = BlockPool(num_blocks=16, block_size=4)
    table, cached = pool.allocate(list(range(10)))  # 2 full blocks + a partial one
    assert (len(table), cached, pool.num_free) == (3, 0, 13)
    forks = [pool.fork(table) for _ in range(3)]
    assert pool.num_free == 13
    assert all(pool.blocks[b].ref_count == 4 for b in table)
    copies = [pool.append(f, [*list(range(10)), 99]) for f in forks]
    assert copies == [(table[2], c[1]) for c in copies]  # only the partial block is copied
    assert pool.append(table, [*list(range(10)), 99]) is None  # the last holder writes in place
    assert pool.copies == 3 and pool.num_free == 10
    for t in [table, *forks]:
        pool.free(t)
    assert pool.num_free == 16


@pytest.mark.parametrize(("prompt_len", "block_size"), [(37, 16), (32, 16), (37, 1), (37, 5)])
def test_engine_fork_costs_one_copy_per_partial_fork_and_gives_everything_back(
    make_engine: Callable[..., Engine], prompt_len: int, block_size: int
) -> None:
    engine = make_engine(block_size=block_size, num_blocks=64 * 16 // block_size + 64)
    pool, k = engine.pool, 8
    prompt = [(3 * i) % 256 for i in range(prompt_len)]
    request = engine.add_request(
        prompt,
        SamplingParams(temperature=1.0, max_tokens=4),
        [LaneRequest(i, i, 4) for i in range(k)],
    )
    engine.step()  # prefill once, then fork
    prompt_blocks = pool.blocks_for(prompt_len)
    assert pool.num_blocks - pool.num_free == prompt_blocks  # the fork took no block
    assert engine.metrics.tokens_computed == prompt_len
    engine.step()  # first decode: the shared partial block is copied for all but one branch
    partial = prompt_len % block_size != 0
    assert pool.copies == (k - 1 if partial else 0)
    assert pool.num_blocks - pool.num_free == prompt_blocks + (k - 1 if partial else k)
    while not request.finished:
        engine.step()
    assert request.metrics.cow_block_copies == pool.copies
    assert request.metrics.peak_kv_blocks == pool.peak_used
    assert pool.num_free == pool.num_blocks
    assert engine.metrics.tokens_computed == prompt_len + k * 3  # P + K*(T-1): the last token is not fed


def test_prefix_cache_serves_full_blocks_across_requests_and_evicts_lru(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(block_size=4, num_blocks=24)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    preamble = list(range(40, 56))  # 4 full blocks
    first = engine.generate([*preamble, 1, 2], params, [LaneRequest(0, 0, 2)])
    second = engine.generate([*preamble, 3, 4], params, [LaneRequest(0, 0, 2)])
    assert (first.metrics.prompt_tokens_cached, second.metrics.prompt_tokens_cached) == (0, 16)
    assert second.sequences[0].input_tokens == 2 and second.sequences[0].cached_input_tokens == 16
    # fill the pool with unrelated prompts: the cached preamble is evicted, least recent first
    for start in (100, 150, 200):
        engine.generate(list(range(start, start + 33)), params, [LaneRequest(0, 0, 2)])
    third = engine.generate([*preamble, 5, 6], params, [LaneRequest(0, 0, 2)])
    assert third.metrics.prompt_tokens_cached == 0
    assert engine.pool.num_free == engine.pool.num_blocks


def test_a_request_bigger_than_the_pool_fails_clearly(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(block_size=4, num_blocks=8)
    with pytest.raises(ContextLengthError, match="pool has 8"):
        engine.add_request(list(range(30)), SamplingParams(), [LaneRequest(0, 0, 10)])
    fits = engine.generate(
        list(range(20)), SamplingParams(max_tokens=12), [LaneRequest(i, i, 12) for i in range(4)]
    )  # 4 lanes, each alone fits
    assert all(s.num_generated == 12 for s in fits.sequences)
    assert engine.pool.num_free == 8


class PoolMachine(RuleBasedStateMachine):
    """Random allocate/fork/append/free sequences against a model of what each slot holds."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(num_blocks=12, block_size=3)
        self.tables: list[list[int]] = []
        self.tokens: list[list[int]] = []
        self.slots: dict[int, list[int | None]] = {b: [None] * 3 for b in range(12)}

    def _write(self, table: list[int], tokens: list[int], start: int) -> None:
        for p in range(start, len(tokens)):
            self.slots[table[p // 3]][p % 3] = tokens[p]

    @rule(tokens=st.lists(st.integers(0, 2), min_size=1, max_size=10))
    def allocate(self, tokens: list[int]) -> None:
        if not self.pool.can_allocate(tokens):
            return
        table, cached = self.pool.allocate(tokens)
        assert cached % 3 == 0 and cached < len(tokens)
        self._write(table, tokens, cached)  # the prefill computes what the cache lacked
        self.tables.append(table)
        self.tokens.append(list(tokens))

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.tables) - 1))
        free = self.pool.num_free
        self.tables.append(self.pool.fork(self.tables[i]))
        self.tokens.append(list(self.tokens[i]))
        assert self.pool.num_free == free

    @precondition(lambda self: self.tables)
    @rule(data=st.data(), token=st.integers(0, 2))
    def append(self, data: st.DataObject, token: int) -> None:
        i = data.draw(st.integers(0, len(self.tables) - 1))
        tokens = [*self.tokens[i], token]
        if not self.pool.can_append(self.tables[i], len(tokens)):
            return
        copy = self.pool.append(self.tables[i], tokens)
        if copy is not None:
            self.slots[copy[1]] = list(self.slots[copy[0]])
        self._write(self.tables[i], tokens, len(tokens) - 1)
        self.tokens[i] = tokens

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.tables) - 1))
        self.pool.free(self.tables.pop(i))
        self.tokens.pop(i)

    @invariant()
    def reference_counts_match_the_live_tables(self) -> None:
        held = Counter(b for t in self.tables for b in t)
        assert all(self.pool.blocks[b].ref_count == held[b] for b in range(12))

    @invariant()
    def free_list_cache_and_held_blocks_partition_the_pool(self) -> None:
        held = {b for t in self.tables for b in t}
        free, cached = set(self.pool.free_ids), set(self.pool.lru)
        assert len(free) == len(self.pool.free_ids)
        assert not (free & cached) and not (free & held) and not (cached & held)
        assert free | cached | held == set(range(12))
        assert self.pool.num_free == 12 - len(held)
        assert all(self.pool.by_hash.get(self.pool.blocks[b].hash or -1) == b for b in cached)
        assert all(self.pool.blocks[b].hash is None for b in free)

    @invariant()
    def every_table_reads_back_its_tokens(self) -> None:
        for table, tokens in zip(self.tables, self.tokens, strict=True):
            assert [self.slots[table[p // 3]][p % 3] for p in range(len(tokens))] == tokens


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
