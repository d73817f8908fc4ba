"""Run an engine benchmark as a lesser CPU of this project's kinds would run it, on one that has more.

- `avx2`: holds torch, oneDNN, MKL and numba to AVX2 code and tells the engine the CPU has no
  native bf16 (`_arith.native_half`): the paths an AVX2-only machine takes (bf16 products of
  several rows in fp32 on upcasts, no packed copies).
- `avx512-bf16`: AVX512-BF16 without AMX, as the AMD EPYCs with native bf16 have it: oneDNN
  held to AVX512-BF16 code, and the engine told there are no AMX tiles (`_arith.amx`, which
  its decode paths read): oneDNN's packed copies instead of tiles, fp32 SDPA.

The engine sees the held CPU as what it is held to, so the decode paths it chooses and keeps
for it (`${LANEFOLD_CACHE}/engine/paths/`) are kept apart from the unheld machine's.

The memory system stays this machine's, and a vLLM row (a subprocess with its own CPU kernels)
is not held back: compare our engine with itself here, not with vLLM. Printed, never asserted.

    PYTHONPATH=. .venv/bin/python bench/held_to.py avx2 bench/decode_limit.py --dtype float32
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

KINDS = {  # what each kind sets before any library loads (they read it when they do)
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "NUMBA_CPU_NAME": "haswell",
    },
    "avx512-bf16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
}


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in KINDS:
        raise SystemExit(f"usage: bench/held_to.py {{{','.join(KINDS)}}} BENCH_SCRIPT [its arguments]")
    kind = sys.argv[1]
    os.environ.update(KINDS[kind])
    import lanefold.backends.engine._arith as arith

    if kind == "avx2":
        arith.native_half = lambda dtype: False  # no AVX512-BF16, no AMX
    arith.amx = lambda: False  # no tiles, packed or attended over (the decode paths ask it)
    script = Path(sys.argv[2]).resolve()
    sys.argv = sys.argv[2:]
    sys.path.insert(0, str(script.parent))  # the bench's own siblings (bench/_cpu.py, ...)
    print(f"held to {kind} kernels, no AMX (bench/held_to.py)")
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
