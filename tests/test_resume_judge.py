"""Resume inside the judge wave: scored candidates are not judged again, the winner stands."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from test_resume_stateful import CrashingLog, crashed

import lanefold
from lanefold.stores.files import JsonlEventLog

CONFIG = {
    "loop": {"k": 6, "seed": 4, "reducer": "judge_argmax", "min_quorum": 2},
    "judge": {"template": "Q: {question}\nCandidate: {candidate}\nScore it.", "max_tokens": 32},
    "backend": {"kind": "simulated", "accuracy": 0.3, "failure_rate": 0.2, "lanes_per_request": 2},
    "retry": {"max_attempts": 4, "initial_backoff_s": 0.0005, "max_backoff_s": 0.001},
}


@pytest.mark.parametrize("crash_at", [14, 22, 26, 30, 34, 36, 38, 40])
def test_a_crash_in_the_judge_wave_resumes_to_the_uninterrupted_winner(tmp_path: Path, crash_at: int) -> None:
    config = lanefold.parse_config(CONFIG)
    baseline = lanefold.run_sync(config, "17*23?", runs_dir=tmp_path, run_id="base")
    path = tmp_path / "crash" / "events.jsonl"
    log = CrashingLog(JsonlEventLog.create(path), crash_at)
    with pytest.raises(Exception) as info:  # any error whose cause is the crash
        anyio.run(lambda: lanefold.run(config, "17*23?", runs_dir=tmp_path, run_id="crash", log=log))
    assert crashed(info.value)
    result = lanefold.resume_sync("crash", runs_dir=tmp_path)
    assert (result.answer, result.winner_lane) == (baseline.answer, baseline.winner_lane)
    assert result.scores == baseline.scores
    events = list(JsonlEventLog(path).read())
    judged = [e.data.candidate_lane for e in events if e.type == "judge.completed"]
    assert sorted(judged) == sorted(set(judged))  # no candidate scored twice
    done: set[tuple[int | None, int | None]] = set()
    for e in events:
        if e.type == "lane.dispatched":
            assert (e.wave, e.lane) not in done
        elif e.type == "lane.completed":
            done.add((e.wave, e.lane))
