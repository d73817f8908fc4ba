"""Where the model's weights live on a CPU: one block, in read order, on huge pages.

A decode step of one or two lanes is a stream through every weight, and one core streams much
faster from huge pages than from 4 KiB ones (a page walk and a restarted hardware prefetch at
every 4 KiB boundary): on the Xeon with AMX, one thread, 600 MB of SmolLM2-sized bf16 matrices
read one after another, a plain sum read 11.2 GB/s from 4 KiB pages and 17.5 from 2 MiB ones,
the engine's one-row product 8.7 and 13.3. A layer's matrices are 0.6 to 3.5 MB each, too
small for a huge page of their own, so the model goes in one anonymous mapping the kernel is
asked (`MADV_HUGEPAGE`) to back with transparent huge pages, each tensor after the one a step
reads before it. Where the kernel gives no huge pages (none free, THP off, not Linux) it is
ordinary memory, as before: only slower.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ("Arena",)

_HUGE_PAGE = 2 << 20
_ALIGN = 64  # bytes: each tensor starts on a cache line


class Arena:
    """Tensors of one dtype laid out one after another in one block of CPU memory on huge
    pages (see the module); elsewhere than on a CPU, each tensor its own allocation.

    The block lives as long as any tensor taken from it."""

    def __init__(self, nbytes: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.raw: mmap.mmap | None = None
        self.used = self.start = self.end = 0
        if device.type == "cpu" and hasattr(mmap, "MAP_PRIVATE"):  # (not on Windows)
            self.raw = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            if hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    self.raw.madvise(mmap.MADV_HUGEPAGE)
                except OSError:  # a kernel built without transparent huge pages
                    pass
            base = torch.frombuffer(self.raw, dtype=torch.uint8).data_ptr()
            self.used = self.start = -base % _HUGE_PAGE  # the first huge page begins at the first tensor
            self.end = self.used + nbytes

    @classmethod
    def of(cls, shapes: Iterable[Sequence[int]], dtype: torch.dtype, device: torch.device) -> Arena:
        """Room for a tensor of each of `shapes` in `dtype`."""
        width = torch.empty((), dtype=dtype).element_size()
        return cls(sum(_aligned(math.prod(shape) * width) for shape in shapes), dtype, device)

    def empty(self, shape: Sequence[int]) -> Tensor:
        """An uninitialised tensor of `shape` in the arena's dtype: the next in the block.

        A tensor of its own over the block's memory, not a view of one tensor of it all: views
        share their base's version counter, and the model tells a written weight by its own
        (`_model._rewritten`)."""
        if self.raw is None:
            return torch.empty(tuple(shape), dtype=self.dtype, device=self.device)
        count = math.prod(shape)
        nbytes = count * torch.empty((), dtype=self.dtype).element_size()
        if self.used + nbytes > self.end:
            raise ValueError(f"the arena's {self.end} bytes cannot hold {self.used + nbytes}")
        tensor = torch.frombuffer(self.raw, dtype=self.dtype, count=count, offset=self.used)
        self.used += _aligned(nbytes)  # (the tensor holds `raw` while it lives)
        return tensor.view(tuple(shape))

    def words(self) -> tuple[np.ndarray, int] | None:
        """The whole block as uint32 words (numpy, sharing its memory) and the address of the
        first: where the compiled decode step reads every weight from one array. None where
        the arena is not one block (elsewhere than on a CPU)."""
        if self.raw is None:
            return None
        block = torch.frombuffer(self.raw, dtype=torch.uint8)[self.start : self.end]
        return block.numpy().view(np.uint32), block.data_ptr()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN
