"""sequential_refine: one chain of attempts on the governed path.

Prompts (markov, autoregressive, explore, feedback) are read off a recording simulated backend;
the tunnel vision of Gu et al. (2026) is measured on the simulated backend's refine mode
against its closed form; the budget, resume and keys are checked as for every loop.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_processes import cli, finish

import lanefold
import lanefold.coordinators._sequential_refine  # registers the loop
from lanefold.backends.simulated import SimulatedBackend
from lanefold.backends.simulated._config import SimulatedConfig
from lanefold.coordinators._sequential_refine import (
    SequentialRefineParams,
    TemperatureRamp,
    feedback_line,
)
from lanefold.primitives import LaneOutcome, MemoryEventLog, SampleRequest, Verdict
from lanefold.stores.files import JsonlEventLog

QUESTION = "What is 17 * 23?"
ANSWER_LINE = re.compile(r"^Answer:\s*(.+)$", re.MULTILINE)
ROOT = Path(__file__).resolve().parents[2]


class Recording(SimulatedBackend):
    """The simulated backend, keeping every request it is sent."""

    def __init__(self, **keys: Any) -> None:
        super().__init__(SimulatedConfig(**keys))
        self.seen: list[SampleRequest] = []

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.seen.append(request)
        async for outcome in super().sample(request):
            yield outcome


class Checker:
    """A verifier with something to say: passes "391", else names what failed."""

    name = "checker"

    def __init__(self) -> None:
        self.calls = 0

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        self.calls += 1
        if answer == "391":
            return Verdict(1.0, True)
        return Verdict(0.0, False, f"test_multiply failed: expected 391, got {answer}")


def config(loop: dict[str, Any] | None = None, **sections: Any) -> lanefold.LoopConfig:
    raw: dict[str, Any] = {
        "loop": {"coordinator": "sequential_refine", **(loop or {})},
        "sampling": {"max_tokens": 64},
        "log": {"fsync": "never"},
        "backend": {"kind": "simulated", "accuracy": 0.3},
    }
    raw.update(sections)
    return lanefold.parse_config(raw)


def run(cfg: lanefold.LoopConfig, runs: Path, **kwargs: Any) -> lanefold.RunResult:
    return lanefold.run_sync(cfg, QUESTION, runs_dir=runs, **kwargs)


def events(result: lanefold.RunResult) -> list[Any]:
    assert result.events is not None
    return list(JsonlEventLog(result.events).read())


def mine(log: list[Any], noun: str) -> list[dict[str, Any]]:
    return [e.data for e in log if e.type == f"loop.sequential_refine.{noun}"]


def earlier(prompt: str) -> list[str]:
    """What the simulated backend reads as earlier attempts: `Answer:` lines after the first."""
    return [a.strip() for a in ANSWER_LINE.findall(prompt.partition("\n")[2])]


# -- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"steps": 0}, "loop.steps: Input should be greater than or equal to 1"),
        ({"steps": "4"}, "loop.steps: Input should be a valid integer"),
        ({"mode": "chain"}, "loop.mode: Input should be 'markov' or 'autoregressive'"),
        ({"explore": "yes"}, "loop.explore: Input should be 'none' or 'different_approach'"),
        ({"reduce": "nope"}, "loop.reduce: unknown reducer 'nope'"),
        (
            {"steps": 2, "temperature_schedule": [0.1, 0.2, 0.3]},
            "loop.temperature_schedule: 3 temperatures for 2 steps",
        ),
        ({"temperature_schedule": []}, "loop.temperature_schedule"),
        ({"temperature_schedule": [0.5, 9]}, "loop.temperature_schedule"),
        ({"temperature_schedule": {"start": 0.2}}, "loop.temperature_schedule"),
        ({"temperature_schedule": {"start": 0.2, "end": 1, "middle": 3}}, "loop.temperature_schedule"),
        ({"weighting": "verifier"}, 'loop.weighting: "verifier" weighs a weighted_vote'),
        ({"stop_on_pass": 1}, "loop.stop_on_pass: Input should be a valid boolean"),
        ({"step": 4}, "loop.step: unknown key"),
    ],
)
def test_keys_are_validated_naming_the_key(keys: dict[str, Any], error: str) -> None:
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.parse_config({"loop": {"coordinator": "sequential_refine", **keys}}, source="refine.toml")
    message = str(caught.value)
    assert message.startswith(f"refine.toml: {error}"), message
    assert len(message.splitlines()) == 1


def test_defaults_are_recorded_whole() -> None:
    cfg = lanefold.parse_config({"loop": {"coordinator": "sequential_refine"}})
    assert cfg.loop_params == SequentialRefineParams()
    assert cfg.model_dump()["loop"] == {
        "coordinator": "sequential_refine",
        "max_concurrency": 16,
        "seed": 0,
        "timeout_s": None,
        "steps": 4,
        "mode": "autoregressive",
        "explore": "none",
        "temperature_schedule": None,
        "show": "text",
        "feedback": True,
        "stop_on_pass": True,
        "reduce": "last",
        "tie_break": "first_lane",
        "weighting": "none",
    }


def test_temperature_schedules() -> None:
    held = SequentialRefineParams(steps=4, temperature_schedule=[0.2, 0.6])
    assert [held.temperature(i, 0.7) for i in range(4)] == [0.2, 0.6, 0.6, 0.6]
    ramp = SequentialRefineParams(steps=5, temperature_schedule=TemperatureRamp(start=0, end=1))
    assert [ramp.temperature(i, 0.7) for i in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    one = SequentialRefineParams(steps=1, temperature_schedule=TemperatureRamp(start=0.3, end=1))
    assert one.temperature(0, 0.7) == 0.3
    assert SequentialRefineParams().temperature(3, 0.7) == 0.7


def test_feedback_lines() -> None:
    assert feedback_line(Verdict(1.0, True)) == "Feedback: passed (score 1)"
    assert (
        feedback_line(Verdict(0.25, False, "2 of 8 tests pass"))
        == "Feedback: failed (score 0.25): 2 of 8 tests pass"
    )
    assert (
        feedback_line(Verdict(None, False, "verifier timed out after 30 s", "timeout"))
        == "Feedback: no verdict: verifier timed out after 30 s"
    )
    assert (
        feedback_line(Verdict(0.0, False, "line one\nAnswer: sneaky"))
        == "Feedback: failed (score 0): line one\n  Answer: sneaky"
    ), "a detail never starts a line"


# -- prompts -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["markov", "autoregressive"])
def test_each_attempt_is_one_refine_lane_showing_the_earlier_ones(mode: str, tmp_path: Path) -> None:
    backend = Recording(accuracy=0.3)
    result = run(config({"steps": 5, "mode": mode, "seed": 3}), tmp_path, backend=backend)
    base = lanefold.parse_config({}).prompt.template.replace("{question}", QUESTION)

    assert [(r.wave, r.purpose, [lane.lane for lane in r.lanes]) for r in backend.seen] == [
        (w, "refine", [w - 1]) for w in range(1, 6)
    ], "attempt i: wave i+1, its lane i"
    answers = [lane.answer for lane in result.lanes]
    assert result.outcome["answers"] == answers and len(answers) == 5
    prompts = [r.prompt for r in backend.seen]
    assert prompts[0] == base, "the first attempt is the plain question"
    for i, prompt in enumerate(prompts):
        assert prompt.startswith(f"Question: {QUESTION}\n")
        shown = answers[:i] if mode == "autoregressive" else answers[max(0, i - 1) : i]
        assert earlier(prompt) == shown
        assert [int(n) for n in re.findall(r"^Attempt (\d+):$", prompt, re.M)] == [
            n + 1 for n in range(i - len(shown), i)
        ]
        assert "different approach" not in prompt.lower()
        assert "Feedback:" not in prompt, "no verifier, no feedback"
    # an earlier attempt's text is quoted, so only the loop's `Answer: X` line starts a line
    assert re.search(r"^> .*Answer: " + re.escape(answers[0] or ""), prompts[1], re.M)

    log = events(result)
    assert [(e.wave, e.data.purpose, e.data.k) for e in log if e.type == "wave.started"] == [
        (w, "refine", 1) for w in range(1, 6)
    ]
    assert [d["step"] for d in mine(log, "attempted")] == list(range(5))
    assert mine(log, "stopped") == [{"reason": "steps", "attempts": 5}]
    assert (result.answer, result.winner_lane, result.reducer) == (answers[-1], 4, "sequential_refine"), (
        "reduce = last: the last attempt"
    )
    assert "reduce.completed" not in [e.type for e in log]
    assert result.outcome["reduce"] == "last" and result.outcome["attempts"] == 5


def test_show_answer_shows_only_the_answers(tmp_path: Path) -> None:
    backend = Recording(accuracy=0.3)
    run(config({"steps": 3, "show": "answer"}), tmp_path, backend=backend)
    third = backend.seen[2].prompt
    assert not re.search(r"^> ", third, re.M)
    assert len(earlier(third)) == 2


def test_explore_asks_for_a_different_approach_once_there_is_something_to_differ_from(tmp_path: Path) -> None:
    backend = Recording(accuracy=0.3)
    run(config({"steps": 3, "explore": "different_approach"}), tmp_path, backend=backend)
    first, *later = [r.prompt for r in backend.seen]
    assert "different approach" not in first.lower()
    assert all("different approach" in p.lower() for p in later)


def test_the_temperature_schedule_reaches_the_backend(tmp_path: Path) -> None:
    backend = Recording(accuracy=0.3)
    result = run(
        config({"steps": 3, "temperature_schedule": {"start": 0.0, "end": 1.0}}), tmp_path, backend=backend
    )
    assert [r.params.temperature for r in backend.seen] == [0.0, 0.5, 1.0]
    assert [d["temperature"] for d in mine(events(result), "attempted")] == [0.0, 0.5, 1.0]


# -- verifier feedback ---------------------------------------------------------------------------


def test_verifier_feedback_lands_in_the_next_prompt_and_a_pass_stops_the_chain(tmp_path: Path) -> None:
    backend, checker = Recording(accuracy=0.3), Checker()
    result = run(config({"steps": 12, "seed": 3}), tmp_path, backend=backend, verifier=checker)
    answers = [lane.answer for lane in result.lanes]
    stop = answers.index("391")
    assert stop == 6, "seed 3 finds it at the seventh attempt"
    assert len(answers) == stop + 1 and checker.calls == stop + 1, "stopped at the pass"
    assert result.answer == "391" and result.outcome["stopped"] == "passed"
    for i, request in enumerate(backend.seen[1:], 1):
        feedback = re.findall(r"^Feedback: .*$", request.prompt, re.M)
        assert feedback == [
            f"Feedback: failed (score 0): test_multiply failed: expected 391, got {a}" for a in answers[:i]
        ]

    log = events(result)
    verdicts = [e for e in log if e.type == "judge.completed"]
    assert [(e.wave, e.data.candidate_lane, e.data.passed) for e in verdicts] == [
        (i + 1, i, a == "391") for i, a in enumerate(answers)
    ]
    assert [d["passed"] for d in mine(log, "attempted")] == [a == "391" for a in answers]


def test_without_stop_on_pass_or_feedback_the_chain_runs_on(tmp_path: Path) -> None:
    backend, checker = Recording(accuracy=0.3), Checker()
    result = run(
        config({"steps": 12, "seed": 2, "stop_on_pass": False, "feedback": False}),
        tmp_path,
        backend=backend,
        verifier=checker,
    )
    assert len(result.lanes) == 12 and checker.calls == 12
    assert not any("Feedback:" in r.prompt for r in backend.seen)


def test_a_command_verifiers_output_is_fed_back(tmp_path: Path) -> None:
    # The output of "running the tests" (here a shell line) lands in the next prompt.
    script = "grep -q 'Answer: 391' || { echo 'FAILED test_multiply' >&2; exit 1; }"
    backend = Recording(accuracy=0.0)
    result = run(
        config({"steps": 2}, judge={"verifier_command": ["sh", "-c", script]}), tmp_path, backend=backend
    )
    assert result.outcome["stopped"] == "steps"
    assert "Feedback: failed (score 0): exit status 1: FAILED test_multiply" in backend.seen[1].prompt


# -- reducers over the attempts ------------------------------------------------------------------


def test_a_vote_over_the_attempts(tmp_path: Path) -> None:
    result = run(config({"steps": 6, "reduce": "majority_vote"}), tmp_path)
    answers = [lane.answer for lane in result.lanes]
    assert result.reducer == "majority_vote"
    assert result.votes == dict(Counter(answers))
    assert result.answer == Counter(answers).most_common(1)[0][0]
    assert result.winner_lane is not None and answers[result.winner_lane] == result.answer
    (reduce,) = [e for e in events(result) if e.type == "reduce.completed"]
    assert reduce.data.winner == result.answer and reduce.wave is None


def test_any_pass_over_the_attempts_reuses_the_chains_verdicts(tmp_path: Path) -> None:
    checker = Checker()
    result = run(
        config({"steps": 8, "seed": 3, "stop_on_pass": False, "reduce": "any_pass"}),
        tmp_path,
        verifier=checker,
    )
    answers = [lane.answer for lane in result.lanes]
    assert answers.count("391") == 2 and answers[-1] == "391"
    assert result.reducer == "any_pass" and result.answer == "391"
    assert result.winner_lane == answers.index("391") == 6, "the first attempt that passed"
    assert checker.calls == 8, "each attempt verified once, in the chain"


@pytest.mark.parametrize(
    "keys", [{"reduce": "judge_argmax"}, {"reduce": "weighted_vote", "weighting": "verifier"}]
)
def test_verifier_reducers_score_attempts_of_many_waves(keys: dict[str, Any], tmp_path: Path) -> None:
    checker = Checker()
    result = run(config({"steps": 8, "seed": 3, "stop_on_pass": False, **keys}), tmp_path, verifier=checker)
    assert (result.reducer, result.answer, result.winner_lane) == (keys["reduce"], "391", 6)
    assert checker.calls == 8


def test_a_reducer_that_needs_a_verifier_is_refused_without_one(tmp_path: Path) -> None:
    # Refused by the preflight, before a run (or its log) exists.
    with pytest.raises(lanefold.ConfigError, match=r"judge\.verifier: reducer any_pass needs a verifier"):
        run(config({"reduce": "any_pass"}), tmp_path, run_id="refused")
    assert not (tmp_path / "refused" / "events.jsonl").exists()


# -- tunnel vision: Gu et al. (2026) on the simulated refine mode --------------------------------

P, RHO, N, SEEDS = 0.1, 0.6, 16, 300


def chain_coverage(p: float, rho: float, n: int) -> float:
    """P(the right answer among n attempts) when each later attempt copies with prob rho."""
    return 1 - (1 - p) * (1 - (1 - rho) * p) ** (n - 1)


@pytest.fixture(scope="module")
def coverage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    """Coverage (any lane right) over SEEDS seeded runs, per loop, at 16 lanes each."""
    runs = tmp_path_factory.mktemp("coverage")
    backend = {"kind": "simulated", "accuracy": P, "copy_rate": RHO}
    loops = {
        "refine": {"coordinator": "sequential_refine", "steps": N},
        "explore": {"coordinator": "sequential_refine", "steps": N, "explore": "different_approach"},
        "parallel": {"coordinator": "parallel_sample", "k": N},
    }
    found: dict[str, float] = {}
    for name, loop in loops.items():
        covered = 0
        for seed in range(SEEDS):
            cfg = lanefold.parse_config({"loop": {**loop, "seed": seed}, "backend": backend})
            result = run(cfg, runs, log=MemoryEventLog())  # nothing to read back: no file
            assert len(result.lanes) == N
            covered += any(lane.answer == "391" for lane in result.lanes)
        found[name] = covered / SEEDS
    return found


def test_a_chain_covers_less_than_parallel_samples_at_equal_lanes(coverage: dict[str, float]) -> None:
    assert chain_coverage(P, RHO, N) == pytest.approx(0.512, abs=1e-3)
    assert 1 - (1 - P) ** N == pytest.approx(0.815, abs=1e-3)
    # 300 seeds: a standard error under 0.03; the tolerances are over three of them.
    assert coverage["refine"] == pytest.approx(chain_coverage(P, RHO, N), abs=0.1)
    assert coverage["parallel"] == pytest.approx(1 - (1 - P) ** N, abs=0.1)
    assert coverage["parallel"] - coverage["refine"] > 0.15


def test_asking_for_a_different_approach_narrows_the_gap(coverage: dict[str, float]) -> None:
    rho = RHO * SimulatedConfig().explore_copy_factor
    assert coverage["explore"] == pytest.approx(chain_coverage(P, rho, N), abs=0.1)
    assert coverage["explore"] - coverage["refine"] > 0.08
    assert coverage["parallel"] - coverage["explore"] < coverage["parallel"] - coverage["refine"]


# -- budget --------------------------------------------------------------------------------------


def test_the_chain_stops_cleanly_when_the_budget_runs_out(tmp_path: Path) -> None:
    # Each attempt holds 64 prompt + 64 output tokens: 400 tokens fund three of them.
    result = run(config({"steps": 8, "reduce": "majority_vote"}, budget={"max_tokens": 400}), tmp_path)
    assert result.status == "answered" and len(result.lanes) == 3
    assert result.outcome["stopped"] == "budget" and result.outcome["attempts"] == 3
    types = [e.type for e in events(result)]
    assert "budget.exhausted" not in types and "budget.wave_shrunk" not in types
    usage = result.usage
    assert usage.prefill_tokens + usage.cached_prefill_tokens + usage.decode_tokens <= 400


def test_a_budget_that_funds_no_attempt_gives_no_answer(tmp_path: Path) -> None:
    result = run(config({"steps": 3}, budget={"max_tokens": 100}), tmp_path)
    assert (result.status, result.reason) == ("no_answer", "the budget could not fund one attempt")
    assert result.outcome["attempts"] == 0
    assert "wave.started" not in [e.type for e in events(result)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.integers(1, 8),
    mode=st.sampled_from(["markov", "autoregressive"]),
    reduce=st.sampled_from(["last", "majority_vote", "any_pass"]),
    failure=st.sampled_from([0.0, 0.3, 0.6]),
    limit=st.none() | st.integers(50, 1500),
    requests=st.none() | st.integers(1, 10),
    attempts=st.integers(1, 3),
    verify=st.booleans(),
    seed=st.integers(0, 50),
)
def test_the_budget_is_never_exceeded(
    tmp_path_factory: pytest.TempPathFactory,
    steps: int,
    mode: str,
    reduce: str,
    failure: float,
    limit: int | None,
    requests: int | None,
    attempts: int,
    verify: bool,
    seed: int,
) -> None:
    runs = tmp_path_factory.mktemp("budget")
    verify = verify or reduce == "any_pass"
    cfg = config(
        {"steps": steps, "mode": mode, "reduce": reduce, "seed": seed},
        backend={"kind": "simulated", "accuracy": 0.3, "failure_rate": failure, "output_tokens": 40},
        budget={"max_tokens": limit, "max_requests": requests},
        retry={"max_attempts": attempts, "initial_backoff_s": 0.0001, "max_backoff_s": 0.0002},
    )
    # Never a failure: the chain stops (answered or not) where the budget ends.
    result = run(cfg, runs, verifier=Checker() if verify else None)
    state = lanefold.fold(JsonlEventLog(result.events or "").read(), cfg.pricing)
    if limit is not None:
        assert state.spend.tokens <= limit
    if requests is not None:
        assert state.spend.requests <= requests
    attempted = result.outcome["attempts"]
    assert attempted == len(result.lanes) <= steps
    assert (attempted == steps) == (result.outcome["stopped"] == "steps") or attempted == steps


# -- resume --------------------------------------------------------------------------------------


def seen(result: lanefold.RunResult) -> list[tuple[int, int, str, str | None]]:
    """What each attempt said (a lane cut off by the crash is sent again: its attempts differ)."""
    return [(lane.wave, lane.lane, lane.status, lane.answer) for lane in result.lanes]


@pytest.mark.parametrize(
    ("loop", "budget", "stopped"),
    [
        ({"steps": 3, "reduce": "majority_vote", "stop_on_pass": False, "seed": 5}, None, "steps"),
        ({"steps": 12, "seed": 6}, None, "passed"),  # its second attempt passes
        ({"steps": 6, "seed": 1}, 400, "budget"),  # the budget funds three attempts
    ],
    ids=["vote", "passed", "budget"],
)
def test_a_run_cut_at_any_event_resumes_to_the_uninterrupted_result(
    loop: dict[str, Any], budget: int | None, stopped: str, tmp_path: Path
) -> None:
    cfg = config(loop, budget={"max_tokens": budget})
    base = run(cfg, tmp_path, run_id="base", verifier=Checker())
    assert base.events is not None and base.outcome["stopped"] == stopped
    lines = Path(base.events).read_text().splitlines(keepends=True)
    checked = 0
    for cut in range(1, len(lines)):
        head = [json.loads(line)["type"] for line in lines[:cut]]
        if budget is not None and head.count("lane.dispatched") > head.count("lane.completed"):
            continue  # a lane cut off in flight is charged its hold: a tight budget then differs
        run(cfg, tmp_path, run_id=f"cut{cut}", verifier=Checker())
        log = tmp_path / f"cut{cut}" / "events.jsonl"
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:cut]))
        again = lanefold.resume_sync(f"cut{cut}", runs_dir=tmp_path, verifier=Checker())
        assert (again.answer, again.votes, again.outcome, seen(again)) == (
            base.answer,
            base.votes,
            base.outcome,
            seen(base),
        ), cut
        after = list(JsonlEventLog(log).read())
        attempts = base.outcome["attempts"]
        assert len(mine(after, "attempted")) == attempts and len(mine(after, "stopped")) == 1
        assert Counter(e.type for e in after)["judge.completed"] == attempts, "none twice"
        checked += 1
    assert checked > 10


# -- a real crash: SIGKILL mid chain, then resume ------------------------------------------------

STEPS = 6
CONFIG = f"""
[loop]
coordinator = "lanefold.coordinators._sequential_refine:SequentialRefine"
seed = 7
steps = {STEPS}
stop_on_pass = false
reduce = "majority_vote"

