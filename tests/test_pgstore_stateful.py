"""tests/test_resume_stateful.py's state machine on the PostgreSQL store: a run crashes at a
random event (its log stops taking appends, as a killed process's would), is resumed, crashes
again, and so on; no completed lane is dispatched again, the budget is never exceeded, and the
log folds to the bill the run reported, and a forged copy of the log, as rows, is refused. A
commit is whole, so there is no torn tail to cut here:
`tear` is drawn and has nothing to tear.
"""

from __future__ import annotations

import json
import secrets
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule, run_state_machine_as_test
from test_resume_stateful import CrashingLog, Events, ResumeMachine

import lanefold
from lanefold import LanefoldError, PgStore
from lanefold.primitives import AnyEvent
from lanefold.stores.postgres import PgEventLog

pytestmark = pytest.mark.slow


class PgResumeMachine(ResumeMachine):
    url: ClassVar[str]

    def __init__(self) -> None:
        super().__init__()
        self.store = PgStore.from_url(self.url)
        self.run_id = "r" + secrets.token_hex(4)  # one database, a run per example

    def events(self) -> list[AnyEvent]:
        return list(PgEventLog(self.store.db, self.run_id).read()) if self.store.exists(self.run_id) else []

    def copy_id(self, name: str) -> str:
        return f"{self.run_id}-{name}"  # one database: a copy per example too

    def write_copy(self, run_id: str, events: Events) -> None:
        with psycopg.connect(self.url) as conn:
            conn.execute("INSERT INTO lanefold_runs (run_id) VALUES (%s)", (run_id,))
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO lanefold_events (run_id, sequence, type, body) VALUES (%s, %s, %s, %s)",
                    [(run_id, e["sequence"], e["type"], json.dumps(e)) for e in events],
                )

    def copy_record(self, run_id: str) -> object:
        with psycopg.connect(self.url) as conn:
            return conn.execute(
                "SELECT sequence, body FROM lanefold_events WHERE run_id = %s ORDER BY sequence", (run_id,)
            ).fetchall()

    def resume_copy(self, run_id: str) -> object:
        return lanefold.resume_sync(run_id, store=self.store)

    @precondition(lambda self: not self.started)
    @rule(crash_at=st.integers(1, 60))
    def start(self, crash_at: int) -> None:
        self.started = True
        log = CrashingLog(PgEventLog.create(self.store.db, self.run_id), crash_at)  # type: ignore[arg-type]
        self._attempt(lambda: lanefold.run(self.config, "q", run_id=self.run_id, store=self.store, log=log))

    @precondition(lambda self: self.started and not self.finished)
    @rule(crash_at=st.integers(1, 60), tear=st.booleans())
    def resume(self, crash_at: int, tear: bool) -> None:
        if not self.store.exists(self.run_id):  # it crashed before its first commit
            self.started = False
            return
        log = CrashingLog(PgEventLog.open_for_resume(self.store.db, self.run_id), crash_at)  # type: ignore[arg-type]
        self._attempt(lambda: lanefold.resume(self.run_id, store=self.store, log=log))

    @precondition(lambda self: self.started and not self.finished)
    @rule()
    def resume_to_the_end(self) -> None:
        if not self.store.exists(self.run_id):
            self.started = False
            return
        self._attempt(lambda: lanefold.resume(self.run_id, store=self.store))
        assert self.finished

    @precondition(lambda self: self.finished)
    @rule()
    def resume_a_finished_run(self) -> None:
        """Resuming a finished run changes nothing and gives back what it gave."""
        count = len(self.events())
        try:
            again: object = lanefold.resume_sync(self.run_id, store=self.store)
        except LanefoldError as exc:
            again = exc
        if isinstance(self.outcome, lanefold.RunResult):
            assert again == self.outcome
        else:
            assert isinstance(again, LanefoldError) and self.outcome is not None
            assert again.exit_code == self.outcome.exit_code
        assert len(self.events()) == count


def test_resume_state_machine_on_postgresql(pg_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(PgResumeMachine, "url", pg_url, raising=False)
    run_state_machine_as_test(
        PgResumeMachine,
        settings=settings(
            max_examples=25,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
