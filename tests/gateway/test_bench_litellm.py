"""bench/gateway_litellm.py's table: what a gateway adds over the upstream row and the ratio,
the requests a side did not get answered, and each server's CPU per request (its process
tree's). Nothing here installs or starts LiteLLM."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gateway_litellm import Side, cpu_table, table, tree_cpu  # the bench's folder is no package


def test_table_gives_added_latency_and_ratio_against_the_first_side() -> None:
    upstream = Side("upstream (baseline)", [0.001] * 10, [0.100] * 10, 100.0, [])
    gateway = Side("g", [0.004] * 10, [0.150] * 10, 25.0, ["ReadError", "ReadError", "500"])
    lines = table([upstream, gateway])
    rows = [[cell.strip() for cell in line.split("|")] for line in lines if "|" in line]
    one = next(row for row in rows if row[:2] == ["g", "1"])
    assert one[2:] == ["4.00 ms", "3.00 ms", "4.00x", "4.00 ms", "3.00 ms", "4.00x"]
    many = next(row for row in rows if row[:2] == ["g", "32"])
    assert many[2:] == ["150.00 ms", "50.00 ms", "1.50x", "150.00 ms", "50.00 ms", "1.50x"]
    assert next(row for row in rows if row[0] == "g" and len(row) == 3)[1:] == ["25", "0.25x"]
    assert lines[-1] == "g: 3 requests not answered 200 (untimed): {'500': 1, 'ReadError': 2}"


def test_cpu_rows_give_each_side_per_phase_and_lanefold_over_litellm_at_equal_workers() -> None:
    sides = [
        Side("upstream (baseline)", [0.001], [0.1], 100.0, [], (0.001, 0.001, 0.001)),
        Side("lanefold, 1 worker(s)", [0.004], [0.15], 25.0, [], (0.004, 0.006, 0.003)),
        Side("LiteLLM, 1 worker(s)", [0.004], [0.15], 25.0, [], (0.008, 0.003, 0.003)),
    ]
    rows = [[cell.strip() for cell in line.split("|")] for line in cpu_table(sides) if "|" in line]
    assert rows[1] == ["upstream (baseline)", "1.00 ms", "1.00 ms", "1.00 ms"]
    assert rows[2] == ["lanefold, 1 worker(s)", "4.00 ms", "6.00 ms", "3.00 ms"]
    assert rows[-1] == ["1 worker(s): lanefold/LiteLLM", "0.50x", "2.00x", "1.00x"]


def test_tree_cpu_counts_a_process_and_its_children() -> None:
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    parent = (
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(5)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", parent])
    try:
        before = tree_cpu(child.pid)
        deadline = time.monotonic() + 30
        while tree_cpu(child.pid) - before < 0.25:  # the grandchild's 0.3 s, counted through the tree
            assert time.monotonic() < deadline, "the child's CPU was never counted"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
