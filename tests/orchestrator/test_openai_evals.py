"""`openai-evals:<name>`: OpenAI's evals registry read from a cached wheel, never installed. The
wheel here is built by the test in the real layout (`archives.build_evals_wheel`) and the fetch
runs a stand-in for pip; the real download is `tests/integration/test_dataset_fetch.py`'s."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lanefold.evaluate import load_dataset
from lanefold.evaluate._openai_evals import (
    WHEEL_NAME,
    fetch_openai_evals,
    load_openai_evals,
    openai_evals_cache,
)
from lanefold.primitives import ConfigError, LanefoldError
from tests.orchestrator.archives import SYSTEM, build_evals_wheel

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OTHERS = (
    "without it, use the shipped sample examples/datasets/arithmetic/*.jsonl, "
    "bigbench:<task>, bfcl:<category>, humaneval or a .jsonl or .csv file of your own "
    "(`orchestrator datasets` lists them)"
)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return build_evals_wheel(tmp_path / "cache" / WHEEL_NAME).parent


def test_a_set_maps_input_to_the_question_and_ideal_to_every_acceptable_answer(cache: Path) -> None:
    items = load_openai_evals("sums", cache_dir=cache)
    assert [(i.index, i.question, i.answer) for i in items] == [
        (0, f"{SYSTEM}\n\n2 + 2 =", "4"),
        (1, "What is 3 plus 4?", "7"),
        (2, f"{SYSTEM}\n\n1 + 2 =\n\n3\n\n5 + 5 =", "10"),  # a few-shot example's turns, as text
    ]
    assert items[0].meta["answers"] == ["4", "four"]
    assert items[0].meta["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "2 + 2 ="},
    ]
    assert items[1].meta["messages"] == [{"role": "user", "content": "What is 3 plus 4?"}]
    assert items[1].meta["source"] == "hand-written"  # a sample's other fields travel with it
    assert items[2].meta["answers"] == ["10"]  # a number, as JSON writes it
    assert (items[0].meta["task"], items[0].meta["file"]) == ("sums", "sums/samples.jsonl")
    assert items[2].source == f"{WHEEL_NAME}:evals/registry/data/sums/samples.jsonl:6"


@pytest.mark.parametrize("name", ["sums/samples.jsonl", "sums.test.v1", " /sums/ "])
def test_a_data_path_or_a_spec_id_names_the_same_samples(cache: Path, name: str) -> None:
    by_name = load_openai_evals("sums", cache_dir=cache)
    items = load_openai_evals(name, cache_dir=cache)
    assert [(i.question, i.answer, i.source) for i in items] == [
        (i.question, i.answer, i.source) for i in by_name
    ]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("sum", "--dataset: no OpenAI evals set 'sum' (e.g. sums)"),
        ("sums/sample.jsonl", "--dataset: no OpenAI evals set 'sums/sample.jsonl' (e.g. sums/samples.jsonl)"),
        (
            "../evals/registry/data/sums/samples.jsonl",
            "--dataset: no OpenAI evals set '../evals/registry/data/sums/samples.jsonl' "
            "(e.g. sums/samples.jsonl)",
        ),
        ("zzzzzz", "--dataset: no OpenAI evals set 'zzzzzz' (e.g. arithmetic-expression)"),
        ("broken", "--dataset: no OpenAI evals set 'broken' (e.g. arithmetic-expression)"),
        (
            "hub-set",
            "--dataset openai-evals:hub-set: the eval 'hub-set' reads no samples from the "
            "registry (its data comes from elsewhere); name another",
        ),
        (
            "missing-file",
            "--dataset openai-evals:missing-file: the eval 'missing-file' reads "
            f"nowhere/samples.jsonl, which the {WHEEL_NAME} wheel does not hold",
        ),
        (
            "graded",
            "--dataset openai-evals:graded: none of the 2 samples of graded/samples.jsonl has "
            "an 'ideal' answer to score against (model-graded sets and few-shot files have "
            "none); choose another",
        ),
    ],
)
def test_a_name_that_cannot_be_scored_is_one_config_error(cache: Path, name: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_openai_evals(name, cache_dir=cache)
    assert str(caught.value) == message
    assert caught.value.exit_code == 2


def test_the_cache_follows_lanefold_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path))
    assert openai_evals_cache() == tmp_path / "openai-evals"
    monkeypatch.delenv("LANEFOLD_CACHE")
    assert openai_evals_cache() == Path.home() / ".cache" / "lanefold" / "openai-evals"


def fake_pip(wheel: bool, output: str = "") -> Any:
    """Stands in for `pip download --no-deps evals==3.0.1.post1 -d DIR`: writes the wheel into
    DIR and exits 0, or prints `output` and exits 1 as pip does when it finds nothing."""

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        assert argv[1:5] == ["-m", "pip", "download", "--no-deps"], argv
        assert "evals==3.0.1.post1" in argv and "--only-binary=:all:" in argv
        kwargs["stdout"].write(output.encode())
        if wheel:
            build_evals_wheel(Path(argv[argv.index("-d") + 1]) / WHEEL_NAME)
        return subprocess.CompletedProcess(argv, 0 if wheel else 1)

    return run


def test_the_first_load_fetches_the_wheel_once_and_keeps_it_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(wheel=True))
    cache = tmp_path / "cache"
    assert [i.answer for i in load_openai_evals("sums", cache_dir=cache)] == ["4", "7", "10"]
    assert sorted(p.name for p in cache.iterdir()) == [WHEEL_NAME, "fetch.log"]

    def no_pip(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fetched twice")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert len(load_openai_evals("sums/samples.jsonl", cache_dir=cache)) == 3


OFFLINE = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, "
    "status=None)) after connection broken by 'NameResolutionError(\"HTTPSConnection("
    "host='pypi.org', port=443): Failed to resolve 'pypi.org' ([Errno -3] Temporary failure "
    "in name resolution)\")': /simple/evals/\nERROR: Could not find a version that satisfies "
    "the requirement evals==3.0.1.post1 (from versions: none)\nERROR: No matching "
    "distribution found for evals==3.0.1.post1\n"
)


def test_a_failed_fetch_is_one_line_naming_the_other_sources_and_leaves_no_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(wheel=False, output=OFFLINE))
    with pytest.raises(ConfigError) as caught:
        load_openai_evals("sums", cache_dir=tmp_path)
    assert str(caught.value) == (
        "--dataset openai-evals:sums: pip could not reach the package index to fetch "
        f"evals==3.0.1.post1 (no network?; pip's log: {tmp_path / 'fetch.log'}); {OTHERS}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fetch.log"]


def test_fetching_ahead_of_time_returns_the_wheel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(wheel=True))
    assert fetch_openai_evals(tmp_path / "c") == tmp_path / "c" / WHEEL_NAME


def test_a_damaged_wheel_is_named_with_the_way_out(tmp_path: Path) -> None:
    (tmp_path / WHEEL_NAME).write_bytes(b"not a zip")
    with pytest.raises(LanefoldError, match="delete it to fetch again"):
        load_openai_evals("sums", cache_dir=tmp_path)


def test_load_dataset_reads_the_spec_and_refuses_field_names(cache: Path) -> None:
    items = load_dataset("openai-evals:sums", limit=2, cache_dir=cache)
    assert [i.answer for i in items] == ["4", "7"]
    with pytest.raises(ConfigError, match=r"--question-field: applies to JSONL and CSV files"):
        load_dataset("openai-evals:sums", question_field="input", cache_dir=cache)


def test_an_eval_runs_on_a_cached_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    build_evals_wheel(tmp_path / "cache" / "openai-evals" / WHEEL_NAME)
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path / "cache"))
    code = main(
        [
            "eval",
            str(EXAMPLES / "simulated.toml"),
            "--dataset",
            "openai-evals:sums",
            "--eval-id",
            "oe",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["n"] == 3
    manifest = json.loads((tmp_path / "runs" / "oe" / "eval.json").read_text())
    assert manifest["dataset"] == "openai-evals:sums"
