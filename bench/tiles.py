"""A decode step's products on a CPU with AMX: AMX's tiles against oneDNN's packed copies and torch.

Every layer's four matrices of a SmolLM2-135M-shaped model (30 layers: q|k|v 960 x 576, o
576 x 576, gate|up 3072 x 576, down 576 x 1536; random bf16), multiplied in the order a step
reads them by M rows: the engine's tiled product (`_tiles.tile`, the tiles in one huge-page
block in read order, as the engine keeps them), oneDNN's packed product (the copies the engine
keeps where the tiles are not faster), `F.linear` on the `[out, in]` weights (what a product of
more than `TILED_ROWS` rows takes), and at one or two rows the engine's own loop over those
(`_products.small_linear`, what a lone lane's step reads them with where the copies are not
tiles). The best of `--reps` interleaved passes;
milliseconds for a step's products and the rate the weights stream at. Printed, never asserted.

    PYTHONPATH=. .venv/bin/python bench/tiles.py [--threads 1] [--rows 1,8,16,32,64,128,512]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _cpu import cpu_kind  # bench/_cpu.py

from lanefold.backends.engine._memory import Arena
from lanefold.backends.engine._products import ROWS, pack, packed_linear, small_linear
from lanefold.backends.engine._tiles import TILED_ROWS, amx_ready, tile, tile_shape, tiled_linear

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
LAYERS = 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="1,8,16,32,64,128,512")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(cpu_kind())
    if not amx_ready():
        print("no AMX tiles here (no AMX, or Linux did not grant their state): nothing to compare")
        sys.exit(0)
    g = torch.Generator().manual_seed(0)
    order = [shape for _ in range(LAYERS) for shape in SHAPES]
    dense = Arena.of(order, torch.bfloat16, torch.device("cpu"))
    weights = [dense.empty(shape).copy_(torch.randn(*shape, generator=g)) for shape in order]
    memory = Arena.of([tile_shape(w) for w in weights], torch.int32, torch.device("cpu"))
    tiled = [tile(w, memory) for w in weights]
    packed = [pack(w) for w in weights]
    nbytes = sum(w.numel() * 2 for w in weights)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {nbytes / 1e6:.0f} MB of bf16 matrices")
    head = (
        "rows",
        "tiles ms",
        "oneDNN ms",
        "F.linear ms",
        "loop ms",
        "tiles GB/s",
        "oneDNN GB/s",
        "tiles / oneDNN",
    )
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for rows in (int(r) for r in args.rows.split(",")):
        xs = {k: torch.randn(rows, k, generator=g).bfloat16() for k in {s[1] for s in SHAPES}}

        def by_tiles(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in tiled:
                tiled_linear(xs[w.weight.shape[1]], w)

        def by_onednn(xs: dict[int, torch.Tensor] = xs) -> None:
            for w, copy in zip(weights, packed, strict=True):
                packed_linear(xs[w.shape[1]], copy)

        def by_torch(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in weights:
                F.linear(xs[w.shape[1]], w)

        def by_loop(xs: dict[int, torch.Tensor] = xs) -> None:
            for w in weights:
                small_linear(xs[w.shape[1]], w)

        ways: dict[str, Callable[[], None]] = {"tiles": by_tiles, "oneDNN": by_onednn, "F.linear": by_torch}
        if rows <= ROWS:
            ways["loop"] = by_loop
        best = dict.fromkeys(ways, float("inf"))
        for run in ways.values():
            run()  # first use: pages, primitives
        for _ in range(args.reps):
            for name, run in ways.items():
                start = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - start)
        note = " (torch's product: past TILED_ROWS)" if rows > TILED_ROWS else ""
        ms = {name: f"{seconds * 1e3:.1f}" for name, seconds in best.items()}
        ms.setdefault("loop", "-")
        rates = {name: f"{nbytes / seconds / 1e9:.1f}" for name, seconds in best.items()}
        print(
            f"| {rows}{note} | {ms['tiles']} | {ms['oneDNN']} | {ms['F.linear']} | {ms['loop']} "
            f"| {rates['tiles']} | {rates['oneDNN']} | {best['tiles'] / best['oneDNN']:.2f} |"
        )


if __name__ == "__main__":
    main()
