"""Run an engine benchmark as an AVX2-only CPU would run it, on a CPU that has more.

Holds torch, oneDNN, MKL and numba to AVX2 code and tells the engine the CPU has no native bf16
(`_arith.native_half`), so a machine with AVX512-BF16 takes the paths an AVX2 machine takes: bf16
products of several rows in fp32 on upcasts, no packed copies. The memory system stays this
machine's, and a vLLM row (a subprocess with its own CPU kernels) is not held back: compare our
engine with itself here, not with vLLM. Printed, never asserted.

    PYTHONPATH=. .venv/bin/python bench/as_avx2.py bench/decode_limit.py --dtype float32
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

os.environ.update(  # read when each library loads, so before any of them does
    ATEN_CPU_CAPABILITY="avx2",
    ONEDNN_MAX_CPU_ISA="AVX2",
    MKL_ENABLE_INSTRUCTIONS="AVX2",
    NUMBA_CPU_NAME="haswell",
)

import lanefold.backends.engine._arith as arith


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: bench/as_avx2.py BENCH_SCRIPT [its arguments]")
    arith.native_half = lambda dtype: False  # no AVX512-BF16, no AMX
    script = Path(sys.argv[1]).resolve()
    sys.argv = sys.argv[1:]
    sys.path.insert(0, str(script.parent))  # the bench's own siblings (bench/_cpu.py, ...)
    print("held to AVX2 kernels, no native bf16 (bench/as_avx2.py)")
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
