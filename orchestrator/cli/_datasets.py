"""`orchestrator datasets [SOURCE] [--json]`: what `--dataset` can name here.

Without SOURCE, one block per source: how to name it, whether it is here (shipped, installed or
cached: usable with no network) or fetched on first use, and its tasks. With SOURCE, that
source's tasks, one `--dataset` spec a line, ready for a script. Nothing is fetched.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from lanefold.evaluate import SOURCE_NAMES, Source, cache_root, find_source, list_sources

__all__ = ("add_commands", "add_parser", "command")

_SHOWN = 8  # a source with more tasks than this shows a few and a count


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add `datasets` to the `orchestrator` command's subparsers. It reads no runs, so it takes
    none of the common flags but their `--verbose`."""
    p = sub.add_parser("datasets", help="list the dataset sources, which are here, their tasks")
    p.add_argument(
        "source",
        nargs="?",
        choices=SOURCE_NAMES,
        metavar="SOURCE",
        help=f"list this source's tasks, one spec a line ({', '.join(SOURCE_NAMES)})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    p.add_argument("--json", action="store_true", help="print the sources (or SOURCE) as JSON")


def command(args: argparse.Namespace) -> int:
    """Print the sources, or one source's tasks."""
    if args.source is not None:
        source = find_source(args.source)
        if args.json:
            print(json.dumps(source.as_json()))
        elif source.tasks:
            print("\n".join(source.tasks))
        else:
            print(f"orchestrator datasets: {source.name}: {source.status}: {source.about}", file=sys.stderr)
        return 0
    sources = list_sources()
    if args.json:
        print(json.dumps({"cache": str(cache_root()), "sources": [s.as_json() for s in sources]}))
        return 0
    print(f"Datasets for --dataset; fetched ones are kept in {cache_root()}")
    for source in sources:
        print()
        _block(source)
    return 0


def _block(source: Source) -> None:
    print(f"{source.spec}   {source.status}")
    print(f"  {source.about}")
    if source.tasks and len(source.tasks) <= _SHOWN:
        width = max(map(len, source.tasks))
        for task in source.tasks:
            size = source.sizes.get(task)
            print(f"  {task:<{width}}  {size} questions" if size is not None else f"  {task}")
    elif source.tasks:
        print(
            f"  {len(source.tasks)} tasks: {', '.join(source.tasks[:3])}, ... "
            f"(`orchestrator datasets {source.name}` lists them)"
        )
    elif source.where is not None and source.status != "here":
        print(f"  {source.where}")


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Callable[..., None]
) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `datasets` to the CLI's subcommands; its handler by name."""
    add_parser(sub, common)
    return {"datasets": command}
