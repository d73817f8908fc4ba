"""The machine as the engine's kernels see it: what kind of CPU, and the features that decide
which kernels run (`_decode_paths` keys its choices by them; `orchestrator doctor` prints them).

Read through the engine's own probes (`_arith.native_half`, `_arith.amx`, `_arith.onednn_bf16`),
so a CPU held back by `ONEDNN_MAX_CPU_ISA` and the like (`bench/held_to.py`) is seen as the CPU
it is held to, and its choices are kept apart from the unheld machine's.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from lanefold.backends.engine import _arith

__all__ = ("FLAGS", "HELD_BY", "Machine", "cpu_model", "library_version", "machine")

# The CPU flags (as /proc/cpuinfo names them) that decide the kernels: AVX2 and AVX-512 for
# the loops' width, AVX512-BF16 and AMX for native bf16, AMX's tiles for `_tiles`
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
# What holds the libraries below what the CPU has (torch's dispatch, oneDNN, MKL, numba's LLVM)
HELD_BY = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "NUMBA_CPU_NAME")


@dataclass(frozen=True, slots=True)
class Machine:
    """This machine as the kernels see it. `kind`: `amx` (bf16 native, AMX's tiles),
    `avx512-bf16` (bf16 native, no tiles), else torch's dispatch level (`avx512`, `avx2`,
    `default`: bf16 emulated). `held`: the variables of `HELD_BY` that are set."""

    cpu: str
    kind: str
    flags: tuple[str, ...]
    cores: int
    native_bf16: bool
    amx: bool
    onednn_bf16: bool
    held: tuple[tuple[str, str], ...]


def machine() -> Machine:
    """This machine now (the probes are cached; the variables are read each time)."""
    name, flags = cpu_model()
    native = _arith.native_half(torch.bfloat16)
    amx = _arith.amx()
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "default")()
    kind = "amx" if native and amx else "avx512-bf16" if native else str(capability).lower()
    held = tuple((var, os.environ[var]) for var in HELD_BY if os.environ.get(var))
    return Machine(name, kind, flags, os.cpu_count() or 1, native, amx, _arith.onednn_bf16(), held)


@functools.cache
def cpu_model() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and which of `FLAGS` it has, from /proc/cpuinfo's first processor
    ("unknown" and none where there is no such file)."""
    name, flags = "unknown", tuple[str, ...]()
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8", errors="replace") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name == "unknown":
                    name = value.strip()
                elif key == "flags":
                    have = set(value.split())
                    flags = tuple(flag for flag in FLAGS if flag in have)
                    break  # every processor has the same flags
    except OSError:
        pass
    return name, flags


@functools.cache
def library_version() -> str:
    """lanefold's installed version ("unknown" where it is not installed, e.g. a bare checkout)."""
    try:
        return metadata.version("lanefold")
    except metadata.PackageNotFoundError:
        return "unknown"
