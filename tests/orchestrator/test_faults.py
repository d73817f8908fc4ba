"""Faults: a flaky backend still reaches quorum, and every fault is in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend
from lanefold.primitives import QuorumNotMetError
from lanefold.stores.files import JsonlEventLog


def config(**backend: object) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": 24, "max_concurrency": 6, "seed": 3, "min_quorum": 12},
            "backend": {"kind": "simulated", "lanes_per_request": 2, **backend},
            "retry": {"max_attempts": 4, "initial_backoff_s": 0.001, "max_backoff_s": 0.01},
        }
    )


def test_thirty_percent_faults_finish_with_quorum_and_every_fault_is_logged(tmp_path: Path) -> None:
    cfg = config(failure_rate=0.3, latency_ms=[0, 2])
    backend = SimulatedBackend(cfg.backend)
    result = lanefold.run_sync(cfg, "17*23?", runs_dir=tmp_path, run_id="flaky", backend=backend)
    assert result.lanes_completed >= 12
    assert len(backend.faults) >= 5  # 30% of 24+ lane attempts: the test exercised faults
    logged = [
        (e.wave, e.lane, e.attempt, e.data.error)
        for e in JsonlEventLog(tmp_path / "flaky" / "events.jsonl").read()
        if e.type == "lane.failed"
    ]
    assert sorted(logged) == sorted(backend.faults)
    assert result.answer == "391"


def test_faults_beyond_the_retries_fail_the_run_with_a_complete_log(tmp_path: Path) -> None:
    cfg = config(failure_rate=1.0)
    with pytest.raises(QuorumNotMetError):
        lanefold.run_sync(cfg, "17*23?", runs_dir=tmp_path, run_id="down")
    events = list(JsonlEventLog(tmp_path / "down" / "events.jsonl").read())
    assert events[-1].type == "run.failed" and events[-1].data.exit_code == 1
    assert events[-2].type == "wave.barrier" and len(events[-2].data.failed) == 24
    per_lane = {}
    for e in events:
        if e.type == "lane.failed":
            per_lane[e.lane] = per_lane.get(e.lane, 0) + 1
    assert per_lane == {lane: 4 for lane in range(24)}
