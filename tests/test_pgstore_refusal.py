"""tests/test_record_refusal.py on the PostgreSQL store: the same spliced, copied, edited,
forged and inconsistent logs, the same edits of every number and the same fuzzing, with the
runs as rows of `lanefold_events` and every reader (`resume`, `show`, `tail`, `reduce`) given
`--store`. Each refusal is exit 2 and one line naming
`URL#run:sequence` and what is wrong, and leaves the rows as they were.

The file tests run here as they are written, their `read`, `write`, `refused` and `main`
pointed at the database.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest
import test_record_refusal as file_tests
from test_record_refusal import LOOP_RUNS, RUNS, readers, source  # noqa: F401  # the finished runs, as files

from lanefold.cli import main
from lanefold.stores.postgres import PgDatabase, redact_url

pytestmark = pytest.mark.slow
FILE_READ = file_tests.read
Events = list[dict[str, Any]]


class PgRuns:
    """The runs of one database, read and written as the file tests read and write folders."""

    def __init__(self, url: str) -> None:
        self.url = url
        db = PgDatabase(url)
        with db.connect() as conn:
            db.ensure_schema(conn)

    def rows(self, run_id: str) -> list[tuple[int, str]]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(
                "SELECT sequence, body FROM lanefold_events WHERE run_id = %s ORDER BY sequence", (run_id,)
            ).fetchall()

    def read(self, run_id: str) -> Events:
        return [json.loads(body) for _, body in self.rows(run_id)]

    def write(self, run_id: str, events: Events) -> None:
        """The run's rows replaced by `events`, one row each, keyed 1..n as a writer keys them."""
        with psycopg.connect(self.url) as conn:
            conn.execute("DELETE FROM lanefold_events WHERE run_id = %s", (run_id,))
            conn.execute("INSERT INTO lanefold_runs (run_id) VALUES (%s) ON CONFLICT DO NOTHING", (run_id,))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO lanefold_events (run_id, sequence, type, body) VALUES (%s, %s, %s, %s)",
                    [(run_id, i, str(e.get("type")), json.dumps(e)) for i, e in enumerate(events, 1)],
                )

    def argv(self, argv: list[str]) -> list[str]:
        """A file test's command line, with `--runs-dir DIR` become `--store URL`."""
        out = list(argv)
        if "--runs-dir" in out:
            at = out.index("--runs-dir")
            out[at : at + 2] = ["--store", self.url]
        return out

    def refused(
        self, runs: object, run_id: str, capsys: pytest.CaptureFixture[str], line: int, why: str
    ) -> None:
        """`file_tests.refused` for rows: exit 2, one line naming `URL#run:line`, no change."""
        before = self.rows(run_id)
        where = re.escape(f"{redact_url(self.url)}#{run_id}:{line}: ")
        for command in readers(run_id):
            code = main([*command, "--store", self.url, "--json"])
            out, err = capsys.readouterr()
            assert code == 2, (command, out, err)
            assert out == "", command
            assert len(err.splitlines()) == 1 and "Traceback" not in err, err
            assert re.search(rf"{where}.*{why}", err), (command, err)
        assert self.rows(run_id) == before


@pytest.fixture
def pg(pg_url: str, source: Path, monkeypatch: pytest.MonkeyPatch) -> PgRuns:  # noqa: F811
    runs = PgRuns(pg_url)
    for run_id in (*RUNS, *LOOP_RUNS):
        runs.write(run_id, FILE_READ(source, run_id))
    monkeypatch.setattr(
        file_tests,
        "read",
        lambda where, run_id: runs.read(run_id) if isinstance(where, PgRuns) else FILE_READ(where, run_id),
    )
    monkeypatch.setattr(file_tests, "write", lambda where, run_id, events: runs.write(run_id, events))
    monkeypatch.setattr(file_tests, "refused", runs.refused)
    monkeypatch.setattr(file_tests, "main", lambda argv: main(runs.argv(argv)))
    return runs


def test_a_log_spliced_from_two_runs_is_refused(pg: PgRuns, capsys: pytest.CaptureFixture[str]) -> None:
    file_tests.test_a_log_spliced_from_two_runs_is_refused_at_the_first_foreign_line(pg, capsys)


def test_a_copied_run_does_not_pass_for_another_run(pg: PgRuns, capsys: pytest.CaptureFixture[str]) -> None:
    pg.write("copy", pg.read("a"))
    pg.refused(pg, "copy", capsys, 1, "run_id 'a' is not this run's \\('copy'\\)")


def test_an_edited_config_no_longer_matches_its_hash(pg: PgRuns, capsys: pytest.CaptureFixture[str]) -> None:
    file_tests.test_an_edited_config_no_longer_matches_its_hash(pg, capsys)


@pytest.mark.parametrize(("kind", "field", "value", "why"), file_tests.EDITED_FIELDS)
def test_edited_answers_votes_and_results_are_named(
    pg: PgRuns, capsys: pytest.CaptureFixture[str], kind: str, field: str, value: str, why: str
) -> None:
    file_tests.test_edited_answers_votes_and_results_are_named(pg, capsys, kind, field, value, why)


def test_events_that_do_not_follow_from_the_state_are_refused(
    source: Path,  # noqa: F811
    pg: PgRuns,
    capsys: pytest.CaptureFixture[str],
) -> None:
    file_tests.test_events_that_do_not_follow_from_the_state_are_refused(source, pg, capsys)


def test_a_recorded_config_this_version_cannot_validate(
    pg: PgRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    file_tests.test_a_recorded_config_this_version_cannot_validate_names_field_and_version(pg, capsys)


def test_no_mutation_of_the_rows_ever_shows_a_traceback(
    source: Path,  # noqa: F811
    pg: PgRuns,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The file test's fuzzing, each mutated log written to the database and read from it."""
    file_tests.test_no_mutation_of_a_log_ever_shows_a_traceback(source, tmp_path_factory, capsys)


@pytest.mark.parametrize("name", file_tests.FORGERIES)
def test_forgeries_are_refused_at_their_line(
    pg: PgRuns, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    file_tests.test_forgeries_are_refused_at_their_line(pg, capsys, name)


def test_a_re_reduction_by_another_reducer_than_it_opened_is_refused(
    pg: PgRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    file_tests.test_a_re_reduction_by_another_reducer_than_it_opened_is_refused(pg, capsys)


def test_an_edited_number_is_refused_unless_it_is_no_part_of_the_bill(
    source: Path,  # noqa: F811
    pg: PgRuns,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The file test's numeric edits, each edited log written to the database and read there."""
    file_tests.test_an_edited_number_is_refused_unless_it_is_no_part_of_the_bill(
        source, tmp_path_factory, capsys
    )


def test_list_shows_a_runs_last_line_unchecked_and_show_refuses_it(
    pg: PgRuns, capsys: pytest.CaptureFixture[str]
) -> None:
    file_tests.test_list_shows_a_runs_last_line_unchecked_and_show_refuses_it(pg, capsys)


def test_a_re_reductions_vote_edited_is_refused(pg: PgRuns, capsys: pytest.CaptureFixture[str]) -> None:
    file_tests.test_a_re_reductions_vote_edited_is_refused(pg, capsys)
