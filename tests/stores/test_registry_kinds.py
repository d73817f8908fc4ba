"""Stores and executors are registry kinds: found by name, scheme or `module:attr`, opened
through the registry, an unknown one refused in one line naming the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import lanefold
from lanefold.execution._executor import resolve_executor
from lanefold.execution._store import open_store
from lanefold.primitives import EXECUTORS, STORES, ConfigError, register_executor, register_store
from lanefold.stores.files import RunStore
from lanefold.stores.postgres import PgStore


@pytest.fixture
def registries() -> Iterator[None]:
    saved = STORES.snapshot(), EXECUTORS.snapshot()
    try:
        yield
    finally:
        STORES.restore(saved[0])
        EXECUTORS.restore(saved[1])


def test_the_built_in_stores_are_registered_with_their_schemes() -> None:
    assert {"files", "postgres"} <= set(STORES.names())
    assert STORES.resolve("files").schemes == ()
    assert set(STORES.resolve("postgres").schemes) == {"postgresql", "postgres"}
    assert lanefold.register_store is register_store
    assert lanefold.register_executor is register_executor


def test_open_store_picks_by_scheme(tmp_path: Path) -> None:
    files = open_store(None, tmp_path)
    assert isinstance(files, RunStore) and files.root == tmp_path
    for url in ("postgresql://u@127.0.0.1/db", "postgres://u@127.0.0.1/db"):
        assert isinstance(open_store(url), PgStore)  # nothing connects until used


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "mysql://u:hunter2@h/db",
            "store.url: no store serves mysql:// URLs (known: postgres://, postgresql://)",
        ),
        ("runs", "store.url: no store serves a value that is not a URL"),
    ],
)
def test_an_unknown_scheme_is_one_line_naming_store_url(url: str, said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        open_store(url)
    assert str(refused.value).startswith(said)
    assert "hunter2" not in str(refused.value) and "\n" not in str(refused.value)


class _Memory(RunStore):
    schemes: ClassVar[tuple[str, ...]] = ("mem",)

    @classmethod
    def from_url(cls, url: str | None, *, runs_dir: Any = "runs", password_env: str | None = None) -> _Memory:
        return cls(Path(runs_dir) / "mem")


def test_a_store_of_your_own_serves_its_scheme(registries: None, tmp_path: Path) -> None:
    register_store("memory")(_Memory)
    opened = open_store("mem://anything", tmp_path)
    assert isinstance(opened, _Memory) and opened.root == tmp_path / "mem"


def test_a_class_that_is_no_store_is_refused_at_registration(registries: None) -> None:
    with pytest.raises(TypeError, match="is not a Store"):
        register_store("nothing")(int)


class _Here:
    name = "here"

    def outcomes(self, spec: Any, jobs: Any, concurrency: int) -> Any:
        raise NotImplementedError


def make_here(*, workers: int = 1) -> _Here:
    return _Here()


def test_executors_resolve_through_the_registry(registries: None) -> None:
    assert resolve_executor(None) is None and resolve_executor("local") is None
    assert EXECUTORS.resolve("ray").__name__ == "RayExecutor"  # imported on first lookup
    register_executor("here")(make_here)
    assert isinstance(resolve_executor("here"), _Here)
    assert isinstance(resolve_executor(f"{__name__}:make_here"), _Here)
    given = _Here()
    assert resolve_executor(given) is given


def test_an_unknown_executor_or_option_is_one_line(registries: None) -> None:
    with pytest.raises(
        ConfigError,
        match=r"^--executor: unknown executor 'dask' \(known: "
        r"local, ray",
    ):
        resolve_executor("dask", key="--executor")
    with pytest.raises(ConfigError, match=r"^--workers: only with --executor ray$"):
        resolve_executor("local", key="--executor", options={"workers": ("--workers", 2)})
    with pytest.raises(ConfigError, match="executor: int has no outcomes"):
        resolve_executor(3)  # type: ignore[arg-type]
