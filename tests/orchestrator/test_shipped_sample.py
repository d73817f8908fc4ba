"""The arithmetic sample shipped in `examples/datasets/arithmetic/`: exactly what its script
writes, right answers, and the README's eval and compare commands pointing at it."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path
from types import ModuleType

import pytest

from lanefold.evaluate import load_dataset

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "datasets" / "arithmetic"
QUESTION = re.compile(r"What is (\d+) (plus|times) (\d+)\?")


def script() -> ModuleType:
    """scripts/make_arithmetic_sample.py, loaded as a module (it writes only from main())."""
    spec = importlib.util.spec_from_file_location(
        "make_arithmetic_sample", ROOT / "scripts" / "make_arithmetic_sample.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_files_are_exactly_what_the_script_writes() -> None:
    made = script()
    tasks = made.tasks()
    assert sorted(tasks) == sorted(p.name for p in SAMPLE.iterdir())
    for name, rows in tasks.items():
        assert (SAMPLE / name).read_text(encoding="utf-8") == made.render(rows), (
            f"{name} drifted: run python scripts/make_arithmetic_sample.py"
        )
    assert made.main(["--check"]) == 0


@pytest.mark.parametrize(
    ("name", "word", "digits"),
    [
        ("1_digit_addition.jsonl", "plus", range(10)),
        ("1_digit_multiplication.jsonl", "times", range(10)),
        ("2_digit_addition.jsonl", "plus", range(10, 100)),
    ],
)
def test_each_file_loads_with_right_answers(name: str, word: str, digits: range) -> None:
    items = load_dataset(str(SAMPLE / name))
    pairs = []
    for item in items:
        match = QUESTION.fullmatch(item.question)
        assert match is not None and match[2] == word, item.question
        a, b = int(match[1]), int(match[3])
        assert a in digits and b in digits
        assert item.answer == str(a + b if word == "plus" else a * b)
        pairs.append((a, b))
    assert len(items) == 100 and len(set(pairs)) == 100  # 1 digit: every pair once
    assert pairs != sorted(pairs)  # shuffled, so --limit draws a spread


def test_the_sample_evals_offline_on_the_simulated_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    code = main(
        [
            "eval",
            str(ROOT / "examples" / "simulated.toml"),
            "--dataset",
            str(SAMPLE / "1_digit_multiplication.jsonl"),
            "--limit",
            "5",
            "--runs-dir",
            str(tmp_path),
            "--json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["n"] == 5


def readme_commands(command: str) -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    return [
        shlex.split(line.split("#")[0])
        for line in text.splitlines()
        if line.startswith(f".venv/bin/orchestrator {command} ")
    ]


@pytest.mark.parametrize("command", ["eval", "compare"])
def test_the_readmes_commands_read_the_shipped_sample(command: str) -> None:
    """Each README line of the command names a dataset that ships (no network, no fetch), and
    the first line's configs are the repository's examples, so it runs as pasted."""
    lines = readme_commands(command)
    assert lines
    for argv in lines:
        dataset = argv[argv.index("--dataset") + 1]
        assert (ROOT / dataset).is_file() and Path(dataset).parent == Path("examples/datasets/arithmetic"), (
            argv
        )
    configs = [arg for arg in lines[0][2:] if arg.endswith(".toml")]
    assert configs and all((ROOT / config).is_file() for config in configs)


def test_the_readmes_curve_reads_the_readmes_eval() -> None:
    (evaluate,) = [argv for argv in readme_commands("eval") if "--eval-id" in argv]
    (curve,) = readme_commands("curve")
    assert curve[2] == evaluate[evaluate.index("--eval-id") + 1]
