"""Fetch BIG-bench's tasks once into the cache that `--dataset bigbench:<task>` reads.

    python scripts/fetch_bigbench.py                # pip download --no-deps (about 360 MB)
    python scripts/fetch_bigbench.py --from DIR     # an unpacked sdist's bigbench/benchmark_tasks

`orchestrator eval` fetches on first use by itself; this script does it ahead of time (before a
long eval, or on a machine that will be offline later) and prints where the archive is. The cache
is `${LANEFOLD_CACHE:-~/.cache/lanefold}/bigbench`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lanefold.evaluate._packaged import (  # noqa: E402 - after the path is set
    ARCHIVE_NAME,
    bigbench_cache,
    build_bigbench_archive,
    fetch_bigbench,
)
from lanefold.primitives import LanefoldError  # noqa: E402 - after the path is set


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="DIR",
        help="build from this benchmark_tasks folder instead of downloading",
    )
    parser.add_argument(
        "--cache", type=Path, default=None, help="default: %(default)s ($LANEFOLD_CACHE/bigbench)"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args()
    cache: Path = args.cache or bigbench_cache()
    archive = cache / ARCHIVE_NAME
    if archive.is_file() and not args.force:
        print(f"cached: {archive} ({archive.stat().st_size / 1e6:.0f} MB)")
        return 0
    started = time.monotonic()
    try:
        if args.source is not None:
            cache.mkdir(parents=True, exist_ok=True)
            build_bigbench_archive(args.source, archive)
        else:
            fetch_bigbench(cache)
    except LanefoldError as exc:
        print(f"fetch_bigbench: {exc}", file=sys.stderr)
        return exc.exit_code  # 2 when pip cannot fetch the sdist (no longer served, or offline)
    print(f"wrote {archive} ({archive.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
