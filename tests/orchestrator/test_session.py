"""The Session: backends built and loaded once for many runs, closed when it built them and
never when it was given them; `run_many` in completion order; the sync wrappers.

Order is decided by events the test sets, never by timing: a gated backend holds each
question's lanes until the test opens that question's gate.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
import lanefold.execution._session as session_module
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import LaneOutcome, SampleRequest

SIMULATED = {"kind": "simulated", "accuracy": 0.6}


def config(**loop: Any) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": 3, "seed": 7, **loop},
            "backend": dict(SIMULATED),
            "prompt": {"template": "{question}"},  # the prompt is the question: gates find it
            "retry": {"max_attempts": 1},
        }
    )


def log_types(runs: Path, run_id: str) -> list[str]:
    lines = (runs / run_id / "events.jsonl").read_text().splitlines()
    return [json.loads(line)["type"] for line in lines]


class Counting(SimulatedBackend):
    """The simulated backend, counting `load` and `aclose` calls."""

    def __init__(self, config: SimulatedConfig | None = None) -> None:
        super().__init__(config or SimulatedConfig(**{k: v for k, v in SIMULATED.items() if k != "kind"}))
        self.loads = self.closes = 0

    async def load(self) -> None:
        self.loads += 1

    async def aclose(self) -> None:
        self.closes += 1


class Gated(Counting):
    """Holds a question's lanes until its gate opens; `waiting` sees who is held."""

    def __init__(self, questions: list[str]) -> None:
        super().__init__()
        self.gates = {question: anyio.Event() for question in questions}
        self.waiting: list[str] = []
        self.changed = anyio.Event()
        self.active = self.peak = 0
        self.fail: set[str] = set()

    async def until_waiting(self, count: int) -> None:
        while len(self.waiting) < count:
            await self.changed.wait()

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        question = request.prompt
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.waiting.append(question)
        self.changed.set()
        self.changed = anyio.Event()
        try:
            if question in self.fail:  # fails once every other question is held
                await self.until_waiting(len(self.gates))
                raise RuntimeError(f"a bug on {question!r}")
            await self.gates[question].wait()
            async for outcome in super().sample(request):
                yield outcome
        finally:
            self.waiting.remove(question)
            self.active -= 1


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Counting]:
    """Every backend a Session builds from its config, as a Counting backend."""
    made: list[Counting] = []

    def build(section: Any) -> Counting:
        assert isinstance(section, SimulatedConfig)
        made.append(Counting(section))
        return made[-1]

    monkeypatch.setattr(session_module, "build_backend", build)
    return made


# -- backends: built once, loaded once, closed only when built here ---------------------------------


@pytest.mark.anyio
async def test_a_given_backend_is_loaded_once_and_never_closed(runs: Path) -> None:
    backend = Counting()
    async with lanefold.Session(config(), backend=backend, runs_dir=runs) as session:
        assert backend.loads == 1, "loaded on entry, before the first question"
        first = await session.run("What is 17 * 23?")
        second = await session.run("What is 17 * 23?")
    assert first.run_id != second.run_id
    assert first.answer is not None and second.answer is not None
    assert backend.requests == 2, "both runs sampled on the given backend"
    assert (backend.loads, backend.closes) == (1, 0)


@pytest.mark.anyio
async def test_two_runs_share_one_built_backend_loaded_once_and_closed_on_exit(
    runs: Path, built: list[Counting]
) -> None:
    async with lanefold.Session(config(), runs_dir=runs) as session:
        assert len(built) == 1 and built[0].loads == 1
        await session.run("What is 17 * 23?")
        await session.run("What is 17 * 23?")
        assert len(built) == 1, "the second run reused the first run's backend"
        assert (built[0].loads, built[0].closes, built[0].requests) == (1, 0, 2)
    assert built[0].closes == 1, "what the session built, it closes"


