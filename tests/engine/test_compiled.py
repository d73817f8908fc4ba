"""What every compiled kernel shares (`_compiled`): numba's cache in the engine's own folder,
stamped with every kernel module's source, and compiling in memory where it cannot be written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("numba")

from lanefold.backends.engine import _compiled


def _double(x: Any) -> Any:
    return x * 2


def test_kernels_are_kept_in_the_engines_cache_folder_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path))
    first = _compiled._jit(_double)
    assert first(21) == 42
    folder = Path(first.stats.cache_path)
    assert folder.parent == tmp_path / "engine" / "numba"  # a folder per installed copy
    assert folder.name.startswith(f"{Path(_compiled.__file__).parent.name}_")
    assert sum(first.stats.cache_misses.values()) == 1
    assert any(p.suffix == ".nbi" for p in folder.iterdir())
    again = _compiled._jit(_double)  # as a later process would find it
    assert again(21) == 42
    assert sum(again.stats.cache_hits.values()) == 1 and not again.stats.cache_misses


def test_an_edit_of_any_kernel_module_recompiles_every_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numba stamps a cached function with its own file only, but a kernel inlines what it calls
    from the other kernel modules: the stamp here is all of their sources together."""
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path))
    assert _compiled._jit(_double)(1) == 2
    monkeypatch.setattr(_compiled, "sources_digest", lambda: "another source of _layers.py")
    edited = _compiled._jit(_double)
    assert edited(1) == 2
    assert sum(edited.stats.cache_misses.values()) == 1 and not edited.stats.cache_hits


def test_the_stamp_covers_every_module_that_compiles_kernels() -> None:
    folder = Path(_compiled.__file__).parent
    compiling = {p.stem for p in folder.glob("*.py") if re.search(r"^\w+ = _jit\(", p.read_text(), re.M)}
    assert compiling == set(_compiled.KERNEL_MODULES)


def test_with_nowhere_to_cache_the_kernels_compile_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder would go: a read-only install's case
    monkeypatch.setenv("LANEFOLD_CACHE", str(blocked))
    made = _compiled._jit(_double)
    assert made(21) == 42
    assert made.stats.cache_path is None  # numba's in-memory "cache"
