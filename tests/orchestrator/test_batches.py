"""Batches for agent code: `run_many` and `run` that resume runs they find and return failures
as results, and a synchronous Session that keeps its backend across calls.

Failures are injected by the backend per question (every lane of a marked question fails),
never by chance; the crash is a real SIGKILL of a process running a batch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import LaneFailure, LaneOutcome, SampleRequest, ServerError

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = [f"What is {i} + {i}?" for i in range(20)]
FAILING = {3, 7, 8, 15}


def config(**loop: Any) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": 3, "seed": 7, "min_quorum": 2, **loop},
            "backend": {"kind": "simulated", "accuracy": 0.7},
            "prompt": {"template": "{question}"},
            "retry": {"max_attempts": 1},
        }
    )


class Faulty(SimulatedBackend):
    """The simulated backend, every lane of a question in `failing` answered by a server
    error; `requests` counts what was sampled."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__(SimulatedConfig(accuracy=0.7))
        self.failing = failing
        self.sampled: list[str] = []

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.sampled.append(request.prompt)
        if request.prompt in self.failing:
            for lane in request.lanes:
                yield LaneFailure(lane.lane, ServerError("injected: the server fell over"))
            return
        async for outcome in super().sample(request):
            yield outcome


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


def faulty() -> Faulty:
    return Faulty({QUESTIONS[i] for i in FAILING})


@pytest.mark.anyio
async def test_a_batch_with_failures_returns_every_result_with_errors_return(runs: Path) -> None:
    ids = [f"b{i}" for i in range(20)]
    async with lanefold.Session(config(), backend=faulty(), runs_dir=runs) as session:
        results = [r async for r in session.run_many(QUESTIONS, concurrency=4, run_ids=ids, errors="return")]
    assert sorted(r.index for r in results if r.index is not None) == list(range(20))
    failed = {r.index: r for r in results if r.status == "failed"}
    assert set(failed) == FAILING
    for index, result in failed.items():
        assert result.error is not None and result.answer is None
        assert (result.error.type, result.error.exit_code) == ("QuorumNotMetError", 1)
        assert "\n" not in result.error.message and result.run_id == f"b{index}"
        assert result.lanes_failed == 3 and result.events == str(runs / f"b{index}" / "events.jsonl")
        assert result.question == QUESTIONS[index]
    assert all(r.status == "answered" and r.error is None for r in results if r.index not in FAILING)
    assert "error" not in results[0].model_dump() or results[0].status == "failed"


@pytest.mark.anyio
async def test_the_default_still_raises_the_first_failure(runs: Path) -> None:
    async with lanefold.Session(config(), backend=faulty(), runs_dir=runs) as session:
        with pytest.raises(lanefold.QuorumNotMetError):
            async for _ in session.run_many(QUESTIONS[:4], concurrency=1):
                pass


@pytest.mark.anyio
async def test_resume_true_finishes_a_batch_and_samples_nothing_twice(runs: Path) -> None:
    ids = [f"r{i}" for i in range(6)]
    backend = faulty()
    async with lanefold.Session(config(), backend=backend, runs_dir=runs) as session:
        first = {r.index: r async for r in session.run_many(QUESTIONS[:6], run_ids=ids, errors="return")}
        with pytest.raises(lanefold.ConfigError, match="a run with this id already exists"):
            async for _ in session.run_many(QUESTIONS[:6], run_ids=ids):
                pass  # the default is as before: an id is a new run
        sampled = len(backend.sampled)
        again = {
            r.index: r
            async for r in session.run_many(QUESTIONS[:6], run_ids=ids, resume=True, errors="return")
        }
        assert len(backend.sampled) == sampled, "finished runs give their record"
        assert again == first  # the recorded failure too, with what it spent
        one = await session.run(QUESTIONS[0], run_id="r0", resume=True)
        assert one == first[0].model_copy(update={"index": None})
        with pytest.raises(lanefold.ConfigError, match="holds a run of another question"):
            await session.run(QUESTIONS[1], run_id="r0", resume=True)
        fresh = await session.run(QUESTIONS[1], run_id="new", resume=True)  # not there: a run
        assert fresh.status == "answered"


@pytest.mark.anyio
async def test_errors_must_be_raise_or_return(runs: Path) -> None:
    async with lanefold.Session(config(), backend=faulty(), runs_dir=runs) as session:
        with pytest.raises(lanefold.ConfigError, match="errors: 'ignore'"):
            await session.run("q", errors="ignore")  # type: ignore[arg-type]
        with pytest.raises(lanefold.ConfigError, match="run_ids: two questions"):
            async for _ in session.run_many(["q", "r"], run_ids=["a", "a"]):
                pass


# -- a batch killed with SIGKILL, the same call again -----------------------------------------------

BATCH = """
import sys
import lanefold

config = lanefold.parse_config({
    "loop": {"k": 4, "max_concurrency": 4, "seed": 3},
    "backend": {"kind": "simulated", "latency_ms": [40, 160], "lanes_per_request": 1},
    "prompt": {"template": "{question}"}})
# enough questions that the batch is still going when the test, on a loaded machine, kills it
questions = [f"What is {i} + {i}?" for i in range(80)]
with lanefold.SyncSession(config, runs_dir=sys.argv[1]) as session:
    for result in session.run_many(questions, concurrency=4, run_ids=[f"b{i}" for i in range(80)],
                                   resume=True, errors="return"):
        print(result.index, result.status, result.resumes, flush=True)
"""


