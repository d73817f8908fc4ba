"""The CPU a benchmark ran on, in the terms that decide the engine's kernels.

Printed in every engine benchmark's header, since the figures differ by kind: AVX2 only (torch
emulates bf16 products), AVX512 with native bf16 (AVX512-BF16), or AMX.
"""

from __future__ import annotations

from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def cpu_kind() -> str:
    """The model name and the flags of `FLAGS` this CPU has, with torch's dispatch level."""
    import torch

    flags: set[str] = set()
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    kept = [f for f in FLAGS if f in flags]
    native = "native bf16" if {"avx512_bf16", "amx_bf16"} & flags else "bf16 emulated"
    return (
        f"CPU: {model}; {' '.join(kept) or 'no AVX2'} ({native}); "
        f"torch dispatch {torch.backends.cpu.get_cpu_capability()}"
    )
