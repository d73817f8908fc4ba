"""The record in PostgreSQL, against a real server (tests/pgserver.py, a fresh database a test).

The same contract as the file log: a round trip folds to the live state, the database refuses
a second event at a sequence, a foreign or spliced event is refused on read, the password is
never recorded or printed, and bad store settings are one line with exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

import lanefold
from lanefold import PgStore, RunInUseError, RunNotFoundError, open_store, read_run, read_state
from lanefold.cli import main
from lanefold.stores.postgres import PgDatabase, PgEventLog, redact_url

pytestmark = pytest.mark.slow

CONFIG = """
[loop]
k = 5
max_concurrency = 3
seed = 7

[backend]
kind = "simulated"
"""


def store_config(tmp: Path, url: str, *, password_env: str | None = "LANEFOLD_PG_PASSWORD") -> Path:
    path = tmp / "pg.toml"
    env = f'password_env = "{password_env}"\n' if password_env else ""
    path.write_text(CONFIG + f'\n[store]\nurl = "{url}"\n{env}')
    return path


def bodies(url: str) -> list[tuple[str, int, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT run_id, sequence, body FROM lanefold_events ORDER BY run_id, sequence"
        ).fetchall()


@pytest.mark.anyio
async def test_a_run_in_postgresql_folds_to_what_it_reported_and_follows(pg_url: str, tmp_path: Path) -> None:
    config = lanefold.parse_config({"loop": {"k": 4, "seed": 3}, "backend": {"kind": "simulated"}})
    live: list[Any] = []
    result = await lanefold.run(
        config, "17*23?", run_id="a", store=pg_url, runs_dir=tmp_path / "runs", observer=live.append
    )
    assert not (tmp_path / "runs").exists()  # nothing went to files
    store = open_store(pg_url)
    assert isinstance(store, PgStore) and store.exists("a") and not store.exists("b")
    events, state, recorded = read_run(store, "a")
    assert [e.model_dump_json() for e in events] == [e.model_dump_json() for e in live]
    assert state.result == result.model_dump(mode="json")
    assert recorded == config
    assert result.events == f"{redact_url(pg_url)}#a"
    followed = [event async for event in store.reader("a").follow()]
    assert followed == events
    # A finished run resumes to its record, calling nothing.
    assert await lanefold.resume("a", store=pg_url) == result


def test_the_database_refuses_a_second_event_at_a_sequence(pg_url: str) -> None:
    lanefold.run_sync(
        lanefold.parse_config({"backend": {"kind": "simulated"}}), "q", run_id="dup", store=pg_url
    )
    with psycopg.connect(pg_url) as conn, pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO lanefold_events (run_id, sequence, type, body) "
            "SELECT run_id, sequence, type, body FROM lanefold_events "
            "WHERE run_id = 'dup' AND sequence = 2"
        )


def test_a_spliced_or_foreign_event_is_refused_naming_run_and_sequence(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = lanefold.parse_config({"loop": {"k": 3}, "backend": {"kind": "simulated"}})
    for run_id in ("a", "b"):
        lanefold.run_sync(config, "q", run_id=run_id, store=pg_url)
    with psycopg.connect(pg_url) as conn:  # b's 4th event pasted into a's log
        conn.execute(
            "UPDATE lanefold_events SET body = (SELECT body FROM lanefold_events "
            "WHERE run_id = 'b' AND sequence = 4) WHERE run_id = 'a' AND sequence = 4"
        )
    for argv in (["show", "a"], ["resume", "a"], ["tail", "a"]):
        assert main([*argv, "--store", pg_url]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"orchestrator {argv[0]}: {redact_url(pg_url)}#a:4: ")
        assert "\n" not in err
    with psycopg.connect(pg_url) as conn:  # a line that is not an event at all
        conn.execute("UPDATE lanefold_events SET body = '{\"nope\": 1}' WHERE run_id = 'b' AND sequence = 2")
    assert main(["show", "b", "--store", pg_url]) == 2
    assert "#b:2: corrupt event log line" in capsys.readouterr().err


def test_the_password_is_never_recorded_nor_printed(
    pg_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = pg_server.create_database()
    bare, secret = pg_server.url(db, password=False), pg_server.password
    monkeypatch.setenv("LANEFOLD_PG_PASSWORD", secret)
    config = store_config(tmp_path, bare)
    assert main(["run", str(config), "--question", "17*23?", "--run-id", "env", "--json"]) == 0
    # Given inline on the command line: accepted, and shown as *** wherever it is printed.
    inline = pg_server.url(db)
    (tmp_path / "plain.toml").write_text(CONFIG)
    assert (
        main(
            [
                "run",
                str(tmp_path / "plain.toml"),
                "--question",
                "q",
                "--run-id",
                "inline",
                "--store",
                inline,
                "--json",
            ]
        )
        == 0
    )
    assert main(["show", "inline", "--store", inline, "--json"]) == 0
    assert main(["show", "nope", "--store", inline]) == 2
    out, err = capsys.readouterr()
    assert secret not in out + err
    assert f"{redact_url(inline)}#inline" in out and ":***@" in out
    rows = bodies(inline)
    assert {run for run, _, _ in rows} == {"env", "inline"}
    assert not [body for _, _, body in rows if secret in body]
    started = [body for _, seq, body in rows if seq == 1]
    assert started and all('"store"' not in body for body in started)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'url = "postgresql://u:hunter2@127.0.0.1/db"',
            "store.url: put the password in the environment variable named by store.password_env",
        ),
        ('url = "mysql://127.0.0.1/db"', "store.url: no store serves mysql:// URLs"),
        (
            'url = "postgresql://u@127.0.0.1/db"\npassword_env = "NOT-A NAME"',
            "store.password_env: must name an environment variable",
        ),
        ('url = "postgresql://u@127.0.0.1/db"\nhost = "x"', "store.host: unknown key"),
    ],
)
def test_bad_store_settings_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(CONFIG + "\n[store]\n" + text + "\n")
    assert main(["run", str(path), "--question", "q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "hunter2" not in err
    assert not (tmp_path / "runs").exists()


def test_unreachable_or_unset_stores_are_one_line_and_exit_2(
    pg_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LANEFOLD_PG_PASSWORD", raising=False)
    config = store_config(tmp_path, pg_server.url(pg_server.create_database(), password=False))
    assert main(["run", str(config), "--question", "q"]) == 2
    assert "store.password_env: the environment variable LANEFOLD_PG_PASSWORD is not set" in (
        capsys.readouterr().err
    )
    wrong = f"postgresql://lanefold:wrong-pw@127.0.0.1:{pg_server.port}/postgres"
    assert main(["show", "x", "--store", wrong]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orchestrator show: postgresql://lanefold:***@127.0.0.1:")
    assert "cannot connect" in err and "wrong-pw" not in err and err.count("\n") == 1
    assert main(["show", "x", "--store", "sqlite:///x.db"]) == 2
    assert "store.url: no store serves sqlite:// URLs (known: postgres://, postgresql://)" in (
        capsys.readouterr().err
    )


def test_a_missing_run_and_a_held_run(pg_url: str) -> None:
    db = PgDatabase(pg_url)
    with pytest.raises(RunNotFoundError, match="#ghost: no run 'ghost'"):
        PgEventLog.open_for_resume(db, "ghost")
    with pytest.raises(RunNotFoundError):
        list(PgEventLog(db, "ghost").read())
    log = PgEventLog.create(db, "held")
    try:
        with pytest.raises(
            RunInUseError,
            match=r"^run held is being written by another "
            r"process \(pid \d+\)$",
        ):
            PgEventLog.create(db, "held")
    finally:
        log.close()
    # Closed before its first event: no run appeared, and the id is free again.
    assert not db.exists("held")
    PgEventLog.create(db, "held").close()


def test_a_failed_commit_is_a_log_write_error_at_the_next_sync(pg_url: str) -> None:
    config = lanefold.parse_config({"backend": {"kind": "simulated"}})
    log = PgEventLog.create(PgDatabase(pg_url), "broken")
    with psycopg.connect(pg_url) as conn:  # the table refuses every insert from now on
        conn.execute("ALTER TABLE lanefold_events ADD CONSTRAINT no CHECK (sequence < 0) NOT VALID")
    with pytest.raises(lanefold.LogWriteError, match="cannot append to the run log"):
        lanefold.run_sync(config, "q", run_id="broken", log=log)


@pytest.mark.anyio
async def test_follow_is_woken_by_notify_on_both_event_loops(pg_url: str) -> None:
    """A follower started before the run sees every event as it commits, without sleeping."""
    db = PgDatabase(pg_url)
    config = lanefold.parse_config(
        {"loop": {"k": 3, "seed": 1}, "backend": {"kind": "simulated", "latency_ms": [20, 40]}}
    )
    seen: list[Any] = []

    async def follow() -> None:
        async for event in PgEventLog(db, "f").follow():
            seen.append(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)  # before the run exists: it waits for it to appear
        await lanefold.run(config, "q", run_id="f", store=pg_url)
    assert seen == list(PgEventLog(db, "f").read())
    assert seen[-1].type == "run.completed"


def test_an_eval_records_its_runs_and_its_own_record_in_the_store(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = tmp_path / "calls.log"
    (tmp_path / "sim.toml").write_text(CONFIG + f'call_log = "{calls}"\n')
    (tmp_path / "qs.jsonl").write_text(
        "".join(f'{{"question": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(6))
    )
    argv = [
        "eval",
        str(tmp_path / "sim.toml"),
        "--dataset",
        str(tmp_path / "qs.jsonl"),
        "--eval-id",
        "ev",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--store",
        pg_url,
        "--json",
    ]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert not (tmp_path / "runs").exists()  # the eval's record is in the database too
    store = open_store(pg_url)
    assert store.eval_record("ev").exists()
    run_ids = sorted(run for run, _, _ in bodies(pg_url) if run.startswith("ev."))
    assert len(set(run_ids)) == 6 and all(read_state(store, r).result for r in set(run_ids))
    before = calls.read_text()
    assert main(argv) == 0  # again: every run is recorded in the store, nothing is sampled
    assert calls.read_text() == before
    assert capsys.readouterr().out.count('"correct"') == first.count('"correct"')


def test_without_psycopg_the_store_is_one_line_with_the_install_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the scale extra were missing
    assert main(["show", "r", "--store", "postgresql://u@127.0.0.1:1/db"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "orchestrator show: store.url: a postgresql:// store needs psycopg (pip install 'lanefold[scale]')\n"
    )


def test_fsync_always_commits_each_event_before_append_returns(pg_url: str) -> None:
    config = lanefold.parse_config(
        {"loop": {"k": 3}, "backend": {"kind": "simulated"}, "log": {"fsync": "always"}}
    )
    committed: list[tuple[int, int]] = []

    def seen(event: Any) -> None:  # called right after each append returns
        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT count(*) FROM lanefold_events WHERE run_id = 'al'").fetchone()
        committed.append((event.sequence, row[0] if row else 0))

    lanefold.run_sync(config, "q", run_id="al", store=pg_url, observer=seen)
    assert committed and all(sequence == rows for sequence, rows in committed)