def batch(folder: Path, runs: Path) -> subprocess.Popen[str]:
    script = folder / "batch.py"
    script.write_text(BATCH)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, str(script), str(runs)],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def events(runs: Path, run_id: str) -> list[dict[str, Any]]:
    lines = (runs / run_id / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _mid_flight(runs: Path) -> bool:
    """Whether a run in `runs` has lanes dispatched and has not ended (read as it is written:
    a line cut short is a run still writing)."""
    for log in runs.glob("*/events.jsonl"):
        try:
            kinds = [json.loads(line)["type"] for line in log.read_text().splitlines()]
        except (OSError, ValueError):
            return True
        if "lane.dispatched" in kinds and kinds[-1] not in ("run.completed", "run.failed"):
            return True
    return False


@pytest.mark.slow
def test_after_a_sigkill_the_same_call_with_resume_finishes_the_batch(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = batch(tmp_path, runs)
    assert first.stdout is not None
    finished = [first.stdout.readline() for _ in range(5)]  # five questions done
    assert all(line.strip() for line in finished), first.stderr.read() if first.stderr else ""
    # Killed once a run is seen mid-flight on disk: five results printed do not mean runs in
    # flight (run_many may have finished the next ones before the printing thread caught up).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _mid_flight(runs):
        time.sleep(0.002)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate(timeout=60)
    before = {run.name: events(runs, run.name) for run in runs.iterdir() if (run / "events.jsonl").is_file()}
    cut = [run_id for run_id, log in before.items() if log[-1]["type"] != "run.completed"]
    assert cut, "the kill found runs in flight"

    second = batch(tmp_path, runs)
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    rows = [line.split() for line in out.splitlines()]
    assert sorted(int(index) for index, _, _ in rows) == list(range(80))
    assert {status for _, status, _ in rows} == {"answered"}
    assert {f"b{index}" for index, _, resumes in rows if resumes == "1"} == set(cut)
    for run_id in before:
        log = events(runs, run_id)
        completed = Counter((e["wave"], e["lane"]) for e in log if e["type"] == "lane.completed")
        assert set(completed.values()) == {1}, f"{run_id}: a lane completed twice"
        done_before = {(e["wave"], e["lane"]) for e in before[run_id] if e["type"] == "lane.completed"}
        sent_after = {
            (e["wave"], e["lane"]) for e in log[len(before[run_id]) :] if e["type"] == "lane.dispatched"
        }
        assert not sent_after & done_before, f"{run_id}: a completed lane was sent again"


# -- the synchronous Session ------------------------------------------------------------------------


def test_a_sync_session_keeps_its_backend_across_calls(runs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Faulty] = []

    def build(section: Any) -> Faulty:
        built.append(faulty())
        return built[-1]

    monkeypatch.setattr("lanefold.execution._session.build_backend", build)
    with lanefold.SyncSession(config(), runs_dir=runs) as session:
        answers = [session.run(question, errors="return").status for question in QUESTIONS[:10]]
        results = list(session.run_many(QUESTIONS[10:], errors="return"))
    assert len(built) == 1, "one backend for every call"
    assert answers.count("failed") == 3 and answers.count("answered") == 7
    assert sorted(r.index for r in results if r.index is not None) == list(range(10))
    with lanefold.SyncSession(config(), runs_dir=runs) as session, pytest.raises(lanefold.QuorumNotMetError):
        session.run(QUESTIONS[3])


@pytest.mark.anyio
async def test_a_sync_session_works_inside_a_running_event_loop(runs: Path) -> None:
    backend = faulty()
    with lanefold.SyncSession(config(), backend=backend, runs_dir=runs) as session:
        result = session.run(QUESTIONS[0], run_id="nb")
        again = session.resume("nb")
    assert result == again and result.status == "answered"
    assert backend.sampled == [QUESTIONS[0]]


def test_leaving_a_sync_run_many_early_interrupts_the_runs_in_flight(runs: Path) -> None:
    slow = lanefold.parse_config(
        {
            "loop": {"k": 2, "seed": 1},
            "prompt": {"template": "{question}"},
            "backend": {"kind": "simulated", "latency_ms": [0, 0]},
        }
    )
    latency = {QUESTIONS[0]: 0.0, QUESTIONS[1]: 30.0}

    class Slow(SimulatedBackend):
        async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
            await anyio.sleep(latency[request.prompt])
            async for outcome in super().sample(request):
                yield outcome

    with lanefold.SyncSession(slow, backend=Slow(SimulatedConfig()), runs_dir=runs) as s:
        for result in s.run_many(QUESTIONS[:2], concurrency=2, run_ids=["fast", "slow"]):
            assert result.index == 0
            break
    assert events(runs, "fast")[-1]["type"] == "run.completed"
    assert events(runs, "slow")[-1]["type"] == "run.interrupted", "stopped, not waited for"


@pytest.mark.slow
def test_a_sync_agent_loop_of_ten_questions_loads_the_model_once(
    runs: Path, smollm2_loads: list[Any]
) -> None:
    agent = lanefold.parse_config(
        {
            "loop": {"k": 2, "seed": 0},
            "sampling": {"max_tokens": 4, "stop": ["\n"]},
            "prompt": {"template": "Question: What is 2 plus 2?\nAnswer: 4\n\nQuestion: {question}\nAnswer:"},
            "extract": {"method": "last_number"},
        }
    )
    with lanefold.SyncSession(agent, runs_dir=runs) as session:
        results = [session.run(f"What is {i} plus 1?") for i in range(10)]
    assert len(smollm2_loads) == 1
    assert [r.status for r in results].count("answered") >= 5
