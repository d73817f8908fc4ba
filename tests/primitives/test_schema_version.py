"""The event-schema version in the envelope (`schemaversion`, a CloudEvents extension attribute).

Every new event carries the version it was written in. A log written before the envelope
carried one still reads, folds, resumes and is refused where it was: the whole refusal suite
runs here on the same runs with the field taken off every line. A line claiming a newer schema
than this library reads is refused by every reader with one line naming it, exit 2, and the log
is left as it was: on the JSONL log here, on the PostgreSQL log in `test_pgstore_refusal`'s way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import test_record_refusal as file_tests
from test_record_refusal import RUNS, read, refused, source, write  # noqa: F401  # the runs

from lanefold.cli import main
from lanefold.primitives import LogCorruptError, LogTooNewError, read_event
from lanefold.primitives.events import SCHEMA_VERSION, newer_schema, parse_event

Events = list[dict[str, Any]]
NEWER = f"written by a newer lanefold: schema {SCHEMA_VERSION + 1}, this reads up to {SCHEMA_VERSION}"


def unversion(events: Events) -> Events:
    """The events as a lanefold before `schemaversion` wrote them."""
    return [{key: value for key, value in event.items() if key != "schemaversion"} for event in events]


@pytest.fixture(scope="module")
def unversioned(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """The refusal suite's finished runs, every line without `schemaversion`."""
    runs = tmp_path_factory.mktemp("unversioned") / "runs"
    shutil.copytree(source, runs)
    for run_id in RUNS:
        write(runs, run_id, unversion(read(runs, run_id)))
    return runs


@pytest.fixture
def runs(unversioned: Path, tmp_path: Path) -> Path:
    shutil.copytree(unversioned, tmp_path / "runs")
    return tmp_path / "runs"


# -- written on every new event --------------------------------------------------------------------


def test_every_new_event_carries_the_schema_it_was_written_in(source: Path) -> None:  # noqa: F811
    for run_id in RUNS:
        events = read(source, run_id)
        assert events and all(e["schemaversion"] == SCHEMA_VERSION for e in events), run_id


def test_a_line_without_it_reads_as_the_first_schema() -> None:
    [line] = unversion([json.loads(_line())])
    assert parse_event(json.dumps(line)).schemaversion == 1


def _line(**changes: Any) -> str:
    event = {
        "specversion": "1.0",
        "schemaversion": SCHEMA_VERSION,
        "id": "r:1",
        "source": "lanefold:run/r",
        "type": "wave.barrier",
        "time": "2026-12-05T08:00:00Z",
        "sequence": 1,
        "run_id": "r",
        "wave": 1,
        "data": {"completed": [0], "failed": []},
    }
    return json.dumps({**event, **changes})


# -- a log written before it ----------------------------------------------------------------------