@pytest.mark.anyio
async def test_concurrent_resumes_in_a_session_without_config_build_one_backend(
    runs: Path, built: list[Counting]
) -> None:
    # Two runs interrupted mid-wave (a cancelled caller): resumable, with one recorded backend.
    questions = ["first question", "second question"]
    held = Gated(questions)
    async with anyio.create_task_group() as tg:
        for question in questions:
            tg.start_soon(
                lambda q=question: lanefold.run(config(), q, runs_dir=runs, run_id=q.split()[0], backend=held)
            )
        with anyio.fail_after(30):
            await held.until_waiting(2)
        tg.cancel_scope.cancel()
    assert [log_types(runs, r)[-1] for r in ("first", "second")] == ["run.interrupted"] * 2

    async with lanefold.Session(runs_dir=runs) as session:  # no config: builds on demand
        assert built == []
        results: dict[str, lanefold.RunResult] = {}

        async def resume(run_id: str) -> None:
            results[run_id] = await session.resume(run_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(resume, "first")
            tg.start_soon(resume, "second")
        assert len(built) == 1, "two resumes at once built one backend"
        assert (built[0].loads, built[0].closes, built[0].requests) == (1, 0, 2)
    assert built[0].closes == 1
    assert {r.resumes for r in results.values()} == {1}


@pytest.mark.anyio
async def test_a_resumed_run_with_another_backend_gets_its_own_closed_with_the_session(
    runs: Path, built: list[Counting]
) -> None:
    # Session's docstring: "A run resumed here whose recorded backend differs from the
    # session's gets one built for it, kept (for later runs of that backend) until the
    # session closes."
    other = lanefold.parse_config(
        {
            "loop": {"k": 3, "seed": 7},
            "backend": {**SIMULATED, "answer": "42"},
            "prompt": {"template": "{question}"},
        }
    )
    held = Gated(["old question"])
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: lanefold.run(other, "old question", runs_dir=runs, run_id="old", backend=held))
        with anyio.fail_after(30):
            await held.until_waiting(1)
        tg.cancel_scope.cancel()

    async with lanefold.Session(config(), runs_dir=runs) as session:
        [own] = built
        result = await session.resume("old")
        assert result.resumes == 1
        assert len(built) == 2, "the recorded backend, built for the resume"
        assert built[1].config.answer == "42" and built[1].loads == 1
        assert built[1].closes == 0, "kept for later runs of that backend"
        assert own.closes == 0
    assert [b.closes for b in built] == [1, 1]


