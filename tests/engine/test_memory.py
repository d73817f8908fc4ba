"""The model's weights in one block of memory, in the order a decode step reads them."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from tiny import tiny_checkpoint  # noqa: E402

from lanefold.backends.engine._memory import Arena  # noqa: E402
from lanefold.backends.engine._model import build_model  # noqa: E402


def test_tensors_from_an_arena_follow_one_another_each_on_a_cache_line() -> None:
    shapes = [(3, 5), (7,), (2, 2, 2)]
    arena = Arena.of(shapes, torch.bfloat16, torch.device("cpu"))
    tensors = [arena.empty(shape).fill_(i) for i, shape in enumerate(shapes)]
    starts = [t.data_ptr() for t in tensors]
    assert starts == sorted(starts) and all(start % 64 == 0 for start in starts)
    assert starts[1] - starts[0] == 64 and starts[2] - starts[1] == 64  # 30 and 14 bytes, aligned
    assert [t.shape for t in tensors] == [torch.Size(s) for s in shapes]
    assert all(bool((t == i).all()) for i, t in enumerate(tensors))  # none overlaps another
    with pytest.raises(ValueError, match="cannot hold"):
        arena.empty((1,))


def test_writing_one_arena_tensor_in_place_leaves_the_others_versions_alone() -> None:
    """The model tells a weight written in place (whose packed copy is stale) by its version
    counter: tensors of one arena must not share one, as views of one tensor would."""
    arena = Arena.of([(4,), (4,)], torch.float32, torch.device("cpu"))
    a, b = arena.empty((4,)), arena.empty((4,))
    before = b._version
    a.mul_(2)
    assert b._version == before and a._version > before


def test_a_cpu_models_weights_lie_in_the_order_a_decode_step_reads_them() -> None:
    model = build_model(tiny_checkpoint(), torch.device("cpu"), torch.float32)
    order = []
    for w in model.layer_weights():
        assert w.qkv is not None and w.gate_up is not None
        order += [w.input_norm, w.qkv, w.o, w.post_norm, w.gate_up, w.down]
    order += [model.model.norm.weight, model.lm_head.weight]
    starts = [t.data_ptr() for t in order]
    assert starts == sorted(starts)
    for before, after in itertools.pairwise(order):  # no gap but the alignment
        assert 0 <= after.data_ptr() - (before.data_ptr() + before.numel() * before.element_size()) < 64


def test_elsewhere_than_a_cpu_an_arena_allocates_each_tensor_on_its_own() -> None:
    arena = Arena.of([(2, 3)], torch.float32, torch.device("meta"))
    assert arena.empty((2, 3)).device.type == "meta"
