"""`orchestrator datasets`: each source, whether it is here with no network, and its tasks;
from an empty cache and from one holding archives the tests built. It never fetches."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lanefold.cli import main
from lanefold.evaluate._bfcl import WHEEL_NAME as BFCL_WHEEL
from lanefold.evaluate._catalog import SOURCE_NAMES, find_source
from lanefold.evaluate._openai_evals import WHEEL_NAME
from lanefold.evaluate._packaged import ARCHIVE_NAME, build_bigbench_archive, humaneval_file
from lanefold.primitives import ConfigError
from tests.orchestrator.archives import build_bfcl_wheel, build_evals_wheel, tasks_tree

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_FILES = ["1_digit_addition.jsonl", "1_digit_multiplication.jsonl", "2_digit_addition.jsonl"]


@pytest.fixture(autouse=True)
def no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("listing the datasets ran a subprocess")

    monkeypatch.setattr(subprocess, "run", refuse)


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("LANEFOLD_CACHE", str(folder))
    monkeypatch.chdir(ROOT)  # the sample's tasks are shown relative to the working directory
    return folder


def listing(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["datasets", *argv, "--json"]) == 0
    sources: dict[str, Any] = {s["name"]: s for s in json.loads(capsys.readouterr().out)["sources"]}
    return sources


def test_an_empty_cache_lists_the_sample_as_here_and_the_archives_as_not_cached(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = listing(capsys)
    assert list(sources) == list(SOURCE_NAMES)
    sample = sources["sample"]
    assert (sample["status"], sample["available"]) == ("here", True)
    assert sample["tasks"] == [f"examples/datasets/arithmetic/{name}" for name in SAMPLE_FILES]
    assert set(sample["sizes"].values()) == {100}
    for name in ("bigbench", "openai-evals", "bfcl"):
        assert (sources[name]["status"], sources[name]["available"], sources[name]["tasks"]) == (
            "not cached",
            False,
            [],
        )
        assert sources[name]["where"].startswith(str(cache / name))
    assert sources["humaneval"]["available"] == (humaneval_file() is not None)
    assert not cache.exists()  # listing writes nothing


def test_cached_archives_list_their_tasks(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (cache / "bigbench").mkdir(parents=True)
    build_bigbench_archive(tasks_tree(tmp_path / "tasks"), cache / "bigbench" / ARCHIVE_NAME)
    build_evals_wheel(cache / "openai-evals" / WHEEL_NAME)
    sources = listing(capsys)
    assert sources["bigbench"]["status"] == sources["openai-evals"]["status"] == "cached"
    assert sources["bigbench"]["tasks"] == [
        "bigbench:arithmetic",
        "bigbench:arithmetic/1_digit_addition",
        "bigbench:arithmetic/1_digit_subtraction",
        "bigbench:colours",
    ]
    # eval names whose samples the wheel holds; not those reading elsewhere or a missing file
    assert sources["openai-evals"]["tasks"] == ["openai-evals:graded", "openai-evals:sums"]

    assert main(["datasets", "openai-evals"]) == 0  # one spec a line, for a script
    assert capsys.readouterr().out == "openai-evals:graded\nopenai-evals:sums\n"


def test_a_cached_bfcl_wheel_lists_its_one_call_categories_with_their_sizes(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_bfcl_wheel(cache / "bfcl" / BFCL_WHEEL)
    source = listing(capsys)["bfcl"]
    assert (source["status"], source["available"]) == ("cached", True)
    assert source["tasks"] == ["bfcl:simple_python", "bfcl:multiple", "bfcl:live_simple"]
    assert source["sizes"] == {"bfcl:simple_python": 8, "bfcl:multiple": 3, "bfcl:live_simple": 2}
    assert main(["datasets", "bfcl"]) == 0
    assert capsys.readouterr().out == "bfcl:simple_python\nbfcl:multiple\nbfcl:live_simple\n"


def test_a_damaged_archive_is_listed_as_such(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (cache / "openai-evals").mkdir(parents=True)
    (cache / "openai-evals" / WHEEL_NAME).write_bytes(b"cut short")
    source = listing(capsys)["openai-evals"]
    assert (source["status"], source["available"]) == ("damaged", False)
    assert "delete it to fetch again" in source["about"]


def test_the_table_names_every_source_and_how_to_see_all_tasks(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build_evals_wheel(cache / "openai-evals" / WHEEL_NAME)
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Datasets for --dataset; fetched ones are kept in {cache}\n")
    for header in (
        "PATH.jsonl | PATH.csv   here",
        "bigbench:<task>   not cached",
        "openai-evals:<name>   cached",
        "examples/datasets/arithmetic/<task>.jsonl   here",
    ):
        assert f"\n{header}\n" in out
    assert "  examples/datasets/arithmetic/2_digit_addition.jsonl        100 questions\n" in out
    assert "openai-evals:graded\n" in out  # two tasks: listed in full


def test_a_source_without_known_tasks_says_why_on_stderr(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["datasets", "bigbench"]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("orchestrator datasets: bigbench: not cached: ")


def test_an_unknown_source_is_a_config_error_naming_them() -> None:
    with pytest.raises(
        ConfigError, match="name one of file, sample, bigbench, openai-evals, bfcl, humaneval"
    ):
        find_source("hf")