def test_a_log_without_it_shows_the_same_result(
    source: Path,  # noqa: F811
    runs: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    shown = {}
    for where in (source, runs):
        assert main(["show", "a", "--runs-dir", str(where), "--json"]) == 0
        shown[where] = json.loads(capsys.readouterr().out)
    assert shown[source] == shown[runs]


def test_a_log_without_it_resumes_and_goes_on_with_it(
    source: Path,  # noqa: F811
    runs: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = read(runs, "a")
    cut = next(i for i, e in enumerate(events) if e["type"] == "lane.completed") + 2
    write(runs, "a", events[:cut])  # crashed mid-wave, written by the older lanefold
    assert main(["resume", "a", "--runs-dir", str(runs), "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert main(["show", "a", "--runs-dir", str(source), "--json"]) == 0
    assert resumed["answer"] == json.loads(capsys.readouterr().out)["answer"]
    after = read(runs, "a")
    assert all("schemaversion" not in e for e in after[:cut])
    assert all(e["schemaversion"] == SCHEMA_VERSION for e in after[cut:])
    assert main(["show", "a", "--runs-dir", str(runs), "--json"]) == 0  # the mixed log reads
    capsys.readouterr()


def test_spliced_logs_without_it_are_refused(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file_tests.test_a_log_spliced_from_two_runs_is_refused_at_the_first_foreign_line(runs, capsys)
    file_tests.test_a_copied_run_folder_does_not_pass_for_another_run(runs, capsys)


def test_an_edited_config_without_it_is_refused(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file_tests.test_an_edited_config_no_longer_matches_its_hash(runs, capsys)


@pytest.mark.parametrize(("kind", "field", "value", "why"), file_tests.EDITED_FIELDS)
def test_edited_outcomes_without_it_are_named(
    runs: Path, capsys: pytest.CaptureFixture[str], kind: str, field: str, value: str, why: str
) -> None:
    file_tests.test_edited_answers_votes_and_results_are_named(runs, capsys, kind, field, value, why)


def test_events_without_it_that_do_not_follow_are_refused(
    unversioned: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file_tests.test_events_that_do_not_follow_from_the_state_are_refused(unversioned, runs, capsys)


@pytest.mark.parametrize("name", file_tests.FORGERIES)
def test_forgeries_without_it_are_refused(runs: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    file_tests.test_forgeries_are_refused_at_their_line(runs, capsys, name)


def test_a_re_reduction_without_it_by_another_reducer_is_refused(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file_tests.test_a_re_reduction_by_another_reducer_than_it_opened_is_refused(runs, capsys)


def test_edited_numbers_without_it_are_refused(
    unversioned: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    file_tests.test_an_edited_number_is_refused_unless_it_is_no_part_of_the_bill(
        unversioned, tmp_path_factory, capsys
    )


# -- a log written by a newer lanefold ----------------------------------------------------------


@pytest.mark.parametrize("at", [0, 5, -1])
def test_a_line_of_a_newer_schema_is_refused_naming_it(
    source: Path,  # noqa: F811
    runs: Path,
    capsys: pytest.CaptureFixture[str],
    at: int,
) -> None:
    events = read(source, "a")
    events[at]["schemaversion"] = SCHEMA_VERSION + 1
    write(runs, "a", events)
    refused(runs, "a", capsys, events[at]["sequence"], NEWER)


def test_what_a_newer_schema_adds_is_not_taken_for_corruption(
    source: Path,  # noqa: F811
    runs: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A newer line's unknown type and fields fail the models first: the version is the news."""
    events = read(source, "a")
    newer = {**events[4], "schemaversion": SCHEMA_VERSION + 1, "type": "lane.paused", "priority": 3}
    write(runs, "a", [*events[:4], newer, *events[5:]])
    refused(runs, "a", capsys, 5, NEWER)


def test_read_event_tells_a_newer_line_from_a_corrupt_one() -> None:
    with pytest.raises(LogTooNewError) as newer:
        read_event(_line(schemaversion=SCHEMA_VERSION + 7, extra=1), "log", 3)
    assert str(newer.value) == (
        f"log:3: written by a newer lanefold: schema {SCHEMA_VERSION + 7}, this reads up to {SCHEMA_VERSION}"
    )
    assert newer.value.line == 3 and newer.value.exit_code == 2
    assert isinstance(newer.value, LogCorruptError)  # every reader's refusal, as before
    for wrong in (0, -1, "2", 2.0, True, None, "1", 1.0):  # an integer, as JSON writes it
        with pytest.raises(LogCorruptError, match=r"^log:3: corrupt event log line: ") as bad:
            read_event(_line(schemaversion=wrong), "log", 3)
        assert not isinstance(bad.value, LogTooNewError), wrong
    assert read_event(_line(), "log", 1).schemaversion == SCHEMA_VERSION


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"{",
        b"[2]",
        b'"x"',
        b"3",
        b'{"schemaversion": 1}',
        b'{"schemaversion": true}',
        b'{"schemaversion": 9.0}',
    ],
)
def test_newer_schema_is_none_unless_a_line_claims_a_newer_integer(line: bytes) -> None:
    assert newer_schema(line) is None


@pytest.mark.slow  # a PostgreSQL server, as test_pgstore_refusal's
def test_a_row_of_a_newer_schema_is_refused_by_the_postgresql_log(
    source: Path,  # noqa: F811
    pg_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from test_pgstore_refusal import PgRuns

    pg = PgRuns(pg_url)
    events = read(source, "a")
    events[6]["schemaversion"] = SCHEMA_VERSION + 1
    pg.write("a", events)
    pg.refused(pg, "a", capsys, 7, NEWER)