# -- run_many -----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_run_many_yields_each_index_once_in_completion_order(runs: Path) -> None:
    questions = [f"question {i}" for i in range(4)]
    backend = Gated(questions)
    finishing = [2, 0, 3, 1]  # the order the test opens the gates in
    seen: list[int] = []

    async def open_first() -> None:
        # Once all four are in flight: a run's first line goes down in a worker thread, so the
        # first gate opened at once could let one run end before the last has started.
        await backend.until_waiting(len(questions))
        backend.gates[questions[finishing[0]]].set()

    with anyio.fail_after(30):
        async with (
            lanefold.Session(config(), backend=backend, runs_dir=runs) as session,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(open_first)
            async for result in session.run_many(questions, concurrency=4):
                seen.append(result.index)
                assert result.question == questions[result.index]
                assert result.answer is not None
                if len(seen) < len(finishing):  # the next gate opens only after this result
                    backend.gates[questions[finishing[len(seen)]]].set()
    assert seen == finishing
    assert backend.peak == 4


@pytest.mark.anyio
async def test_run_many_runs_at_most_concurrency_questions_at_once(runs: Path) -> None:
    questions = [f"question {i}" for i in range(5)]
    backend = Gated(questions)
    seen: list[int] = []
    with anyio.fail_after(30):
        async with lanefold.Session(config(), backend=backend, runs_dir=runs) as session:

            async def release() -> None:
                await backend.until_waiting(2)  # two held: the bound is reached ...
                for question in questions:
                    backend.gates[question].set()  # ... then let every question through

            async with anyio.create_task_group() as tg:
                tg.start_soon(release)
                async for result in session.run_many(
                    questions, concurrency=2, run_ids=[f"r{i}" for i in range(5)]
                ):
                    seen.append(result.index)
    assert sorted(seen) == list(range(5))
    assert backend.peak == 2
    assert all((runs / f"r{i}" / "events.jsonl").is_file() for i in range(5))


@pytest.mark.anyio
async def test_run_many_raises_the_failing_runs_error_and_interrupts_the_rest(runs: Path) -> None:
    questions = ["held question", "bad question"]
    backend = Gated(questions)
    backend.fail.add("bad question")
    with anyio.fail_after(30):
        async with lanefold.Session(config(), backend=backend, runs_dir=runs) as session:
            with pytest.raises(lanefold.RunError, match="a bug on 'bad question'"):
                try:
                    async for _ in session.run_many(questions, concurrency=2, run_ids=["held", "bad"]):
                        pass
                except BaseExceptionGroup as group:  # the caller must get the run's own error
                    pytest.fail(f"run_many raised a task group's {group!r}, not the RunError")
    assert log_types(runs, "bad")[-1] == "run.failed"
    assert log_types(runs, "held")[-1] == "run.interrupted", "cut off, and resumable"


@pytest.mark.anyio
async def test_breaking_out_of_run_many_interrupts_the_runs_in_flight(runs: Path) -> None:
    questions = ["fast question", "held question"]
    backend = Gated(questions)
    backend.gates["fast question"].set()
    with anyio.fail_after(30):
        async with lanefold.Session(config(), backend=backend, runs_dir=runs) as session:
            results = session.run_many(questions, concurrency=2, run_ids=["fast", "held"])
            try:
                async for result in results:
                    assert result.index == 0
                    break
            finally:
                try:
                    await results.aclose()  # type: ignore[attr-defined]  # an async generator
                except BaseExceptionGroup as group:
                    pytest.fail(f"closing run_many early raised {group!r}")
    assert log_types(runs, "fast")[-1] == "run.completed"
    assert log_types(runs, "held")[-1] == "run.interrupted"


@pytest.mark.anyio
async def test_run_many_refuses_bad_arguments_before_any_run(runs: Path) -> None:
    async with lanefold.Session(config(), backend=Counting(), runs_dir=runs) as session:
        with pytest.raises(lanefold.ConfigError, match="concurrency"):
            async for _ in session.run_many(["q"], concurrency=0):
                pass
        with pytest.raises(lanefold.ConfigError, match="run_ids"):
            async for _ in session.run_many(["q", "r"], run_ids=["only-one"]):
                pass
        with pytest.raises(lanefold.ConfigError, match="question"):
            async for _ in session.run_many(["q", "  "]):
                pass
    assert not await anyio.Path(runs).exists()


# -- the sync wrappers ---------------------------------------------------------------------------------


def test_run_sync_runs_one_question(runs: Path) -> None:
    result = lanefold.run_sync(config(), "What is 17 * 23?", runs_dir=runs, run_id="sync")
    assert result.run_id == "sync" and result.answer is not None
    assert log_types(runs, "sync")[-1] == "run.completed"
    again = lanefold.resume_sync("sync", runs_dir=runs)
    assert again == result, "a finished run's resume returns its recorded result"


@pytest.mark.anyio
async def test_run_sync_works_inside_a_running_event_loop(runs: Path) -> None:
    # A notebook cell: an event loop already runs in this thread.
    backend = Counting()
    result = lanefold.run_sync(config(), "What is 17 * 23?", runs_dir=runs, run_id="nb", backend=backend)
    assert result.answer is not None
    assert (backend.requests, backend.closes) == (1, 0)


@pytest.mark.anyio
async def test_a_run_given_a_seed_is_the_run_of_a_config_with_that_seed(tmp_path: Path) -> None:
    async with lanefold.Session(config(k=8), runs_dir=tmp_path) as session:
        given = await session.run("What is 17 * 23?", run_id="given", seed=11)
        other = await session.run("What is 17 * 23?", run_id="other")
    async with lanefold.Session(config(k=8, seed=11), runs_dir=tmp_path) as session:
        configured = await session.run("What is 17 * 23?", run_id="configured")
    assert given.votes == configured.votes and given.lanes == configured.lanes
    assert [lane.answer for lane in given.lanes] != [lane.answer for lane in other.lanes]
    started = json.loads((tmp_path / "given" / "events.jsonl").read_text().splitlines()[0])
    assert started["data"]["config"]["loop"]["seed"] == 11  # recorded: a resume keeps it
    assert lanefold.resume_sync("given", runs_dir=tmp_path) == given
