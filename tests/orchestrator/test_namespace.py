"""One import name: `lanefold`. A user's own `backends`/`primitives`/`coordinators` packages do
not shadow ours, `import orchestrator` still works and warns, re-exported names say they are the
facade's, and the version is the installed metadata's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

import lanefold

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_project_with_its_own_backends_primitives_coordinators_runs_a_loop(tmp_path: Path) -> None:
    # An agent project whose own packages carry the generic names ours had before 0.2, first on
    # sys.path (its folder is the working directory, and PYTHONPATH names it too).
    for name in ("backends", "primitives", "coordinators"):
        package = tmp_path / name
        (package / "engine").mkdir(parents=True)
        (package / "__init__.py").write_text(f"MINE = {name!r}\n")
        (package / "engine" / "__init__.py").write_text("raise ImportError('the user's, not ours')\n")
    done = _python(
        """
        import sys
        import backends, primitives, coordinators
        assert (backends.MINE, primitives.MINE, coordinators.MINE) == (
            "backends", "primitives", "coordinators")
        import lanefold
        config = lanefold.parse_config({"loop": {"k": 4, "seed": 3},
                                        "backend": {"kind": "simulated", "accuracy": 1.0}})
        result = lanefold.run_sync(config, "What is 17 * 23?", runs_dir="runs")
        print(result.answer, len(result.lanes))
        assert sys.modules["backends"].MINE == "backends"   # still the user's after ours loaded
        assert "orchestrator" not in sys.modules
    """,
        tmp_path,
        PYTHONPATH=str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["391", "4"]


def test_import_orchestrator_warns_and_names_lanefold() -> None:
    done = _python(
        """
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import orchestrator
        assert [w.category for w in caught] == [DeprecationWarning], caught
        print(caught[0].message)
        import lanefold
        assert orchestrator.parse_config is lanefold.parse_config
        assert orchestrator.RunResult is lanefold.RunResult
    """,
        ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "import lanefold" in done.stdout


def test_lanefold_imports_without_a_warning() -> None:
    done = _python(
        "import lanefold, lanefold.primitives, lanefold.backends, lanefold.coordinators",
        ROOT,
        PYTHONWARNINGS="error",
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", [n for n in lanefold.__all__ if n[0].isupper()])
def test_a_re_exported_class_reports_the_facade_as_its_module(name: str) -> None:
    value = getattr(lanefold, name)
    if isinstance(value, type):
        assert value.__module__ == "lanefold"
        assert getattr(lanefold, value.__qualname__) is value  # pickle finds it there


def test_re_exported_functions_report_the_facade() -> None:
    assert lanefold.run_sync.__module__ == "lanefold"
    assert lanefold.parse_config.__module__ == "lanefold"


def test_the_version_is_the_installed_metadata() -> None:
    assert lanefold.__version__ == metadata.version("lanefold")
    for command in ("orchestrator", "lanefold"):
        done = subprocess.run(
            [str(Path(sys.executable).with_name(command)), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"lanefold {metadata.version('lanefold')}"


def test_the_version_is_written_once() -> None:
    # pyproject.toml holds it; no module spells it out
    version = metadata.version("lanefold")
    spelled = [
        str(path.relative_to(ROOT))
        for folder in ("orchestrator", "primitives", "backends", "coordinators")
        for path in (ROOT / folder).rglob("*.py")
        if f'"{version}"' in path.read_text()
    ]
    assert spelled == []


def test_the_facades_internals_moved_to_primitives_internal_and_warn_where_they_were() -> None:
    import lanefold.primitives as primitives
    from lanefold.primitives import internal

    extenders = set(primitives.__all__)
    assert not extenders & set(internal.__all__)  # extenders are not shown the internals
    with pytest.warns(DeprecationWarning, match=r"lanefold\.primitives\.internal"):
        found = primitives.Dispatcher
    assert found is internal.Dispatcher
    with pytest.raises(AttributeError):
        _ = primitives.NoSuchName
