"""The tree is what ships: real folders, each listed once in pyproject.toml under the name it is
imported by, and nothing of the checkout importable by its folder name from anywhere else.

The design card keeps one folder per layer at the repository's root (`primitives/`,
`backends/`, `coordinators/`, `stores/`, `orchestrator/`); setuptools maps each to its name under
`lanefold` (`[tool.setuptools.package-dir]`), so no symlink is needed and a zip, an sdist or a
checkout made without symlinks builds the same wheel. tests/test_release.py builds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Each folder at the root, and the import name setuptools maps it to.
FOLDERS = {
    "orchestrator": "lanefold",
    "primitives": "lanefold.primitives",
    "backends": "lanefold.backends",
    "coordinators": "lanefold.coordinators",
    "stores": "lanefold.stores",
}
SHIM = "orchestrator"  # the package's name before 0.2: its __init__ and __main__ ship, and warn


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _setuptools() -> dict[str, object]:
    tool = _pyproject()["tool"]
    assert isinstance(tool, dict)
    found = tool["setuptools"]
    assert isinstance(found, dict)
    return found


def tree_packages(root: Path = ROOT) -> dict[str, Path]:
    """Every package in the tree (a folder holding `__init__.py` under one of FOLDERS), by the
    name it is imported by: `backends/engine` -> `lanefold.backends.engine`."""
    found: dict[str, Path] = {}
    for folder, name in FOLDERS.items():
        for init in sorted((root / folder).rglob("__init__.py")):
            inner = init.parent.relative_to(root / folder).parts
            if "__pycache__" in inner:
                continue
            found[".".join((name, *inner))] = init.parent
    return found


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def test_the_repository_holds_no_symlink() -> None:
    # A clone without symlinks (Windows without the right, `core.symlinks=false`) or a zip of
    # the repository turns a link into a text file: `import lanefold` would fail there.
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    links = [
        line.split("\t", 1)[1] for line in _git("ls-files", "-s").splitlines() if line.startswith("120000")
    ]
    assert links == [], "a symlink in the repository: " + ", ".join(links)


def test_no_package_folder_is_a_symlink() -> None:
    links = [
        str(path.relative_to(ROOT))
        for folder in FOLDERS
        for path in [ROOT / folder, *(ROOT / folder).rglob("*")]
        if path.is_symlink()
    ]
    assert links == []


def test_pyproject_maps_each_folder_to_its_name() -> None:
    mapped = _setuptools()["package-dir"]
    assert mapped == {name: folder for folder, name in FOLDERS.items()} | {SHIM: SHIM}


def test_pyproject_lists_every_package_of_the_tree() -> None:
    # A package missing from the list is missing from the wheel; the list is checked here, at
    # the speed of a file read, and the wheel itself in tests/test_release.py.
    listed = _setuptools()["packages"]
    assert isinstance(listed, list)
    assert sorted(set(listed)) == sorted(listed), "a package listed twice"
    expected = {*tree_packages(), SHIM}
    assert set(listed) == expected, (
        f"add {sorted(expected - set(listed))} / remove {sorted(set(listed) - expected)} "
        "in [tool.setuptools] packages of pyproject.toml"
    )


def _python_elsewhere(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """This interpreter run from `cwd`, with nothing on PYTHONPATH: what a user's project sees."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_from_another_folder_only_lanefold_names_our_packages(tmp_path: Path) -> None:
    # The editable install maps each name to its folder; it must not put the checkout's root on
    # sys.path, where `primitives`, `backends`, ... would shadow a user's own packages again.
    done = _python_elsewhere(
        f"""
        import importlib, json, sys
        bare = {sorted({*FOLDERS, "tests", "bench", "scripts", "examples"} - {SHIM})!r}
        found = {{}}
        for name in bare:
            try:
                module = importlib.import_module(name)
            except ImportError:
                continue
            found[name] = getattr(module, "__file__", None) or str(list(module.__path__))
        import lanefold.primitives, lanefold.backends, lanefold.coordinators, lanefold.stores
        print(json.dumps({{"bare": found, "files": {{
            name: sys.modules[name].__file__ for name in {sorted(FOLDERS.values())!r}}}}}))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["bare"] == {}, "importable by a folder's name from another folder"
    for folder, name in FOLDERS.items():
        assert Path(seen["files"][name]) == ROOT / folder / "__init__.py"


def test_python_m_orchestrator_and_lanefold_run_the_command_from_another_folder(tmp_path: Path) -> None:
    for module in ("lanefold", "orchestrator"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--version"],
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("lanefold "), done.stdout


def test_the_installed_entry_points_resolve_to_the_tree() -> None:
    from importlib.metadata import distribution

    points = list(distribution("lanefold").entry_points)
    # the commands only: the built-in plug-ins register by import (tests/test_surface.py)
    assert sorted(point.name for point in points) == ["lanefold", "orchestrator"], (
        "the install's metadata is not pyproject.toml's: reinstall (`make .venv/.dev`)"
    )
    for point in points:
        point.load()
        where = Path(str(sys.modules[point.module].__file__))
        assert where.is_relative_to(ROOT), f"{point.name} loads from {where}"
