"""`orchestrator list` finds runs as the view's search does (issue 42 item 5, issue 41 item 6):
each of the runs page's fields is a flag of the same name, answered by the same `RunSearch`
and so by the same store query, on files and on PostgreSQL (the embedded server); a time that
is not one is a one-line usage error naming its flag."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cli_support import cli
from test_conformance import T0, ended, started, write

from lanefold.cli import main
from lanefold.primitives import RunSummary, Store
from lanefold.view import RunSearch

# (run id, question, answer, model asked for, caller, loop), a minute apart from T0.
RUNS = [
    ("a", "What is 17 * 23?", "391", None, None, "parallel_sample"),
    ("b", "what IS the capital of France?", "Paris", "vote", "alice", "parallel_sample"),
    ("c", "Is 50% of 8 four?", "yes", "vote/gpt-4o-mini", "bob", "parallel_sample"),
    ("d", "snake_case or 50 of them?", "no", "judge", "alice", "debate"),
]

# The flags asked, the view's parameters that ask the same, and the runs both must find.
SEARCHES: list[tuple[list[str], dict[str, str], list[str]]] = [
    (["--question", "what is"], {"question": "what is"}, ["b", "a"]),
    (["--question", "50%"], {"question": "50%"}, ["c"]),  # a % is itself, not a wildcard
    (["--question", "e_c"], {"question": "e_c"}, ["d"]),  # a _ too
    (["--answer", "PAR"], {"answer": "PAR"}, ["b"]),
    (["--model", "vote"], {"model": "vote"}, ["c", "b"]),  # vote/MODEL too
    (["--model", "vote", "--caller", "alice"], {"model": "vote", "caller": "alice"}, ["b"]),
    (["--caller", "alice", "--question", "50"], {"caller": "alice", "question": "50"}, ["d"]),
    (["--loop", "debate"], {"loop": "debate"}, ["d"]),
    (["--status", "answered", "--answer", "o"], {"status": "answered", "answer": "o"}, ["d"]),
    (
        ["--since", "2026-01-01T00:01:00", "--until", "2026-01-01T00:02:00"],
        {"since": "2026-01-01T00:01:00", "until": "2026-01-01T00:02:00"},
        ["c", "b"],
    ),
    (["--until", "2026-01-01"], {"until": "2026-01-01"}, ["a"]),  # a date: its midnight, UTC
    (["--since", "2026-01-01T01:01:00+01:00"], {"since": "2026-01-01T01:01:00+01:00"}, ["d", "c", "b"]),
    (["--question", "nowhere"], {"question": "nowhere"}, []),
]


def _ids(runs: list[RunSummary]) -> list[str]:
    return [s.run_id for s in runs]


@pytest.fixture
def searched(opened: tuple[Store, list[str]]) -> tuple[Store, list[str]]:
    store, flags = opened
    for i, (run_id, question, answer, model, caller, loop) in enumerate(RUNS):
        at = T0 + timedelta(minutes=i)
        first = started(run_id, loop=loop, at=at, question=question, model=model, caller=caller)
        write(store, run_id, [first, ended(run_id, 2, "answered", at, answer=answer)])
    return store, flags


@pytest.mark.parametrize(("asked", "params", "found"), SEARCHES, ids=[" ".join(s[0]) for s in SEARCHES])
def test_list_finds_the_runs_the_views_search_finds(
    searched: tuple[Store, list[str]],
    capsys: pytest.CaptureFixture[str],
    asked: list[str],
    params: dict[str, str],
    found: list[str],
) -> None:
    store, flags = searched
    listed = cli(capsys, "list", *asked, *flags, "--json")
    assert listed.code == 0, listed.err
    assert [json.loads(line)["run_id"] for line in listed.out.splitlines()] == found
    assert _ids(RunSearch.read(params).runs(store, 50)) == found  # the page's search, the same runs
    table = cli(capsys, "list", *asked, *flags)
    assert table.code == 0, table.err
    if not found:
        assert table.out == f"no runs in {store.describe} match\n"
    else:
        rows = [line.split()[0] for line in table.out.splitlines()[1:]]
        assert rows == found


def test_list_limits_what_a_search_finds(
    searched: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    _, flags = searched
    listed = cli(capsys, "list", "--question", "?", "--limit", "2", *flags, "--json")
    assert [json.loads(line)["run_id"] for line in listed.out.splitlines()] == ["d", "c"]


@pytest.mark.parametrize("flag", ["--since", "--until"])
@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "5 minutes", "30x"])
def test_a_time_that_is_not_one_is_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, text: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["list", flag, text, "--runs-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"orchestrator list: error: argument {flag}: {text!r} is not a time "
        "(2026-12-05, 2026-12-05T09:30, or ago: 30m, 2h, 7d) (see orchestrator list --help)"
    ]


class _EarlyStore:
    """A store of one's own written before `list_runs` took model, caller, question, answer
    and until: it knows only the first filters."""

    def __init__(self) -> None:
        self.asked: dict[str, object] = {}

    def list_runs(
        self,
        *,
        status: str | None = None,
        loop: str | None = None,
        eval_id: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
    ) -> list[RunSummary]:
        self.asked = {"status": status, "loop": loop, "eval_id": eval_id, "since": since, "limit": limit}
        return []


def test_a_store_written_before_the_newer_filters_still_lists() -> None:
    early = _EarlyStore()
    assert RunSearch(loop="debate", status="answered").runs(early, 5) == []  # type: ignore[arg-type]
    assert early.asked == {"status": "answered", "loop": "debate", "eval_id": None, "since": None, "limit": 5}
    with pytest.raises(TypeError, match="question"):  # a filter it does not know is not dropped
        RunSearch(question="capital").runs(early, 5)  # type: ignore[arg-type]
