"""adaptive_sample: early-stop self-consistency, checked against closed forms.

The rules on their own (the Beta posterior's closed form, ESC's window, the margin bound), the
loop end to end on the simulated backend and on a scripted one (exact stopping points, events,
budget, quorum, resume from a log cut anywhere and after SIGKILL), a Hypothesis property that no
config or fault makes it exceed its budget, and the papers' claim on a difficulty mixture: far
fewer lanes than parallel_sample at max_lanes, at the same accuracy.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_processes import cli, completed_in, finish

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.cli import main
from lanefold.coordinators import _adaptive_sample
from lanefold.coordinators._adaptive_sample import (
    AdaptiveSample,
    AdaptiveSampleParams,
    decision,
    majority_posterior,
    settled,
    top_two,
)
from lanefold.coordinators._reducer_keys import ReducerKeys
from lanefold.primitives import (
    BudgetExhaustedError,
    Lane,
    QuorumNotMetError,
    ReduceOptions,
    Sample,
    SampleRequest,
    Usage,
)
from lanefold.primitives.events import WaveStarted
from lanefold.stores.files import JsonlEventLog

QUESTION = "What is 17 * 23?"
CHECKED = "loop.adaptive_sample.checked"


def config(
    loop: dict[str, Any], backend: dict[str, Any] | None = None, **sections: dict[str, Any]
) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"coordinator": "adaptive_sample", **loop},
            "backend": {"kind": "simulated", **(backend or {})},
            **sections,
        }
    )


def run(cfg: lanefold.LoopConfig, runs: Path, run_id: str | None = None, **kwargs: Any) -> lanefold.RunResult:
    return lanefold.run_sync(cfg, QUESTION, runs_dir=runs, run_id=run_id, **kwargs)


def events(result: lanefold.RunResult) -> list[Any]:
    assert result.events is not None
    return list(JsonlEventLog(result.events).read())


def checks(result: lanefold.RunResult) -> list[dict[str, Any]]:
    return [dict(e.data) for e in events(result) if e.type == CHECKED]


# -- the rules ----------------------------------------------------------------------------------


def test_the_beta_posterior_is_the_binomial_tail() -> None:
    assert majority_posterior(0, 0) == Fraction(1, 2)
    assert majority_posterior(3, 0) == Fraction(15, 16)  # P(Bin(4, 1/2) <= 3) < 0.95
    assert majority_posterior(4, 0) == Fraction(31, 32)  # P(Bin(5, 1/2) <= 4) >= 0.95
    assert majority_posterior(2, 1) == Fraction(11, 16)
    assert majority_posterior(5, 5) == Fraction(1, 2)


@given(a=st.integers(0, 60), b=st.integers(0, 60))
def test_the_posterior_is_the_beta_probability_that_the_leader_is_ahead(a: int, b: int) -> None:
    """Either answer leads with the probability the other does not, and more votes for the
    leader (or fewer for the runner-up) never make it less sure."""
    assert majority_posterior(a, b) + majority_posterior(b, a) == 1
    assert majority_posterior(a + 1, b) > majority_posterior(a, b) > majority_posterior(a, b + 1)


def test_esc_needs_the_whole_window_to_agree() -> None:
    counts = {"391": 5}
    assert settled("esc", counts, ["391"] * 5, remaining=35, threshold=0.95)
    assert not settled("esc", counts, ["391"] * 4 + [None], remaining=35, threshold=0.95)
    assert not settled("esc", {"391": 4, "401": 1}, ["391"] * 4 + ["401"], remaining=35, threshold=0.95)
    assert not settled("esc", {}, [None, None], remaining=35, threshold=0.95)


def test_margin_stops_once_the_leader_cannot_be_overtaken() -> None:
    assert not settled("margin", {"a": 6, "b": 2}, [], remaining=4, threshold=0.95)  # a tie left
    assert settled("margin", {"a": 7, "b": 2}, [], remaining=4, threshold=0.95)
    assert settled("margin", {"a": 3}, [], remaining=2, threshold=0.95)


def test_top_two_counts_the_first_counted_of_a_tied_lead_first() -> None:
    assert top_two({}) == (None, 0, 0)
    assert top_two({"x": 2}) == ("x", 2, 0)
    assert top_two({"x": 2, "y": 3, "z": 3}) == ("y", 3, 3)


# -- keys -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"window": 0}, "loop.window: Input should be greater than or equal to 1"),
        ({"window": "4"}, "loop.window: Input should be a valid integer"),
        ({"window": 5, "max_lanes": 4}, "loop.max_lanes: 4 is less than loop.window (5)"),
        ({"rule": "sprt"}, "loop.rule: Input should be 'esc', 'beta' or 'margin'"),
        ({"rule": "esc", "window": 1}, "loop.window: the esc rule stops when a window agrees"),
        ({"threshold": 0.5}, "loop.threshold: Input should be greater than 0.5"),
        ({"threshold": 1.5}, "loop.threshold: Input should be less than or equal to 1"),
        ({"min_quorum": 41}, "loop.min_quorum: 41 is more than loop.max_lanes (40)"),
        ({"reducer": "nope"}, "loop.reducer: unknown reducer 'nope'"),
        ({"weighting": "verifier"}, 'loop.weighting: "verifier" weighs a weighted_vote'),
        ({"tie_break": "last"}, "loop.tie_break: Input should be"),
        ({"windows": 4}, "loop.windows: unknown key"),
    ],
)
def test_keys_are_validated_naming_them(keys: dict[str, Any], error: str) -> None:
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.parse_config({"loop": {"coordinator": "adaptive_sample", **keys}}, source="adaptive.toml")
    assert str(caught.value).startswith(f"adaptive.toml: {error}"), caught.value


def test_the_recorded_config_holds_every_default() -> None:
    cfg = lanefold.parse_config({"loop": {"coordinator": "adaptive_sample"}})
    assert cfg.loop_params == AdaptiveSampleParams()
    assert cfg.model_dump()["loop"] == {
        "coordinator": "adaptive_sample",
        "max_concurrency": 16,
        "seed": 0,
        "timeout_s": None,
        "window": 4,
        "max_lanes": 40,
        "rule": "beta",
        "threshold": 0.95,
        "reducer": "majority_vote",
        "min_quorum": 1,
        "tie_break": "first_lane",
        "weighting": "none",
    }
    assert lanefold.parse_config(cfg.model_dump()).loop_params == cfg.loop_params
    assert AdaptiveSample().params == AdaptiveSampleParams()


# -- exact stopping points ------------------------------------------------------------------------


def test_beta_at_095_stops_after_exactly_four_agreeing_lanes(tmp_path: Path) -> None:
    result = run(config({"rule": "beta", "window": 1, "threshold": 0.95}, {"accuracy": 1.0}), tmp_path)
    assert result.outcome == {
        "lanes_used": 4,
        "stopped_by": "beta",
        "waves": 4,
        "rule": "beta",
        "completed": 4,
    }
    assert (result.answer, result.votes) == ("391", {"391": 4.0})
    posteriors = [c["posterior"] for c in checks(result)]
    assert posteriors == [0.5, 0.75, 0.875, 15 / 16, 31 / 32]  # 15/16 < 0.95 <= 31/32
    # At a threshold of exactly 15/16, three lanes are enough: the comparison is exact.
    three = run(config({"rule": "beta", "window": 1, "threshold": 0.9375}, {"accuracy": 1.0}), tmp_path)
    assert three.outcome["lanes_used"] == 3


def test_a_window_of_four_reaches_the_same_four_lanes_in_one_wave(tmp_path: Path) -> None:
    result = run(config({"rule": "beta", "window": 4}, {"accuracy": 1.0}), tmp_path)
    assert (result.outcome["lanes_used"], result.outcome["waves"]) == (4, 1)


@pytest.mark.parametrize("accuracy", [0.3, 0.6, 0.9, 1.0])
def test_esc_with_window_5_never_stops_before_5_lanes(tmp_path: Path, accuracy: float) -> None:
    for seed in range(6):
        result = run(config({"rule": "esc", "window": 5, "seed": seed}, {"accuracy": accuracy}), tmp_path)
        used, stopped = result.outcome["lanes_used"], result.outcome["stopped_by"]
        assert used >= 5 and used % 5 == 0, (seed, used)
        assert stopped in ("esc", "max_lanes")
        last = [lane.answer for lane in result.lanes if lane.wave == result.outcome["waves"]]
        if stopped == "esc":
            assert len(last) == 5 and len(set(last)) == 1 and None not in last
        else:
            assert used == 40
        if accuracy == 1.0:
            assert (used, stopped) == (5, "esc")


def test_margin_stops_when_the_runner_up_cannot_catch_up(tmp_path: Path) -> None:
    # All agree: a > max_lanes - a first holds at a = 6 of 10.
    result = run(config({"rule": "margin", "window": 1, "max_lanes": 10}, {"accuracy": 1.0}), tmp_path)
    assert (result.outcome["lanes_used"], result.outcome["stopped_by"]) == (6, "margin")
    # Scripted, windows of 2: after 6 lanes a=5, b=1 with 4 left, so a tie is still possible;
    # after 8, a=7, b=1 with 2 left: settled.
    scripted = run(
        config({"rule": "margin", "window": 2, "max_lanes": 10}),
        tmp_path,
        backend=ScriptedBackend("A B  A A  A A  A A  B B"),
    )
    assert (scripted.outcome["lanes_used"], scripted.answer) == (8, "a")
    made = checks(scripted)
    assert [c["stopped_by"] for c in made] == [None, None, None, None, "margin"]
    assert (made[3]["a"], made[3]["b"], made[4]["a"], made[4]["b"]) == (5, 1, 7, 1)


def test_esc_on_a_script_stops_at_the_first_agreeing_window(tmp_path: Path) -> None:
    result = run(
        config({"rule": "esc", "window": 3}), tmp_path, backend=ScriptedBackend("A B A  B B B  A A A")
    )
    assert result.outcome == {"lanes_used": 6, "stopped_by": "esc", "waves": 2, "rule": "esc", "completed": 6}
    assert (result.answer, result.votes) == ("b", {"a": 2.0, "b": 4.0})


def test_max_lanes_ends_a_run_no_rule_settles_with_a_short_last_wave(tmp_path: Path) -> None:
    result = run(config({"rule": "beta", "threshold": 1.0, "window": 4, "max_lanes": 10}), tmp_path)
    assert result.outcome["stopped_by"] == "max_lanes"
    assert [lane.wave for lane in result.lanes] == [1] * 4 + [2] * 4 + [3] * 2
    assert [lane.lane for lane in result.lanes] == list(range(10)), "numbered across waves"
    assert [c["next"] for c in checks(result)] == [4, 4, 2, None]


def test_no_rule_fires_before_the_quorum(tmp_path: Path) -> None:
    result = run(config({"window": 1, "min_quorum": 6}, {"accuracy": 1.0}), tmp_path)
    assert (result.outcome["lanes_used"], result.outcome["stopped_by"]) == (6, "beta")


def test_lanes_that_never_complete_fail_the_run_at_max_lanes(tmp_path: Path) -> None:
    cfg = config({"window": 2, "max_lanes": 6}, {"failure_rate": 1.0}, retry={"max_attempts": 1})
    with pytest.raises(QuorumNotMetError, match="6 lanes ran, 0 completed"):
        run(cfg, tmp_path, run_id="dead")
    types = [e.type for e in JsonlEventLog(tmp_path / "dead" / "events.jsonl").read()]
    assert types.count("wave.started") == 3 and types[-1] == "run.failed"


@pytest.mark.parametrize(("tie_break", "answer"), [("first_lane", "b"), ("lexicographic", "a")])
def test_the_final_vote_is_over_every_lane_with_the_tie_break(
    tmp_path: Path, tie_break: str, answer: str
) -> None:
    result = run(
        config({"window": 2, "max_lanes": 4, "tie_break": tie_break}),
        tmp_path,
        backend=ScriptedBackend("B A A B"),
    )
    assert result.votes == {"a": 2.0, "b": 2.0}
    assert (result.answer, result.reducer) == (answer, "majority_vote")
    winner = next(lane for lane in result.lanes if lane.lane == result.winner_lane)
    assert winner.answer is not None and winner.answer.lower() == answer


# -- the log --------------------------------------------------------------------------------------


def test_each_decision_is_recorded_before_the_wave_it_allows(tmp_path: Path) -> None:
    result = run(config({"window": 2, "seed": 5}, {"accuracy": 0.5}), tmp_path)
    log = events(result)
    waves = result.outcome["waves"]
    assert waves >= 2
    kinds = [(e.type, e.wave) for e in log if e.type in (CHECKED, "wave.started", "wave.barrier")]
    expected: list[tuple[str, int | None]] = [(CHECKED, None)]
    for wave in range(1, waves + 1):
        expected += [("wave.started", wave), ("wave.barrier", wave), (CHECKED, wave)]
    assert kinds == expected
    made = checks(result)
    assert made[-1]["stopped_by"] == result.outcome["stopped_by"] == "beta"
    for check in made:
        assert check["posterior"] == float(majority_posterior(check["a"], check["b"]))
        assert sum(check["counts"].values()) <= check["completed"] <= check["lanes_used"]
    assert made[-1]["counts"] == {k: int(v) for k, v in result.votes.items()}
    assert all(e.data.purpose == "sample" for e in log if e.type == "wave.started")
    assert [e.type for e in log][-2:] == ["reduce.completed", "run.completed"]


def test_a_budget_that_funds_three_waves_runs_three_and_holds_nothing_back(tmp_path: Path) -> None:
    # A wave of 2 lanes reserves its prompt once (64) and 48 tokens a lane: 160.
    cfg = config(
        {"window": 2, "threshold": 1.0},
        {"prompt_tokens": 64, "output_tokens": 48},
        sampling={"max_tokens": 48},
        budget={"max_tokens": 3 * 160 + 159},
    )
    result = run(cfg, tmp_path)
    assert result.outcome["stopped_by"] == "budget"
    assert (result.outcome["lanes_used"], result.outcome["waves"]) == (6, 3)
    assert result.usage.prefill_tokens + result.usage.decode_tokens == 3 * 160
    types = [e.type for e in events(result)]
    assert "budget.wave_shrunk" not in types and "budget.exhausted" not in types
    # One token more funds a fourth wave.
    more = run(
        cfg.model_copy(update={"budget": cfg.budget.model_copy(update={"max_tokens": 4 * 160})}), tmp_path
    )
    assert more.outcome["lanes_used"] == 8


def test_a_budget_that_funds_no_wave_fails_cleanly(tmp_path: Path) -> None:
    cfg = config({"window": 2}, sampling={"max_tokens": 48}, budget={"max_tokens": 100})
    with pytest.raises(BudgetExhaustedError, match="0 lanes ran"):
        run(cfg, tmp_path, run_id="broke")
    types = [e.type for e in JsonlEventLog(tmp_path / "broke" / "events.jsonl").read()]
    assert "wave.started" not in types and types[-1] == "run.failed"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    window=st.integers(1, 4),
    extra=st.integers(0, 8),
    rule=st.sampled_from(["esc", "beta", "margin"]),
    threshold=st.sampled_from([0.8, 0.95, 1.0]),
    failure=st.sampled_from([0.0, 0.3, 0.7]),
    limit=st.integers(0, 2500),
    concurrency=st.integers(1, 4),
    per_request=st.sampled_from([None, 1, 2]),
    attempts=st.integers(1, 2),
    seed=st.integers(0, 9),
)
def test_the_budget_is_never_exceeded(
    window: int,
    extra: int,
    rule: str,
    threshold: float,
    failure: float,
    limit: int,
    concurrency: int,
    per_request: int | None,
    attempts: int,
    seed: int,
) -> None:
    if rule == "esc":
        window = max(window, 2)
    max_lanes = window + extra
    cfg = config(
        {
            "window": window,
            "max_lanes": max_lanes,
            "rule": rule,
            "threshold": threshold,
            "max_concurrency": concurrency,
            "seed": seed,
        },
        {
            "accuracy": 0.5,
            "failure_rate": failure,
            "prompt_tokens": 30,
            "output_tokens": 25,
            "lanes_per_request": per_request,
        },
        sampling={"max_tokens": 40},
        budget={"max_tokens": limit},
        retry={"max_attempts": attempts, "initial_backoff_s": 0.0005, "max_backoff_s": 0.001},
    )
    with tempfile.TemporaryDirectory() as runs:
        try:
            result: lanefold.RunResult | None = run(cfg, Path(runs), run_id="r")
        except (BudgetExhaustedError, QuorumNotMetError):
            result = None
        log = list(JsonlEventLog(Path(runs) / "r" / "events.jsonl").read())
    state = lanefold.fold(log, cfg.pricing)
    assert state.spend.tokens <= limit
    started = sum(e.data.k for e in log if isinstance(e, WaveStarted))
    assert started <= max_lanes
    if result is not None:
        assert result.outcome["lanes_used"] == started == len(result.lanes)
        assert result.outcome["stopped_by"] in (rule, "max_lanes", "budget")


# -- resume ---------------------------------------------------------------------------------------


RESUMED = {"window": 2, "seed": 7}


def test_a_log_cut_anywhere_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    cfg = config(RESUMED, {"accuracy": 0.5})
    base = run(cfg, tmp_path, run_id="base")
    assert base.outcome["waves"] >= 3, "a run of several decisions"
    done = len(events(base)) - 1  # the last line is run.completed: a log without it is unfinished
    for cut in range(1, done + 1):
        run_id = f"cut{cut}"
        run(cfg, tmp_path, run_id=run_id)  # the same run under its own id, then the crash:
        log = tmp_path / run_id / "events.jsonl"
        log.write_text("".join(log.read_text().splitlines(keepends=True)[:cut]))
        again = lanefold.resume_sync(run_id, runs_dir=tmp_path)
        assert (again.answer, again.votes, again.outcome) == (base.answer, base.votes, base.outcome), cut
        after = [e.type for e in JsonlEventLog(log).read()]
        assert after.count(CHECKED) == base.outcome["waves"] + 1, cut


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_the_uninterrupted_result(tmp_path: Path) -> None:
    text = (
        '[loop]\ncoordinator = "adaptive_sample"\nwindow = 2\nseed = 7\n'
        '[backend]\nkind = "simulated"\naccuracy = 0.5\nlanes_per_request = 1\n'
        "latency_ms = [{latency}]\n"
    )
    runs = tmp_path / "runs"
    (tmp_path / "base.toml").write_text(text.format(latency="0, 0"))
    (tmp_path / "crash.toml").write_text(text.format(latency="100, 200"))
    code, out, err = finish(
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
    base = json.loads(out)
    assert base["outcome"]["waves"] >= 3

    proc = cli(
        tmp_path, "run", "crash.toml", "--question", QUESTION, "--runs-dir", str(runs), "--run-id", "crash"
    )
    log = runs / "crash" / "events.jsonl"
    deadline = time.monotonic() + 60  # a bound on a hang, not a measured time
    try:
        while completed_in(log, 2) < 1:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"the run never reached wave 2 (exit {proc.poll()})")
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert '"run.completed"' not in log.read_text(), "killed before the run ended"

    code, out, err = finish(cli(tmp_path, "resume", "crash", "--runs-dir", str(runs), "--json"))
    assert code == 0, err
    resumed = json.loads(out)
    assert (resumed["answer"], resumed["votes"], resumed["outcome"]) == (
        base["answer"],
        base["votes"],
        base["outcome"],
    )
    after = [json.loads(line) for line in log.read_text().splitlines()]
    done = Counter((e["wave"], e["lane"]) for e in after if e["type"] == "lane.completed")
    assert set(done.values()) == {1}, "no lane completed twice"
    assert [e["type"] for e in after].count(CHECKED) == base["outcome"]["waves"] + 1


# -- the papers' claim: fewer lanes at the same accuracy --------------------------------------------


class PrefixBackend(SimulatedBackend):
    """The simulated backend with each lane's draws keyed by its question and lane number
    alone, so a lane says the same thing whichever wave asks for it. adaptive_sample's lanes
    (numbered across waves) are then a prefix of parallel_sample's: the two differ only in
    where they stop, and their accuracies can be compared question by question."""

    async def sample(self, request: SampleRequest) -> AsyncIterator[Sample | Any]:
        question = request.prompt.splitlines()[0]
        lanes = tuple(replace(lane, seed=_stable(f"{question}:{lane.lane}")) for lane in request.lanes)
        async for outcome in super().sample(replace(request, lanes=lanes)):
            yield outcome


def _stable(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") >> 1


QUESTIONS, MAX_LANES = 200, 40


@pytest.fixture(scope="module")
def mixture() -> dict[str, tuple[int, float]]:
    """Lanes used and accuracy of each loop over the same seeded questions, whose accuracy is
    drawn per question from Beta(2, 1): easy ones mostly, some near chance."""
    backend = PrefixBackend(SimulatedConfig(difficulty=(2.0, 1.0)))
    loops: dict[str, dict[str, Any]] = {
        "parallel_sample": {"coordinator": "parallel_sample", "k": MAX_LANES},
        "adaptive_sample": {
            "coordinator": "adaptive_sample",
            "max_lanes": MAX_LANES,
            "window": 4,
            "rule": "beta",
            "threshold": 0.95,
        },
    }
    found: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as runs:
        for name, loop in loops.items():
            cfg = lanefold.parse_config(
                {
                    "loop": {**loop, "max_concurrency": MAX_LANES},
                    "backend": {"kind": "simulated", "difficulty": [2.0, 1.0]},
                    "log": {"fsync": "never"},
                }
            )
            lanes = right = 0
            for i in range(QUESTIONS):
                result = lanefold.run_sync(
                    cfg, f"Question {i}: what is 17 * 23?", runs_dir=runs, backend=backend
                )
                lanes += len(result.lanes)
                right += result.answer == "391"
            found[name] = (lanes, right / QUESTIONS)
    return found


def test_adaptive_sample_uses_at_least_2x_fewer_lanes_than_parallel_sample(
    mixture: dict[str, tuple[int, float]],
) -> None:
    (parallel, _), (adaptive, _) = mixture["parallel_sample"], mixture["adaptive_sample"]
    assert parallel == QUESTIONS * MAX_LANES
    assert parallel / adaptive >= 2.0, (parallel, adaptive)  # about 2.5 here


def test_at_an_accuracy_within_one_point(mixture: dict[str, tuple[int, float]]) -> None:
    (_, parallel), (_, adaptive) = mixture["parallel_sample"], mixture["adaptive_sample"]
    assert 0.8 < parallel < 0.98, parallel  # the mixture is neither trivial nor hopeless
    assert abs(adaptive - parallel) <= 0.01, (parallel, adaptive)


# -- a scripted backend ---------------------------------------------------------------------------


class ScriptedBackend:
    """Lane n (lanes are numbered across waves) answers the n-th word of a script."""

    name = "scripted"
    max_lanes_per_request: int | None = None
    shares_prefix = True

    def __init__(self, script: str) -> None:
        self.script = script.split()

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 10

    async def sample(self, request: SampleRequest) -> AsyncIterator[Sample]:
        for lane in request.lanes:
            yield Sample(lane.lane, f"Answer: {self.script[lane.lane]}", "stop", Usage(10, 0, 4))

    async def aclose(self) -> None:
        pass


def test_the_scripted_backend_is_a_backend() -> None:
    assert isinstance(ScriptedBackend("A"), lanefold.Backend)


class Unanswering(ScriptedBackend):
    """ScriptedBackend, where a `_` in the script is a lane that completes with no answer."""

    async def sample(self, request: SampleRequest) -> AsyncIterator[Sample]:
        for lane in request.lanes:
            word = self.script[lane.lane]
            text = "I cannot tell." if word == "_" else f"Answer: {word}"
            yield Sample(lane.lane, text, "stop", Usage(10, 0, 4))


def test_a_log_written_before_the_quorum_counted_answers_still_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before a quorum counted answers, a rule could stop once `min_quorum` lanes had
    completed, and the vote held no quorum: here esc stops after two waves, the first of which
    answered nothing, on two ballots. Such a log reads as it was written. The same stop in a
    log whose vote records its quorum (one written since) is refused at that decision."""

    def as_before(params: AdaptiveSampleParams, lanes: list[Lane], last: list[Lane], **kw: Any) -> Any:
        completed = sum(lane.completed for lane in lanes)
        quorum = 1 if completed >= params.min_quorum else 10**9  # a rule may stop, or may not
        return decision(params.model_copy(update={"min_quorum": quorum}), lanes, last, **kw)

    def no_quorum(params: AdaptiveSampleParams, seed: int) -> ReduceOptions:
        return ReducerKeys.options(params, seed)

    with monkeypatch.context() as then:
        then.setattr(_adaptive_sample, "decision", as_before)
        then.setattr(AdaptiveSampleParams, "options", no_quorum)
        cfg = config({"window": 2, "max_lanes": 8, "rule": "esc", "min_quorum": 3})
        result = run(cfg, tmp_path, run_id="old", backend=Unanswering("_ _ A A B B C C"))
    assert (result.outcome["stopped_by"], result.outcome["lanes_used"]) == ("esc", 4)
    assert (result.answer, result.lanes_answered) == ("a", 2)
    for command in ("show", "tail", "resume"):
        code = main([command, "old", "--runs-dir", str(tmp_path), "--json"])
        assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    # Today's loop goes on to a third wave before its rule may stop.
    today = run(cfg, tmp_path, run_id="new", backend=Unanswering("_ _ A A A A C C"))
    assert (today.outcome["stopped_by"], today.outcome["lanes_used"], today.answer) == ("esc", 6, "a")

    path = tmp_path / "old" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    reduced = next(e for e in events if e["type"] == "reduce.completed")
    reduced["data"]["detail"] = {"quorum": 3}
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    stop = [e for e in events if e["type"] == CHECKED][-1]
    assert main(["show", "old", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"events.jsonl:{stop['sequence']}: " in err and "says stopped_by = 'esc'" in err, err
