"""Interrupted is not failed: Ctrl-C, SIGTERM or a caller's cancellation stop a run cleanly.

Lanes in flight are recorded as `lane.interrupted` (charged their hold on the bill's cut-off
line), `run.interrupted` ends the log, the CLI names the command that resumes it and exits 130
or 143; in Python the cancellation is recorded and re-raised. `resume` dispatches the cut-off
lanes again with their seeds, so the answer and the votes equal an uninterrupted run's, and
cut-off attempts never count against `retry.max_attempts`.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from test_writer_lock import start

import lanefold
from lanefold import AnyEvent, read_state
from lanefold.stores.files import JsonlEventLog

ROOT = Path(__file__).resolve().parents[2]
RAW: dict[str, Any] = {
    "loop": {"k": 8, "max_concurrency": 4, "seed": 21, "min_quorum": 8},
    "backend": {"kind": "simulated", "latency_ms": [40, 120], "lanes_per_request": 2},
    "retry": {"max_attempts": 1},  # one failure is final: a cut-off attempt must not count
    "pricing": {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.5, "output_per_mtok": 2.0},
}


def events(path: Path | str) -> list[AnyEvent]:
    return list(JsonlEventLog(Path(path)).read())


async def run_until(
    config: lanefold.LoopConfig, runs: Path, run_id: str, completions: int, resume: bool
) -> bool:
    """Run (or resume) and cancel from outside once `completions` more lanes landed;
    True when the call was cancelled (it re-raised the cancellation)."""
    seen = [0]
    with anyio.CancelScope() as scope:

        def observe(event: AnyEvent) -> None:
            if event.type == "lane.completed":
                seen[0] += 1
                if seen[0] == completions:
                    scope.cancel()

        if resume:
            await lanefold.resume(run_id, runs_dir=runs, observer=observe)
        else:
            await lanefold.run(config, "17*23?", runs_dir=runs, run_id=run_id, observer=observe)
    return scope.cancelled_caught


@pytest.mark.anyio
async def test_a_cancelled_run_records_the_interrupt_and_resumes_to_the_same_answer(tmp_path: Path) -> None:
    config = lanefold.parse_config(RAW)
    baseline = await lanefold.run(config, "17*23?", runs_dir=tmp_path, run_id="base")

    assert await run_until(config, tmp_path, "cut", completions=2, resume=False)
    first = events(tmp_path / "cut" / "events.jsonl")
    assert first[-1].type == "run.interrupted"
    assert first[-1].data.reason == "cancelled"  # type: ignore[union-attr]
    cut_off = [e for e in first if e.type == "lane.interrupted"]
    assert cut_off and not [e for e in first if e.type == "lane.failed"]
    assert sorted(tuple(x) for x in first[-1].data.in_flight) == sorted(  # type: ignore[union-attr]
        (e.wave, e.lane) for e in cut_off
    )

    # Interrupted again while resuming: still nothing fails, with max_attempts = 1.
    assert await run_until(config, tmp_path, "cut", completions=2, resume=True)
    result = await lanefold.resume("cut", runs_dir=tmp_path)

    assert (result.answer, result.votes) == (baseline.answer, baseline.votes)
    assert result.lanes_completed == 8 and result.lanes_failed == 0
    log = events(tmp_path / "cut" / "events.jsonl")
    assert sum(e.type == "run.interrupted" for e in log) == 2
    assert sum(e.type == "run.resumed" for e in log) == 2
    seeds: dict[int | None, set[int]] = {}
    for e in log:
        if e.type == "lane.dispatched":
            seeds.setdefault(e.lane, set()).add(e.data.seed)  # type: ignore[union-attr]
    assert all(len(s) == 1 for s in seeds.values()), "a lane keeps its seed across attempts"
    # The bill: decode is what lanes decoded; the cut-off holds are their own line.
    held = [e for e in log if e.type == "lane.interrupted"]
    assert result.usage.decode_tokens == baseline.usage.decode_tokens
    assert (
        result.usage.cut_off_tokens
        == sum(
            e.data.billed.input_tokens  # type: ignore[union-attr]
            + e.data.billed.output_tokens  # type: ignore[union-attr]
            for e in held
        )
        > 0
    )
    assert result.cost.cut_off == pytest.approx(
        sum(
            e.data.billed_cost_usd  # type: ignore[union-attr]
            for e in held
        )
    )
    # A lane re-dispatched without the partner it shared a request with pays its prompt again
    # (which lanes a cut splits depends on timing): prefill may only grow, and the rest is equal.
    assert (
        result.cost.prefill + result.cost.cached_prefill
        >= baseline.cost.prefill + baseline.cost.cached_prefill
    )
    assert result.cost.total == pytest.approx(
        baseline.cost.total
        + result.cost.cut_off
        + (result.cost.prefill - baseline.cost.prefill)
        + (result.cost.cached_prefill - baseline.cost.cached_prefill)
    )


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_cleanly_and_names_the_command_that_resumes_it(
    tmp_path: Path, signum: signal.Signals, code: int
) -> None:
    raw = json.loads(json.dumps(RAW))
    raw["backend"]["latency_ms"] = [300, 900]
    config = tmp_path / "loop.json"
    config.write_text(json.dumps(raw))
    runs = tmp_path / "runs"
    baseline = lanefold.run_sync(lanefold.load_config(config), "17*23?", runs_dir=tmp_path / "base")
    log = runs / "sig" / "events.jsonl"
    proc = start("run", config, "--question", "17*23?", "--runs-dir", runs, "--run-id", "sig")
    deadline = time.monotonic() + 120
    while not (log.exists() and '"lane.completed"' in log.read_text()):
        assert time.monotonic() < deadline, "the run never landed a lane"
        time.sleep(0.01)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.splitlines() == [
        f"orchestrator run: interrupted by {signum.name}; continue with: "
        f"orchestrator resume sig --runs-dir {runs}"
    ]
    assert "Traceback" not in out
    recorded = events(log)
    assert recorded[-1].type == "run.interrupted"
    assert recorded[-1].data.reason == signum.name  # type: ignore[union-attr]
    assert not [e for e in recorded if e.type == "lane.failed"]

    resumed = start("resume", "sig", "--runs-dir", runs, "--json")
    out, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    result = json.loads(out)
    assert (result["answer"], result["votes"]) == (baseline.answer, baseline.votes)
    assert result["lanes_failed"] == 0


def test_the_live_display_of_a_resume_starts_from_what_the_log_holds(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from lanefold.cli._display import Progress

    config = lanefold.parse_config(RAW)
    assert anyio.run(lambda: run_until(config, tmp_path, "shown", completions=3, resume=False))
    state = read_state(lanefold.RunStore(tmp_path), "shown")
    progress = Progress(Console(file=io.StringIO()))
    progress.resume_from(state)
    assert (progress.k, progress.phase) == (8, "sample")
    assert progress.done == 3 and progress.tokens == state.spend.tokens > 0
