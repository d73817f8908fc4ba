"""Event logs: append/read, torn tails, corruption, follow, fsync policy, run ids."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from lanefold.primitives import (
    ConfigError,
    LogCorruptError,
    MemoryEventLog,
    RunNotFoundError,
    parse_event,
    validate_run_id,
)
from lanefold.primitives.events import (
    RunCompleted,
    RunCompletedData,
    WaveBarrier,
    WaveBarrierData,
)
from lanefold.stores.files import JsonlEventLog


def barrier(seq: int, run_id: str = "r") -> WaveBarrier:
    return WaveBarrier(
        id=f"{run_id}:{seq}",
        source="test",
        time=datetime.now(UTC),
        sequence=seq,
        run_id=run_id,
        wave=1,
        data=WaveBarrierData(completed=[seq], failed=[]),
    )


def completed(seq: int) -> RunCompleted:
    return RunCompleted(
        id=f"r:{seq}",
        source="test",
        time=datetime.now(UTC),
        sequence=seq,
        run_id="r",
        data=RunCompletedData(result={"answer": "x"}),
    )


def write_log(path: Path, n: int) -> JsonlEventLog:
    log = JsonlEventLog.create(path)
    for seq in range(1, n + 1):
        log.append(barrier(seq))
    log.close()
    return log


def test_append_then_read_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "r" / "events.jsonl"
    write_log(path, 5)
    events = list(JsonlEventLog(path).read())
    assert [e.sequence for e in events] == [1, 2, 3, 4, 5]
    assert events[2] == barrier(3).model_copy(update={"time": events[2].time})
    assert next(JsonlEventLog(path).read(from_sequence=4)).sequence == 4
    assert path.read_bytes().count(b"\n") == 5


def test_envelope_omits_absent_fields_and_round_trips() -> None:
    event = completed(1)
    line = event.model_dump_json(by_alias=True)
    assert '"wave"' not in line and '"lane"' not in line
    assert parse_event(line) == event


def test_create_refuses_an_existing_log(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, 1)
    with pytest.raises(ConfigError, match="already exists"):
        JsonlEventLog.create(path)


def test_append_refuses_out_of_order_sequence(tmp_path: Path) -> None:
    log = JsonlEventLog.create(tmp_path / "events.jsonl")
    log.append(barrier(1))
    with pytest.raises(ValueError, match="does not follow"):
        log.append(barrier(3))
    log.close()


def test_torn_tail_is_cut_and_reported_on_resume(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, 3)
    whole = barrier(4).model_dump_json(by_alias=True).encode()
    with path.open("ab") as fh:
        fh.write(whole[: len(whole) // 2])  # a write cut short by a crash
    # Readers skip the partial line; it is not an event yet.
    assert [e.sequence for e in JsonlEventLog(path).read()] == [1, 2, 3]
    log = JsonlEventLog.open_for_resume(path)
    assert log.torn_tail is not None
    assert log.torn_tail.line == 4 and log.torn_tail.bytes == len(whole) // 2
    assert log.last_sequence == 3
    log.append(barrier(4))
    log.close()
    assert [e.sequence for e in JsonlEventLog(path).read()] == [1, 2, 3, 4]


def test_clean_log_has_no_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, 2)
    log = JsonlEventLog.open_for_resume(path)
    assert log.torn_tail is None and log.last_sequence == 2
    log.close()


@pytest.mark.parametrize("bad", [b"{not json}\n", b'{"type": "lane.completed"}\n', b"\n"])
def test_a_bad_line_in_the_middle_is_corruption_naming_the_line(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, 4)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines[:2], bad, *lines[2:]]))
    with pytest.raises(LogCorruptError) as info:
        JsonlEventLog.open_for_resume(path)
    assert info.value.line == 3
    assert f"{path}:3:" in str(info.value)
    with pytest.raises(LogCorruptError, match=":3:"):
        list(JsonlEventLog(path).read())


def test_a_gap_in_sequence_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    write_log(path, 4)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:1] + lines[2:]))
    with pytest.raises(LogCorruptError, match=r":2: .*sequence 3 after 1"):
        JsonlEventLog.open_for_resume(path)


def test_resume_of_a_missing_log_is_run_not_found(tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError):
        JsonlEventLog.open_for_resume(tmp_path / "nope" / "events.jsonl")


# `barrier` also forces the first line down before the log appears under its name; a sync
# with nothing written since the last forced write forces nothing (`always` forced each line).
@pytest.mark.parametrize(("policy", "expected"), [("always", 5), ("barrier", 1 + 1 + 1), ("never", 0)])
def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str, expected: int) -> None:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    log = JsonlEventLog.create(tmp_path / "events.jsonl", fsync=policy)  # type: ignore[arg-type]
    for seq in range(1, 5):
        log.append(barrier(seq))
    log.sync()  # a barrier
    log.sync()  # nothing new since
    log.append(barrier(5))
    log.close()  # run end
    assert len(calls) == expected


@pytest.mark.parametrize("run_id", ["abc", "2026-12-02_run.1", "A" * 128])
def test_plain_run_ids_are_accepted(run_id: str) -> None:
    assert validate_run_id(run_id) == run_id


@pytest.mark.parametrize(
    "run_id", ["", "../x", "a/b", "..", "a..b", ".hidden", "x" * 129, "a b", "a\\b", "é"]
)
def test_run_ids_that_are_not_plain_names_are_refused(run_id: str) -> None:
    with pytest.raises(ConfigError, match="not a plain name"):
        validate_run_id(run_id)


@pytest.mark.anyio
async def test_follow_yields_events_as_they_land_and_stops_at_run_end(tmp_path: Path) -> None:
    path = tmp_path / "late" / "events.jsonl"
    seen: list[int] = []

    async def reader() -> None:
        async for event in JsonlEventLog(path).follow():
            seen.append(event.sequence)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.sleep(0.1)  # the reader waits for a log that does not exist yet
            log = JsonlEventLog.create(path)
            for seq in range(1, 4):
                log.append(barrier(seq))
                await anyio.sleep(0.06)
            log.append(completed(4))
            log.close()
    assert seen == [1, 2, 3, 4]


@pytest.mark.anyio
async def test_memory_log_follow_and_read() -> None:
    log = MemoryEventLog()
    seen: list[int] = []

    async def reader() -> None:
        async for event in log.follow():
            seen.append(event.sequence)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(reader)
            await anyio.lowlevel.checkpoint()
            log.append(barrier(1))
            await anyio.lowlevel.checkpoint()
            log.append(completed(2))
    assert seen == [1, 2]
    assert [e.sequence for e in log.read(2)] == [2]
