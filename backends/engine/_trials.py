"""The load-time trials that decide between two kernels where which is faster differs between
machines: measured, never assumed, and kept by `_decode_paths` so a machine measures each once.

- `torch_reads_faster`: one-row products by torch's kernels (fp32 `mv`, or oneDNN's packed
  bf16) against the one-thread loops of `_products`, at the engine's thread count. Two threads
  read twice what one does only where they are two cores with memory to spare (not two
  hyperthreads of one), and which kernel streams a matrix fastest differs between CPUs and shapes
  (on a Xeon with AMX, one thread, bf16: 576 wide as SmolLM2's layers, the loop 13.0 GB/s and
  oneDNN 10.6; 1024 wide, level).
- `tiles_read_faster`: products of 8 rows (a decode step of a few lanes) over bf16 matrices
  through AMX's tiles against oneDNN's packed ones: on two threads oneDNN reads with both cores
  (12 against 14 ms at 8 rows on the Xeon with AMX) and keeps its copies.

Each reads its matrices one after another as a decode step reads its layers, from where a
model's lie (an `Arena`, on huge pages; the packed copies where oneDNN puts them), best of three
interleaved passes after one that faults the pages in: tens of milliseconds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from lanefold.backends.engine._compiled import _words
from lanefold.backends.engine._memory import Arena
from lanefold.backends.engine._products import _rows, pack, packed_linear, torch_rows
from lanefold.backends.engine._tiles import tile, tile_shape, tiled_linear

__all__ = ("Trial", "tiles_read_faster", "torch_reads_faster")

logger = logging.getLogger(__name__)

_TRIAL_BYTES = 32 << 20  # what `torch_reads_faster` reads a pass, each way
_TRIAL_MATRIX = 2 << 20  # ... in matrices of about this size, as a small model's layers are


@dataclass(frozen=True, slots=True)
class Trial:
    """What a trial found: whether the second kernel is faster, and each one's best pass (ms)."""

    faster: bool
    ms: dict[str, float] = field(default_factory=dict)


def _trial_matrices(dtype: torch.dtype, width: int, nbytes: int, multiple: int = 1) -> list[Tensor]:
    """Matrices `width` wide of about `_TRIAL_MATRIX` bytes each (rows a multiple of
    `multiple`), `nbytes` of them in all, one after another in an `Arena` as a model's layers
    lie: what the load-time trials read."""
    size = torch.empty((), dtype=dtype).element_size()
    rows = max(64, _TRIAL_MATRIX // (width * size)) // multiple * multiple
    count = max(2, nbytes // (rows * width * size))
    arena = Arena.of([(rows, width)] * count, dtype, torch.device("cpu"))
    return [arena.empty((rows, width)).fill_(0.5) for _ in range(count)]


def _best_of_three(runs: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Each run's best time of three in ms, interleaved, after a first run of each (which faults
    the pages in): the load-time trials' measure."""
    times = dict.fromkeys(runs, float("inf"))
    for run in runs.values():
        run()
    for _ in range(3):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name] = min(times[name], time.perf_counter() - start)
    return {name: round(seconds * 1000, 3) for name, seconds in times.items()}


def torch_reads_faster(threads: int, dtype: torch.dtype, width: int) -> Trial:
    """Whether, on this machine at `threads` threads (torch's now), torch's one-row products of
    `dtype` matrices `width` wide (fp32 `mv`, or oneDNN's packed bf16) read faster than the
    one-thread loop (`ms`: "loops", "torch"). The loops must be ready (`_products.ready`)."""
    matrices = _trial_matrices(dtype, width, _TRIAL_BYTES)
    x = np.ones((1, width), dtype=np.float32)
    out = np.empty((1, matrices[0].shape[0]), dtype=np.float32)
    words = [_words(m) for m in matrices]
    try:
        copies = [pack(m) if dtype != torch.float32 else None for m in matrices]
    except (AttributeError, RuntimeError):  # a torch without oneDNN's packed products
        return Trial(False)
    halves = dtype == torch.bfloat16

    def loop() -> None:
        for w in words:
            _rows(w, halves, x, out)

    def by_torch() -> None:
        for m, copy in zip(matrices, copies, strict=True):
            torch_rows(x, m, copy)

    times = _best_of_three({"loops": loop, "torch": by_torch})
    logger.debug("one-row products %d wide, %d threads, %s: %s", width, threads, dtype, times)
    return Trial(times["torch"] < times["loops"], times)


def tiles_read_faster(threads: int, width: int) -> Trial:
    """Whether, on this machine at `threads` threads (torch's now), the tiled products of 8
    rows over bf16 matrices `width` wide (a multiple of 32) stream faster than oneDNN's packed
    ones (`ms`: "onednn", "tiles"). AMX's tiles must be ready (`_tiles.amx_ready`)."""
    matrices = _trial_matrices(torch.bfloat16, width, _TRIAL_BYTES // 2, multiple=32)
    memory = Arena.of([tile_shape(m) for m in matrices], torch.int32, torch.device("cpu"))
    tiled = [tile(m, memory) for m in matrices]
    copies = [pack(m) for m in matrices]
    x = torch.full((8, width), 0.25, dtype=torch.bfloat16)

    def by_tiles() -> None:
        for t in tiled:
            tiled_linear(x, t)

    def by_onednn() -> None:
        for copy in copies:
            packed_linear(x, copy)

    times = _best_of_three({"tiles": by_tiles, "onednn": by_onednn})
    logger.debug("8-row products %d wide, %d threads: %s", width, threads, times)
    return Trial(times["tiles"] < times["onednn"], times)
