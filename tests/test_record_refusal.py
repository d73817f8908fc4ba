"""A record that refuses what is not its own: spliced, copied, edited or inconsistent logs.

Each refusal is exit 2 and one line naming `file:line` and what is wrong, from `resume`,
`show` and `tail` alike, and never changes the log. A Hypothesis test mutates logs at random
and checks that no traceback (KeyError, pydantic ValidationError, ...) ever reaches the user.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._cli import main
from primitives import hash_config

CONFIG = """
[loop]
k = 6
seed = 3
min_quorum = 2

[backend]
kind = "simulated"
accuracy = 0.6

[pricing]
input_per_mtok = 1.0
output_per_mtok = 2.0
"""
COMMANDS = ("resume", "show", "tail")
Events = list[dict[str, Any]]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished runs, `a` and `b` (other questions), in one runs dir."""
    root = tmp_path_factory.mktemp("refusal")
    config = root / "loop.toml"
    config.write_text(CONFIG)
    for run_id, question in (("a", "17 * 23?"), ("b", "What is 6 * 7?")):
        assert main(["run", str(config), "--question", question, "--runs-dir", str(root / "runs"),
                     "--run-id", run_id, "--json"]) == 0
    return root / "runs"


@pytest.fixture
def runs(source: Path, tmp_path: Path) -> Path:
    shutil.copytree(source, tmp_path / "runs")
    return tmp_path / "runs"


def read(runs: Path, run_id: str) -> Events:
    return [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]


def write(runs: Path, run_id: str, events: Events) -> Path:
    path = runs / run_id / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def renumber(events: Events) -> Events:
    """Sequences 1..n and ids to match, as an editor who knew the format would leave them."""
    for i, event in enumerate(events, 1):
        event["sequence"], event["id"] = i, f"{event['run_id']}:{i}"
    return events


def refused(runs: Path, run_id: str, capsys: pytest.CaptureFixture[str], line: int,
            why: str) -> None:
    """Every reader refuses the log with exit 2 and one line naming `line`; nothing changes."""
    path = runs / run_id / "events.jsonl"
    before = path.read_bytes()
    for command in COMMANDS:
        code = main([command, run_id, "--runs-dir", str(runs), "--json"])
        out, err = capsys.readouterr()
        assert code == 2, (command, out, err)
        assert out == "", command
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert re.search(rf"events\.jsonl:{line}: .*{why}", err), (command, err)
    assert path.read_bytes() == before


def test_a_log_spliced_from_two_runs_is_refused_at_the_first_foreign_line(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = read(runs, "a"), read(runs, "b")
    write(runs, "a", a[:8] + b[8:])  # a crashed run "continued" with another run's lines
    refused(runs, "a", capsys, 9, "run_id 'b' is not this run's")


def test_a_copied_run_folder_does_not_pass_for_another_run(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(runs / "a", runs / "copy")
    refused(runs, "copy", capsys, 1, "run_id 'a' is not this run's \\('copy'\\)")


def test_an_edited_config_no_longer_matches_its_hash(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read(runs, "a")
    events[0]["data"]["config"]["loop"]["k"] = 3
    write(runs, "a", events)
    refused(runs, "a", capsys, 1, "config_hash")


# (event type, field, forged value, what the refusal says): a field of an outcome edited
EDITED_FIELDS = [
    ("lane.completed", "answer", "999", "is not what the extractor finds"),
    ("reduce.completed", "winner", "999", "does not follow from the lanes' answers"),
    ("run.completed", "answer", "999", "run.completed says answer"),
]


def edit_first(events: Events, kind: str, change: Callable[[dict[str, Any]], None]) -> int:
    event = next(e for e in events if e["type"] == kind)
    change(event)
    return int(event["sequence"])


@pytest.mark.parametrize(("kind", "field", "value", "why"), EDITED_FIELDS)
def test_edited_answers_votes_and_results_are_named(
        runs: Path, capsys: pytest.CaptureFixture[str], kind: str, field: str, value: str,
        why: str) -> None:
    events = read(runs, "a")
    target = "result" if kind == "run.completed" else None

    def change(event: dict[str, Any]) -> None:
        (event["data"][target] if target else event["data"])[field] = value

    line = edit_first(events, kind, change)
    write(runs, "a", events)
    refused(runs, "a", capsys, line, why)


def test_events_that_do_not_follow_from_the_state_are_refused(
        source: Path, runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read(source, "a")
    line = edit_first(events, "lane.completed", lambda e: e.update(wave=7))
    write(runs, "a", events)
    refused(runs, "a", capsys, line, "wave 7, which was never started")

    events = read(source, "a")
    first = next(i for i, e in enumerate(events) if e["type"] == "lane.dispatched")
    lane = events[first]["lane"]
    del events[first]  # a completion without a dispatch
    write(runs, "a", renumber(events))
    landed = next(e for e in events if e["type"] == "lane.completed" and e["lane"] == lane)
    refused(runs, "a", capsys, landed["sequence"], "without a dispatch")

    events = read(source, "a")
    at = next(i for i, e in enumerate(events) if e["type"] == "lane.completed")
    events.insert(at + 1, json.loads(json.dumps(events[at])))  # the same lane completes twice
    write(runs, "a", renumber(events))
    refused(runs, "a", capsys, at + 2, "without a dispatch \\(the lane is completed\\)")


def test_a_recorded_config_this_version_cannot_validate_names_field_and_version(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read(runs, "a")
    started = events[0]["data"]
    started["config"]["loop"]["k"] = 0
    started["config_hash"] = hash_config(started["config"])  # a consistent log, from elsewhere
    started["library_version"] = "0.0.9"
    write(runs, "a", events)
    for command in ("resume", "show"):
        assert main([command, "a", "--runs-dir", str(runs)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1
        assert "loop.k" in err and "0.0.9" in err, err


MUTATIONS = ("delete", "duplicate", "swap", "field")
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 30), st.text(max_size=5),
                   st.lists(st.integers(0, 3), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                          st.integers(), max_size=2))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutation=st.sampled_from(MUTATIONS), at=st.integers(0, 40), other=st.integers(0, 40),
       path=st.lists(st.sampled_from(["data", "wave", "lane", "attempt", "type", "answer",
                                      "text", "usage", "seed", "k", "config", "result",
                                      "in_flight", "votes", "completed"]),
                     min_size=1, max_size=3),
       value=VALUES, cut=st.booleans())
def test_no_mutation_of_a_log_ever_shows_a_traceback(
        source: Path, tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str], mutation: str, at: int, other: int,
        path: list[str], value: object, cut: bool) -> None:
    runs = tmp_path_factory.mktemp("fuzz") / "runs"
    shutil.copytree(source, runs)
    events = read(runs, "a")
    if cut:
        events = events[:len(events) // 2]  # an unfinished run: resume has work to do
    at, other = at % len(events), other % len(events)
    if mutation == "delete":
        del events[at]
    elif mutation == "duplicate":
        events.insert(at, json.loads(json.dumps(events[at])))
    elif mutation == "swap":
        events[at], events[other] = events[other], events[at]
    else:
        node: Any = events[at]
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = value
    write(runs, "a", events)
    for command in COMMANDS:
        # Any exception other than the library's own escapes main() and fails the test.
        code = main([command, "a", "--runs-dir", str(runs), "--json"])
        _, err = capsys.readouterr()
        assert code in (0, 1, 2, 3, 4), (command, code)
        assert "Traceback" not in err and len(err.splitlines()) <= 1, (command, err)
