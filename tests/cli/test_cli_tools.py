"""`orchestrator run --tools FILE [--tool-choice C]` and `reduce` over a tool run (issue 40): the
tools reach the run and its record, a bad tools file is one line naming the place (exit 2,
nothing recorded), and a finished tool run is reduced again by field_vote with the tools it
recorded, the new reduction read back by `show`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import cli, log_events

CONFIG = """
[loop]
coordinator = "parallel_sample"
k = 5
seed = 5

[backend]
kind = "simulated"
answer = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
distractors = ['{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', '{"name": "get_time"}']
accuracy = 0.6
vary_json = true

[extract]
method = "tool_call"
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
                "required": ["city"],
            },
        },
    },
    {"name": "get_time", "parameters": {"type": "object"}},
]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "tools.toml").write_text(CONFIG)
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS, indent=2))
    return tmp_path


def test_run_with_a_tools_file_records_them_and_answers_a_call(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = folder / "runs"
    ran = cli(
        capsys, "run", folder / "tools.toml", "--question", "Weather in Paris?", "--runs-dir", runs,
        "--run-id", "t", "--tools", folder / "tools.json", "--tool-choice", "required", "--json",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    result = ran.json
    assert json.loads(result["answer"])["name"] in ("get_weather", "get_time")
    started = log_events(runs / "t" / "events.jsonl")[0]["data"]
    assert [t["function"]["name"] for t in started["tools"]] == ["get_weather", "get_time"]
    assert started["tool_choice"] == "required"

    again = cli(capsys, "reduce", "t", "--reducer", "field_vote", "--runs-dir", runs, "--json")
    assert again.code == 0, again.err
    fields = log_events(runs / "t" / "events.jsonl")[-1]["data"]["detail"]["fields"]
    assert "name" in fields
    shown = cli(capsys, "show", "t", "--runs-dir", runs)
    assert shown.code == 0 and shown.err == ""


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('[{"name": "f"}\n, oops]', r"tools.json:2:3: not JSON \(Expecting value\)$"),
        ('[{"name": "f"}, {"name": "f"}]', r"tools.json: tools\[1\]: a second tool named 'f'$"),
        (
            json.dumps([{"type": "function", "function": {"name": "f", "parameters": {"required": 3}}}]),
            r"tools.json: tools\[0\]\.function\.parameters\.required: not a JSON Schema",
        ),
        ('{"name": "f"}', r"tools.json: tools: expected a list of tools, got dict$"),
    ],
    ids=["not JSON", "a name twice", "not a schema", "not a list"],
)
def test_a_bad_tools_file_is_one_line_naming_the_place(
    folder: Path, capsys: pytest.CaptureFixture[str], content: str, expected: str
) -> None:
    (folder / "tools.json").write_text(content)
    refused = cli(
        capsys, "run", folder / "tools.toml", "--question", "q", "--runs-dir", folder / "runs",
        "--tools", folder / "tools.json",
    )  # fmt: skip
    assert refused.code == 2, refused
    assert refused.error_line.startswith("orchestrator run: ")
    assert re.search(expected, refused.error_line), refused.error_line
    assert not (folder / "runs").exists() or not any((folder / "runs").iterdir())


def test_a_missing_tools_file_and_a_choice_without_tools_are_refused(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = cli(capsys, "run", folder / "tools.toml", "--question", "q", "--tools", folder / "none.json")
    assert missing.code == 2 and "--tools: cannot read" in missing.error_line
    choice = cli(capsys, "run", folder / "tools.toml", "--question", "q", "--tool-choice", "auto")
    assert choice.code == 2 and "--tool-choice: chooses among the run's tools" in choice.error_line
    none = cli(capsys, "run", folder / "tools.toml", "--question", "q", "--runs-dir", folder / "runs")
    assert none.code == 2 and 'extract.method: "tool_call" reads calls' in none.error_line
