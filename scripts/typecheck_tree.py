"""Lay out `build/typecheck/lanefold/` for mypy: links to the folders pyproject.toml maps.

    python scripts/typecheck_tree.py        # (re)make it; `make lint`, `make test` run it first

The design card keeps one folder per layer at the repository's root, and setuptools maps each to
its name under `lanefold` (`[tool.setuptools.package-dir]`). The editable install does the same
at run time with an import hook, which mypy does not run (it finds packages by their folders):
mypy reads `lanefold` from this tree instead (`mypy_path` in pyproject.toml). The tree is made of
links to the folders, not copies, so a module written later is seen without running this again;
it is rebuilt from pyproject.toml each time, so it never drifts from the mapping the wheel uses.
It lives under `build/` (ignored by git, ruff and pytest) and is never committed.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
TOP = "lanefold"


def mapping(root: Path = ROOT) -> dict[str, Path]:
    """Each package under `lanefold` that pyproject.toml maps to a folder, with that folder."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    mapped = config["tool"]["setuptools"]["package-dir"]
    return {
        name: root / folder for name, folder in mapped.items() if name == TOP or name.startswith(f"{TOP}.")
    }


def lay_out(tree: Path = TREE, root: Path = ROOT) -> Path:
    """Make `tree/lanefold` anew: a package holding another mapped package is a folder of links
    to its own entries, with the inner one linked in; any other is one link to its folder."""
    packages = mapping(root)
    shutil.rmtree(tree, ignore_errors=True)
    for name in sorted(packages, key=lambda n: n.count(".")):
        folder, place = packages[name], tree.joinpath(*name.split("."))
        inner = [other for other in packages if other.startswith(f"{name}.")]
        if not inner:
            place.symlink_to(folder, target_is_directory=True)
            continue
        place.mkdir(parents=True)
        taken = {other.split(".")[name.count(".") + 1] for other in inner}
        for entry in sorted(folder.iterdir()):
            if entry.name not in taken and entry.name != "__pycache__":
                (place / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return tree / TOP


def main() -> int:
    try:
        made = lay_out()
    except OSError as error:  # a file system without symlinks (Windows without the right)
        print(f"scripts/typecheck_tree.py: cannot link into {TREE}: {error}", file=sys.stderr)
        return 1
    print(f"mypy reads lanefold from {made.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
