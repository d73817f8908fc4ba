"""The decode steps over AMX's tiles (`_tiled_step`): what they refuse, everywhere; on a CPU with
AMX, test_exactness holds their logits to the layer-by-layer step and the reference."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

import numpy as np  # noqa: E402

from lanefold.backends.engine import _tiled_step  # noqa: E402
from lanefold.backends.engine._tiled_step import TileStack, tile_stack, tiled_lane_layers, tiled_layers  # noqa: E402


def _stack() -> TileStack:
    empty = np.zeros((1, 32), dtype=np.uint16)
    return TileStack(empty, empty, np.zeros(1, dtype=np.uint32), np.zeros((1, 4, 3), dtype=np.int64))


def _kv(dtype: Any) -> tuple[Any, Any]:
    return torch.zeros(1, 16, 1, 32, dtype=dtype), torch.zeros(1, 16, 1, 32, dtype=dtype)


def test_the_whole_steps_take_bf16_rows_within_their_bounds_and_refuse_the_rest() -> None:
    rope = torch.ones(1, 16, dtype=torch.complex64)
    positions, slots = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    tables = torch.zeros(1, 1, dtype=torch.long)
    prefix = (torch.zeros(1, 1, 2, 1, 16, 16, dtype=torch.int32),) * 2
    forks = (rope, 64, _kv(torch.bfloat16), slots, prefix, 32, tables, 16, positions)
    for x in (
        torch.zeros(1, 32),  # fp32 rows: the layers go one by one
        torch.zeros(0, 32, dtype=torch.bfloat16),  # no rows
        torch.zeros(129, 32, dtype=torch.bfloat16),  # past TILED_ROWS
    ):
        assert tiled_layers(x, _stack(), 1e-5, *forks) is None
    fp32_pool = (*forks[:2], _kv(torch.float32), *forks[3:])
    assert tiled_layers(torch.zeros(1, 32, dtype=torch.bfloat16), _stack(), 1e-5, *fp32_pool) is None
    lane = (rope, 64, _kv(torch.bfloat16), 0, (torch.zeros(1, 1, 4, 32),) * 2, 0)
    assert tiled_lane_layers(torch.zeros(2, 32, dtype=torch.bfloat16), _stack(), 1e-5, *lane) is None
    assert tiled_lane_layers(torch.zeros(1, 32), _stack(), 1e-5, *lane) is None


def test_where_the_tiles_do_not_run_no_tile_stack_is_made() -> None:
    if _tiled_step.ready():
        pytest.skip("this CPU runs AMX's tiles (test_exactness checks the steps over them)")
    norm = torch.ones(32, dtype=torch.bfloat16)
    assert tile_stack([(norm, norm)], np.zeros(1, dtype=np.uint32), 0) is None
    assert tile_stack([], np.zeros(1, dtype=np.uint32), 0) is None
