"""`python bench/_cpu_profile.py OUT ARGS...`: the lanefold CLI (`orchestrator ARGS...`) under
yappi's CPU clock over every thread (the store's work runs in anyio's worker threads, which
cProfile does not see, and a wall clock counts fsync's wait as cost), its stats written to OUT
(pstats format) when the command returns. The bench's profiling switch, never the library's:
`bench/gateway_litellm.py` runs the one-worker gateway through it under LANEFOLD_BENCH_PROFILE.
"""

from __future__ import annotations

import sys

import yappi

from lanefold.cli import main

if __name__ == "__main__":
    out, sys.argv = sys.argv[1], [sys.argv[0], *sys.argv[2:]]
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    try:
        code = main()
    finally:
        yappi.stop()
        yappi.get_func_stats().save(out, type="pstat")
    sys.exit(code)
