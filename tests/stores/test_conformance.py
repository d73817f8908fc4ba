"""The store contract, run by every registered store: files in a temporary folder, PostgreSQL on
the embedded server (tests/pgserver.py). A store registered without an opener in
tests/stores/conftest.py fails every test here, so a new store joins by adding one.

What every store keeps: a log is created, appended, read and followed; one writer per run
(RunInUseError), resume appends after the last event, a sequence out of order is refused; runs
are listed newest first with every filter meaning the same; an eval's record (manifest, rows,
summary, one writer) round-trips; and a forged log is refused on read, naming the line. The
whole refusal suites (tests/test_record_refusal.py for files, tests/test_pgstore_refusal.py
running those same tests on PostgreSQL) and the resume state machines
(tests/test_resume_stateful.py, tests/test_pgstore_stateful.py) stay where they are: the
forgery check here is their smallest case, run on every store.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.cli import main
from lanefold.execution._store import read_run
from lanefold.primitives import (
    ConfigError,
    LogCorruptError,
    RunInUseError,
    Store,
)
from lanefold.primitives.events import (
    AnyEvent,
    RunCompleted,
    RunCompletedData,
    RunFailed,
    RunFailedData,
    RunInterrupted,
    RunInterruptedData,
    RunStarted,
    RunStartedData,
    WaveBarrier,
    WaveBarrierData,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


def started(
    run_id: str,
    *,
    loop: str = "parallel_sample",
    at: datetime = T0,
    question: str = "Q?",
    model: str | None = None,
    caller: str | None = None,
) -> RunStarted:
    return RunStarted(
        id=f"{run_id}:1",
        source="test",
        time=at,
        sequence=1,
        run_id=run_id,
        data=RunStartedData(
            config={},
            config_hash="x",
            question=question,
            coordinator=loop,
            backend="simulated",
            library_version="test",
            model=model,
            caller=caller,
        ),
    )


def barrier(run_id: str, seq: int, at: datetime = T0) -> WaveBarrier:
    return WaveBarrier(
        id=f"{run_id}:{seq}",
        source="test",
        time=at,
        sequence=seq,
        run_id=run_id,
        wave=1,
        data=WaveBarrierData(completed=[seq], failed=[]),
    )


def ended(run_id: str, seq: int, how: str, at: datetime = T0, answer: str = "391") -> AnyEvent:
    common: dict[str, Any] = {
        "id": f"{run_id}:{seq}",
        "source": "test",
        "time": at,
        "sequence": seq,
        "run_id": run_id,
    }
    if how == "answered":
        return RunCompleted(
            **common,
            data=RunCompletedData(result={"answer": answer, "lanes_completed": 2, "cost": {"total": 0.5}}),
        )
    if how == "failed":
        return RunFailed(
            **common, data=RunFailedData(error="BudgetExhaustedError", message="spent", exit_code=3)
        )
    return RunInterrupted(**common, data=RunInterruptedData(reason="SIGINT"))


def write(store: Store, run_id: str, events: list[AnyEvent]) -> None:
    log = store.create_log(run_id)
    try:
        for event in events:
            log.append(event)
    finally:
        log.close()


# -- logs ---------------------------------------------------------------------------------------


def test_create_append_read_follow(store: Store) -> None:
    assert not store.exists("r1")
    write(store, "r1", [started("r1"), barrier("r1", 2), ended("r1", 3, "answered")])
    assert store.exists("r1")
    assert [e.sequence for e in store.reader("r1").read()] == [1, 2, 3]
    assert [e.sequence for e in store.reader("r1").read(from_sequence=2)] == [2, 3]

    async def follow() -> list[int]:
        with anyio.fail_after(10):
            return [e.sequence async for e in store.reader("r1").follow()]

    assert anyio.run(follow) == [1, 2, 3], "follow ends after the run's end"
    assert "r1" in store.location("r1") and store.describe


def test_one_writer_per_run_and_resume_appends(store: Store) -> None:
    log = store.create_log("w1")
    log.append(started("w1"))
    log.sync()  # what a reader sees from here on
    try:
        with pytest.raises(RunInUseError):
            store.open_for_resume("w1")
        assert [s.status for s in store.list_runs()] == ["running"]
        assert store.writing("w1")
    finally:
        log.close()
    assert [s.status for s in store.list_runs()] == ["stopped"]
    assert not store.writing("w1")
    resumed = store.open_for_resume("w1")
    try:
        with pytest.raises(RunInUseError):
            store.open_for_resume("w1")
        resumed.append(barrier("w1", 2))
    finally:
        resumed.close()
    assert [e.sequence for e in store.reader("w1").read()] == [1, 2]


def test_a_sequence_out_of_order_is_refused(store: Store) -> None:
    log = store.create_log("s1")
    try:
        log.append(started("s1"))
        with pytest.raises(ValueError, match="does not follow"):
            log.append(barrier("s1", 3))
        log.append(barrier("s1", 2))
    finally:
        log.close()
    assert [e.sequence for e in store.reader("s1").read()] == [1, 2]


def test_a_second_run_under_one_id_is_refused(store: Store) -> None:
    write(store, "d1", [started("d1")])
    with pytest.raises(ConfigError, match="already exists"):
        store.create_log("d1")


# -- listing ------------------------------------------------------------------------------------


def _fleet(store: Store) -> None:
    """Runs of each status, a minute apart: ev.0 oldest."""
    for i, how in enumerate(("answered", "failed", "interrupted", "stopped")):
        run_id, at = f"ev.{i}", T0 + timedelta(minutes=i)
        tail = [] if how == "stopped" else [ended(run_id, 2, how, at)]
        write(store, run_id, [started(run_id, at=at), *tail])
    write(
        store,
        "solo",
        [
            started("solo", loop="debate", at=T0 + timedelta(minutes=10)),
            ended("solo", 2, "answered", T0 + timedelta(minutes=11)),
        ],
    )


def test_list_runs_filters_and_order(store: Store) -> None:
    assert store.list_runs() == []
    _fleet(store)
    held = store.create_log("live")
    held.append(started("live", at=T0 + timedelta(minutes=20)))
    held.sync()
    try:
        every = store.list_runs()
        assert [s.run_id for s in every] == ["live", "solo", "ev.3", "ev.2", "ev.1", "ev.0"]
        assert [s.status for s in every] == [
            "running",
            "answered",
            "stopped",
            "interrupted",
            "failed",
            "answered",
        ]
        for status in ("answered", "failed", "interrupted", "stopped", "running"):
            assert {s.status for s in store.list_runs(status=status)} == {status}
        assert [s.run_id for s in store.list_runs(loop="debate")] == ["solo"]
        assert [s.run_id for s in store.list_runs(eval_id="ev")] == ["ev.3", "ev.2", "ev.1", "ev.0"]
        assert store.list_runs(eval_id="e") == [], "an eval id is a whole prefix"
        since = T0 + timedelta(minutes=2)
        assert [s.run_id for s in store.list_runs(since=since)] == ["live", "solo", "ev.3", "ev.2"]
        assert [s.run_id for s in store.list_runs(limit=2)] == ["live", "solo"]
        first = every[-1]
        assert (first.answer, first.lanes, first.cost_usd, first.loop) == ("391", 2, 0.5, "parallel_sample")
    finally:
        held.close()


def test_a_filtered_page_reaches_past_the_newest_runs(store: Store) -> None:
    """A page is read newest first in steps (PostgreSQL: no whole-table read per page); a filter
    that only old runs pass still finds them, in order, and a page stops at its limit."""
    for i in range(230):
        run_id, at = f"r{i:03}", T0 + timedelta(seconds=i)
        write(
            store, run_id, [started(run_id, at=at), ended(run_id, 2, "failed" if i < 3 else "answered", at)]
        )
    assert [s.run_id for s in store.list_runs(status="failed", limit=2)] == ["r002", "r001"]
    assert [s.run_id for s in store.list_runs(status="failed")] == ["r002", "r001", "r000"]
    assert [s.run_id for s in store.list_runs(limit=3)] == ["r229", "r228", "r227"]
    assert len(store.list_runs()) == 230


def test_runs_are_searched_by_what_they_asked_and_said(store: Store) -> None:
    """The view's search: question and answer hold the text (any case; `%`, `_` and `\\` are
    themselves, never wildcards), loop, model and caller exactly, a start between since and
    until; every filter meaning the same on every store."""
    asked = [
        ("a", "What is 17 * 23?", "391", None, None),
        ("b", "what IS the capital of France?", "Paris", "vote", "alice"),
        ("c", "Is 50% of 8 four?", "yes", "vote", "bob"),
        ("d", "snake_case or 50 of them? a\\b", "no", "judge", "alice"),
    ]
    for i, (run_id, question, answer, model, caller) in enumerate(asked):
        at = T0 + timedelta(minutes=i)
        first = started(run_id, at=at, question=question, model=model, caller=caller)
        write(store, run_id, [first, ended(run_id, 2, "answered", at, answer=answer)])

    def ids(**filters: Any) -> list[str]:
        return [s.run_id for s in store.list_runs(**filters)]

    assert ids(question="what is") == ["b", "a"]
    assert ids(question="50%") == ["c"], "a % is searched for, not a wildcard"
    assert ids(question="e_c") == ["d"] and ids(question="7_*") == [], "a _ is itself, not any one"
    assert ids(question="a\\b") == ["d"] and ids(question="\\") == ["d"]
    assert ids(answer="PAR") == ["b"]
    assert ids(model="vote") == ["c", "b"]
    assert ids(caller="alice", model="vote") == ["b"]
    assert ids(caller="alice", question="50") == ["d"]
    assert ids(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=2)) == ["c", "b"]
    assert ids(until=T0) == ["a"]
    assert ids(question="nowhere") == []
    assert ids(question="what", limit=1) == ["b"]


def test_orchestrator_list_prints_runs_newest_first(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    _fleet(store)
    assert main(["list", *flags, "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    if len(listed) == 1 and isinstance(listed[0], list):
        listed = listed[0]
    assert [r["run_id"] for r in listed] == ["solo", "ev.3", "ev.2", "ev.1", "ev.0"]
    assert main(["list", *flags, "--eval", "ev", "--status", "failed", "--json"]) == 0
    out = capsys.readouterr().out
    assert "ev.1" in out and "ev.0" not in out


# -- refusal on read ----------------------------------------------------------------------------


FORGERIES = ["spliced", "edited answer", "edited winner text", "dropped barrier", "lane before the start"]


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_log_is_refused_on_read_naming_the_line(store: Store, forgery: str) -> None:
    """A real run's log with another run's line spliced in, its answer or its winner's text
    edited, its barrier dropped or a lane stamped before the run started: read back whole,
    then refused at the line, one line naming it."""
    lanefold.run_sync(
        str(ROOT / "examples" / "simulated.toml"), "What is 17 * 23?", store=store, run_id="real"
    )
    events = list(store.reader("real").read())
    assert read_run(store, "real")[1].result is not None  # the run's own log reads whole
    forged = [
        e.model_copy(
            update={
                "run_id": "f1",
                "id": e.id.replace("real", "f1"),
                "source": e.source.replace("real", "f1"),
            }
        )
        for e in events
    ]
    end = forged[-1]
    assert isinstance(end, RunCompleted)
    line = len(forged)
    if forgery == "spliced":
        forged[1] = events[1]  # the other run's line
        line = 2
    elif forgery == "dropped barrier":
        at = next(i for i, e in enumerate(forged) if isinstance(e, WaveBarrier))
        forged = forged[:at] + [
            e.model_copy(update={"sequence": e.sequence - 1, "id": f"f1:{e.sequence - 1}"})
            for e in forged[at + 1 :]
        ]
        line = at + 1  # what follows the barrier depends on it
    elif forgery == "lane before the start":
        at = next(i for i, e in enumerate(forged) if e.type == "lane.completed")
        forged[at] = forged[at].model_copy(update={"time": forged[0].time - timedelta(days=1)})
        line = at + 1
    else:
        # The edited text alone is wrong (the result's run_id made the copy's own).
        change = (
            {"answer": "392"}
            if forgery == "edited answer"
            else {"winner_text": "Answer: 392", "run_id": "f1"}
        )
        result = {**end.data.result, **change}
        forged[-1] = end.model_copy(update={"data": RunCompletedData(result=result)})
    write(store, "f1", forged)
    with pytest.raises(LogCorruptError) as refused:
        read_run(store, "f1")
    assert refused.value.line == line if forgery != "edited answer" else refused.value.line <= line
    if forgery == "edited winner text":
        assert "run.completed says winner_text = 'Answer: 392'" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert store.location("f1") in str(refused.value)


# -- an eval's record ---------------------------------------------------------------------------


def test_an_eval_record_round_trips_with_one_writer(store: Store) -> None:
    record = store.eval_record("e1")
    assert not record.exists() and record.read_manifest() is None
    assert record.read_summary() is None and record.read_rows(json.loads) == []
    with record.hold():
        assert record.running()
        with pytest.raises(RunInUseError), store.eval_record("e1").hold():
            pass
        record.write_manifest(b'{"n": 1}')
        record.append_row(b'{"index": 0}')
        record.append_row(b'{"index": 1}')
        record.write_manifest(b'{"n": 2}')  # a grown eval: replaced whole
        record.write_summary(b'{"done": true}', table="index\n0\n1\n")
    assert not record.running() and record.exists() and not record.is_run()
    assert json.loads(record.read_manifest() or b"") == {"n": 2}
    assert record.read_rows(json.loads) == [{"index": 0}, {"index": 1}]
    assert json.loads(record.read_summary() or b"") == {"done": True}
    with pytest.raises(Exception, match="not a result row"):
        record.read_rows(lambda _: (_ for _ in ()).throw(ValueError("bad")))
    write(store, "r9", [started("r9")])
    assert store.eval_record("r9").is_run()


def test_list_evals_newest_first(store: Store) -> None:
    assert store.list_evals() == []
    for eval_id in ("e1", "e2"):  # a tie in time (a coarse clock) goes by id, newest first
        with store.eval_record(eval_id).hold():
            store.eval_record(eval_id).write_manifest(b"{}")
    write(store, "r1", [started("r1")])  # a run is no eval
    assert store.list_evals() == ["e2", "e1"]
