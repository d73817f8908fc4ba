"""bench/gateway_litellm.py's table: what a gateway adds over the upstream row and the ratio,
and the requests a side did not get answered. Nothing here installs or starts LiteLLM."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gateway_litellm import Side, table  # the bench's folder is no package


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
