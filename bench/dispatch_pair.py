"""The dispatch path's per-lane cost at two commits, paired: did a change slow it down?

`orchestrator.run` of K instant simulated lanes (a request each, `fsync = "never"`), three runs
after a warm-up in a fresh process per sample, the two commits' processes interleaved; medians
of wall and process CPU microseconds per lane, and the ratio after/before. Each commit runs from
a temporary git worktree of this repository (removed at the end), imported from there: a
commit that maps its folders into `lanefold` through pyproject.toml is laid out as links first
(scripts/typecheck_tree.py), one with a `lanefold` symlink is put on sys.path as it is. Nothing
is asserted.

    PYTHONPATH=. .venv/bin/python bench/dispatch_pair.py BEFORE [AFTER] [--k 1000] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from typecheck_tree import lay_out  # noqa: E402  (a script beside bench/, not a package)

CHILD = r"""
import sys, time, tempfile
sys.path.insert(0, sys.argv[1])  # the commit's `lanefold`, ahead of the installed one
import anyio, orchestrator
K = int(sys.argv[2])
cfg = orchestrator.parse_config({"loop": {"k": K, "max_concurrency": K, "seed": 1},
    "backend": {"kind": "simulated", "lanes_per_request": 1}, "log": {"fsync": "never"}})

async def main():
    with tempfile.TemporaryDirectory() as d:
        await orchestrator.run(cfg, "What is 17 * 23?", runs_dir=d)  # warm-up
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(3):
            await orchestrator.run(cfg, "What is 17 * 23?", runs_dir=d)
        print((time.perf_counter() - wall) / 3 / K * 1e6, (time.process_time() - cpu) / 3 / K * 1e6)

anyio.run(main)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", default="HEAD")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {side: Path(tmp) / side for side in ("before", "after")}
        for side, tree in trees.items():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), getattr(args, side)],
                check=True,
            )
        found = {
            side: tree if (tree / "lanefold").exists() else lay_out(Path(tmp) / f"{side}-links", tree).parent
            for side, tree in trees.items()
        }
        try:
            samples: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
            for rep in range(args.reps):
                for side in ("before", "after") if rep % 2 == 0 else ("after", "before"):
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, str(found[side]), str(args.k)],
                        capture_output=True,
                        text=True,
                        cwd=trees[side],
                        check=True,
                    )
                    wall, cpu = map(float, out.stdout.split())
                    samples[side].append((wall, cpu))
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
                )
    print(f"\ndispatch path, K = {args.k}, {args.reps} processes a side, medians (us per lane)")
    for i, name in enumerate(("wall", "process CPU")):
        before = statistics.median(s[i] for s in samples["before"])
        after = statistics.median(s[i] for s in samples["after"])
        print(
            f"{name:>12}: {args.before} {before:.1f}  {args.after} {after:.1f}  "
            f"after/before {after / before:.3f}"
        )


if __name__ == "__main__":
    main()