[judge]
verifier_command = ["sh", "-c", "grep -q 'Answer: 391'"]

[backend]
kind = "simulated"
accuracy = 0.2
copy_rate = 0.5
latency_ms = [{{latency}}]
"""


def dispatched(log: Path, wave: int) -> bool:
    if not log.exists():
        return False
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the line being written
            continue
        if event["type"] == "lane.dispatched" and event.get("wave") == wave:
            return True
    return False


@pytest.fixture
def crashed(tmp_path: Path) -> Iterator[Path]:
    """An uninterrupted run `base`, and a run `crash` killed with SIGKILL while attempt 3 was
    in flight (attempts 1 and 2 done and verified)."""
    runs = tmp_path / "runs"
    (tmp_path / "base.toml").write_text(CONFIG.replace("{latency}", "0, 0"))
    (tmp_path / "crash.toml").write_text(CONFIG.replace("{latency}", "150, 250"))
    code, _, err = finish(
        cli(
            tmp_path,
            "run",
            "base.toml",
            "--question",
            QUESTION,
            "--runs-dir",
            str(runs),
            "--run-id",
            "base",
            "--json",
        )
    )
    assert code == 0, err
    proc = cli(
        tmp_path, "run", "crash.toml", "--question", QUESTION, "--runs-dir", str(runs), "--run-id", "crash"
    )
    deadline = time.monotonic() + 60  # a bound on a hang, not a measured time
    try:
        while not dispatched(runs / "crash" / "events.jsonl", 3):
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"the run never reached attempt 3 (exit {proc.poll()})")
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    yield runs


@pytest.mark.slow
def test_sigkill_mid_chain_then_resume_gives_the_uninterrupted_answer(crashed: Path) -> None:
    def read(run_id: str) -> list[dict[str, Any]]:
        text = (crashed / run_id / "events.jsonl").read_text()
        return [json.loads(line) for line in text.splitlines()]

    before = read("crash")
    assert not any(e["type"] == "run.completed" for e in before)
    code, out, err = finish(cli(crashed.parent, "resume", "crash", "--runs-dir", str(crashed), "--json"))
    assert code == 0, err
    resumed = json.loads(out)
    base = read("base")[-1]["data"]["result"]
    assert (resumed["answer"], resumed["votes"], resumed["outcome"]) == (
        base["answer"],
        base["votes"],
        base["outcome"],
    )
    assert [lane["answer"] for lane in resumed["lanes"]] == [lane["answer"] for lane in base["lanes"]]
    assert resumed["resumes"] == 1

    after = read("crash")
    completed = Counter((e["wave"], e["lane"]) for e in after if e["type"] == "lane.completed")
    assert set(completed) == {(w, w - 1) for w in range(1, STEPS + 1)}
    assert set(completed.values()) == {1}, "no attempt completed twice"
    judged = Counter(e["wave"] for e in after if e["type"] == "judge.completed")
    assert judged == dict.fromkeys(range(1, STEPS + 1), 1), "no attempt verified twice"
    kinds = [e["type"] for e in after]
    assert kinds.count("loop.sequential_refine.attempted") == STEPS
    assert kinds.count("loop.sequential_refine.stopped") == 1


# -- the example ---------------------------------------------------------------------------------


def test_the_example_config_validates() -> None:
    cfg = lanefold.load_config(ROOT / "examples" / "sequential_refine.toml")
    assert cfg.loop.coordinator == "sequential_refine"
    assert cfg.backend.kind == "engine"
    assert math.isfinite(cfg.sampling.max_tokens)
