"""The winner and the times a record holds are the log's (issue 38).

The runner derives `winner_wave` and `winner_text` from the log, whatever a loop's Outcome
says, so the fold can check them; the writer never stamps a line before the last, so a clock
that steps back cannot make a log its readers refuse; a time without an offset is refused.
The forgeries themselves, on every store, are in tests/test_record_refusal.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel, ConfigDict

import lanefold
from lanefold.cli import main
from lanefold.primitives import (
    LOOPS,
    LoopContext,
    MemoryEventLog,
    Outcome,
    RunError,
    RunState,
    fold,
    register_loop,
)
from lanefold.primitives.events import LoopEvent
from lanefold.primitives.internal import Recorder
from tests.primitives.test_fold_claims import started

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def test_the_writer_never_stamps_a_line_before_the_last() -> None:
    """A clock that steps back an hour: the lines it stamps carry the latest time so far, and
    the log reads (each line no earlier than run.started)."""
    ticks = iter(
        [
            T0,
            T0 - timedelta(hours=1),
            T0 - timedelta(hours=1) + timedelta(seconds=1),
            T0 + timedelta(seconds=2),
        ]
    )
    log = MemoryEventLog()
    recorder = Recorder(log, "w", RunState(), now=lambda: next(ticks))
    started(recorder)  # run.started, wave.started
    recorder.emit(LoopEvent, {"n": 1}, event_type="loop.test.noted")
    recorder.emit(LoopEvent, {"n": 2}, event_type="loop.test.noted")
    events = list(log.read())
    assert [e.time for e in events] == [T0, T0, T0, T0 + timedelta(seconds=2)]
    assert fold(events, run_id="w").last_sequence == 4


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Twice:
    """Two waves of two lanes, each numbered 0 and 1; lane `winner` of the second wave wins,
    its Outcome naming no wave and a text of its own."""

    name: ClassVar[str] = "test_twice"
    Params: ClassVar[type[BaseModel]] = _Params
    winner: ClassVar[int] = 1

    def __init__(self, params: _Params) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        await ctx.wave([ctx.prompt(question)] * 2)
        second = await ctx.wave([ctx.prompt(f"Again: {question}")] * 2)
        best = second[min(self.winner, 1)]
        return Outcome(answer=best.answer, winner_lane=self.winner, winner_text="a text of the loop's own")


@pytest.fixture(autouse=True)
def plug_in() -> Iterator[None]:
    loops = LOOPS.snapshot()
    register_loop(Twice)
    yield
    LOOPS.restore(loops)


CONFIG = {"loop": {"coordinator": "test_twice"}, "backend": {"kind": "simulated", "accuracy": 0.5}}


def test_the_result_holds_the_winning_lane_s_text_and_wave(tmp_path: Path) -> None:
    result = lanefold.run_sync(lanefold.parse_config(CONFIG), "17 * 23?", runs_dir=tmp_path, run_id="t")
    events = [json.loads(line) for line in (tmp_path / "t" / "events.jsonl").read_text().splitlines()]
    texts = {(e["wave"], e["lane"]): e["data"]["text"] for e in events if e["type"] == "lane.completed"}
    assert texts[(1, 1)] != texts[(2, 1)]
    # No wave named: the latest in which the lane completed; the text is that lane's.
    assert (result.winner_wave, result.winner_lane, result.winner_text) == (2, 1, texts[(2, 1)])
    assert events[-1]["data"]["result"]["winner_text"] == texts[(2, 1)]


def test_a_loop_naming_a_lane_that_never_ran_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Twice, "winner", 7)
    with pytest.raises(RunError, match="the loop's winner_lane 7 is no lane the run ran"):
        lanefold.run_sync(lanefold.parse_config(CONFIG), "17 * 23?", runs_dir=tmp_path, run_id="t")


def test_a_time_without_a_utc_offset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lanefold.run_sync(lanefold.parse_config({"loop": {"k": 3}}), "17 * 23?", runs_dir=tmp_path, run_id="t")
    path = tmp_path / "t" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    events[2]["time"] = events[2]["time"].removesuffix("Z")
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["show", "t", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "events.jsonl:3: corrupt event log line: lane.dispatched's time" in err and "no UTC offset" in err


def test_times_at_the_ends_of_the_calendar_read_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log dated in year 1 (an edit, a broken clock): its order is checked without
    arithmetic past the calendar's ends; a step back of a minute there reads."""
    lanefold.run_sync(
        lanefold.parse_config({"loop": {"k": 3}, "backend": {"kind": "simulated", "accuracy": 1.0}}),
        "17 * 23?",
        runs_dir=tmp_path,
        run_id="t",
    )
    path = tmp_path / "t" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for i, event in enumerate(events):
        event["time"] = f"0001-01-01T00:{min(i, 59):02}:00Z"
    events[3]["time"] = "0001-01-01T00:01:00Z"  # two minutes back
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert main(["show", "t", "--runs-dir", str(tmp_path), "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
