"""The documentation site builds with warnings as errors, and its API reference holds every
public name, each with a docstring.

`make docs` builds docs/ into site/ with mkdocs (`mkdocs.yml`, strict); these tests build it the
same way into a scratch folder, so a page left out of the nav, a link to no page or no anchor,
or a public name the reference leaves out or cannot read fails `make test`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
DIRECTIVE = re.compile(r"^::: ([\w.]+)$", re.M)
# The namespaces the API reference documents: what a user or an extender imports.
NAMESPACES = (
    "lanefold",
    "lanefold.primitives",
    "lanefold.primitives.events",
    "lanefold.coordinators",
    "lanefold.backends.simulated",
    "lanefold.backends.engine",
    "lanefold.backends.openai",
    "lanefold.stores.files",
    "lanefold.stores.postgres",
)


def mkdocs(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict`, as `make docs` runs it, into `site`."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner, not the build's
        capture_output=True,
        text=True,
        timeout=300,
    )


def documented() -> dict[str, Path]:
    """Each module a reference page renders (`::: module`), and that page."""
    pages = sorted(REFERENCE.glob("*.md"))
    return {module: page for page in pages for module in DIRECTIVE.findall(page.read_text())}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("site")
    built = mkdocs(ROOT / "mkdocs.yml", folder)
    assert built.returncode == 0, built.stdout + built.stderr
    yield folder


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        assert (site / page.relative_to(ROOT / "docs")).with_suffix(".html").is_file(), page


@pytest.mark.slow
def test_the_build_refuses_a_page_left_out_and_a_broken_link(tmp_path: Path) -> None:
    """mkdocs.yml's own strictness, on a scratch folder: each defect is a failed build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[a page](missing.md), [an anchor](#nowhere)\n")
    (docs / "other.md").write_text("# Left out of the nav\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: {docs}\nnav: [index.md]\nplugins: [search]\nhooks: []\n"
    )
    built = mkdocs(config, tmp_path / "site")
    assert built.returncode != 0
    assert "other.md" in built.stderr, built.stderr  # not in the nav
    assert "'missing.md'" in built.stderr, built.stderr  # no such page
    assert "'#nowhere'" in built.stderr, built.stderr  # no such anchor


def test_the_reference_renders_each_public_namespace() -> None:
    assert sorted(documented()) == sorted(NAMESPACES)


@pytest.mark.slow
@pytest.mark.parametrize("module", NAMESPACES)
def test_every_public_name_is_in_the_reference(site: Path, module: str) -> None:
    """Each name in the module's `__all__` has its entry (its anchor) on the module's page."""
    page = documented()[module].relative_to(ROOT / "docs").with_suffix(".html")
    html = (site / page).read_text()
    names = importlib.import_module(module).__all__
    missing = [name for name in names if f'id="{module}.{name}"' not in html]
    assert not missing, f"{page} has no entry for {missing}"


def griffe_tree() -> ModuleType:
    """The mkdocs hook that lays `lanefold` out for griffe (docs/reference/griffe_tree.py)."""
    spec = importlib.util.spec_from_file_location("griffe_tree", REFERENCE / "griffe_tree.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook


def test_the_reference_reads_lanefold_laid_out_as_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """mkdocstrings reads the sources from the hook's tree, set before it makes its handler: the
    code `import lanefold` runs, whatever the folders are called and whatever else is on
    `sys.path` (a folder named `lanefold` in a checkout, another checkout's editable install)."""
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")  # Material sets it on import; this restores it
    from mkdocs.config import load_config

    config = load_config(str(ROOT / "mkdocs.yml"))
    config.plugins.on_startup(command="build", dirty=False)
    try:
        config = config.plugins.on_config(config)
        (tree,) = config.plugins["mkdocstrings"].config.handlers["python"]["paths"]
        handler = config.plugins["mkdocstrings"].get_handler("python")
        for module in ("lanefold", "lanefold.primitives", "lanefold.stores.files"):
            read = handler.collect(module, handler.get_options({}))
            assert Path(tree) in Path(read.filepath).parents, (module, read.filepath)
            source = griffe_tree().folder_of(module) / "__init__.py"
            assert Path(read.filepath).read_text() == source.read_text(), module
    finally:
        config.plugins.on_shutdown()


def test_every_public_name_has_a_docstring(tmp_path: Path) -> None:
    """The reference is the docstrings: a public name without one shows a bare signature.

    Read as the site reads them (griffe, from the source), so a constant's or a type alias's
    docstring (the string after it) counts.
    """
    try:
        import griffe
    except ImportError:
        pytest.fail("griffe is not installed: install the `docs` extra (`make test` does)")
    loader = griffe.GriffeLoader(search_paths=[str(griffe_tree().lay_out(tmp_path).parent)])
    loader.load("lanefold", try_relative_path=False)  # the whole package, each namespace in it
    loader.resolve_aliases(implicit=False, external=None)
    bare = [
        f"{module}.{name}"
        for module in NAMESPACES
        for name in importlib.import_module(module).__all__
        if not getattr(loader.modules_collection[module][name].docstring, "value", "").strip()
    ]
    assert not bare, f"public names without a docstring: {bare}"
