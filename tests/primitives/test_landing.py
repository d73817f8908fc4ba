"""Lanes land as they finish: each lane is recorded the moment its backend hands it over.

A backend reports lanes one by one (an async iterator of per-lane outcomes); the dispatcher
records `lane.completed` and settles its spend at once, so the live display and `tail
--follow` show it while the rest of the request is still running, and a crash loses only the
lanes still decoding: resume dispatches those alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest
from test_dispatch import make, spec

import lanefold
from lanefold.primitives import LaneOutcome, Sample, SampleRequest, Usage

ROOT = Path(__file__).resolve().parents[2]


class GatedBackend:
    """Yields lane 0 at once; the other lanes only after the test has seen lane 0 recorded.

    A dispatcher that waited for the whole request before recording anything would never
    record lane 0, and the wave would hang: the test's time limit turns that into a failure.
    """

    name = "gated"
    max_lanes_per_request = None
    shares_prefix = True

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.spent_when_first_landed: int | None = None
        self.spent: Callable[[], int] = lambda: 0

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 10

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        for i, lane in enumerate(request.lanes):
            if i == 1:
                await self.gate.wait()
                # lane 0 is recorded and settled by now (settled just after its record)
                self.spent_when_first_landed = self.spent()
            usage = Usage(10, 0, 5) if i == 0 else Usage(0, 10, 5)
            yield Sample(lane.lane, "Answer: 1", "stop", usage)

    async def aclose(self) -> None:
        pass


@pytest.mark.anyio
async def test_a_lane_is_recorded_and_settled_while_its_request_is_still_running() -> None:
    backend = GatedBackend()
    d = make(backend)

    def observe(event: lanefold.AnyEvent) -> None:
        if event.type == "lane.completed" and event.lane == 0:
            backend.gate.set()

    backend.spent = lambda: d.ledger.spent.tokens

    d.recorder._observer = observe  # the hook the live display and `run(observer=)` use
    with anyio.fail_after(10):
        wave = await d.run_wave(spec(4))
    assert len(wave.completed()) == 4
    assert backend.spent_when_first_landed == 15  # lane 0 settled: prefill 10 + decode 5
    landed = [e.lane for e in d.recorder.log.read() if e.type == "lane.completed"]
    assert landed == [0, 1, 2, 3]


@pytest.mark.anyio
async def test_lanes_of_one_request_land_in_the_order_they_finish(tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {
            "loop": {"k": 6, "seed": 4},
            "backend": {"kind": "simulated", "latency_ms": [5, 200]},  # one request, six lanes
        }
    )
    result = await lanefold.run(config, "q", runs_dir=tmp_path, run_id="order")
    assert result.lanes_completed == 6
    log = list(lanefold.JsonlEventLog(result.events or "").read())
    dispatched = [e for e in log if e.type == "lane.dispatched"]
    assert len({e.data.request for e in dispatched}) == 1  # type: ignore[union-attr]
    landed = [e.lane for e in log if e.type == "lane.completed"]
    assert sorted(landed) == list(range(6)) and landed != list(range(6))


@pytest.mark.slow
def test_a_kill_loses_only_the_lanes_of_a_request_still_running(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    config = tmp_path / "one-request.toml"
    config.write_text(f"""
[loop]
k = 8
seed = 9

[backend]
kind = "simulated"
latency_ms = [100, 8000]
call_log = "{calls}"
""")
    runs = tmp_path / "runs"
    log = runs / "r" / "events.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lanefold",
            "run",
            str(config),
            "--question",
            "q",
            "--runs-dir",
            str(runs),
            "--run-id",
            "r",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (log.exists() and log.read_text().count('"lane.completed"') >= 2):
        assert time.monotonic() < deadline, "no lane landed"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [e for e in lanefold.JsonlEventLog(log).read()]
    landed = {e.lane for e in before if e.type == "lane.completed"}
    assert 2 <= len(landed) < 8, "the request was cut with lanes done and lanes running"
    first_calls = calls.read_text().splitlines()

    result = lanefold.resume_sync("r", runs_dir=runs)
    assert result.lanes_completed == 8
    again = {int(line.split()[1]) for line in calls.read_text().splitlines()[len(first_calls) :]}
    assert again == set(range(8)) - landed  # only the lanes still running were dispatched again
    completions = Counter(e.lane for e in lanefold.JsonlEventLog(log).read() if e.type == "lane.completed")
    assert set(completions.values()) == {1}
