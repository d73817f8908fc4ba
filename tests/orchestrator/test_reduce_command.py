"""`orchestrator reduce RUN_ID --reducer NAME` and `Session.reduce`: a finished run's lanes
reduced again from its log, without sampling.

Runs are made over the simulated backend with `call_log` set, so every lane attempt the
backend serves is a line in a file: a re-reduction that samples would add lines of the sample
wave, one that judges adds lines of its own wave only. The CLI is called in-process.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_support import Outcome, cli

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import LaneOutcome, SampleRequest, fold
from lanefold.stores.files import JsonlEventLog, RunLock

QUESTION = "What is 17 * 23?"
RUN = "r"


# -- helpers --------------------------------------------------------------------------------------


@dataclass
class Finished:
    """A finished run `r` in `runs`, made from `config`; the backend's calls go to `calls`."""

    runs: Path
    config: Path
    calls: Path
    result: dict[str, Any]

    @property
    def log(self) -> Path:
        return self.runs / RUN / "events.jsonl"

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]

    def calls_made(self) -> list[tuple[int, int, int]]:
        if not self.calls.exists():
            return []
        return [
            tuple(map(int, line.split()))  # type: ignore[misc]
            for line in self.calls.read_text(encoding="utf-8").splitlines()
        ]

    def reduce(self, capsys: pytest.CaptureFixture[str], reducer: str, *more: str) -> Outcome:
        return cli(capsys, "reduce", RUN, "--reducer", reducer, "--runs-dir", self.runs, *more)


def write_config(folder: Path, calls: Path, **sections: dict[str, Any]) -> Path:
    raw: dict[str, Any] = {
        "loop": {"k": 6, "seed": 7, "reducer": "majority_vote", "max_concurrency": 8},
        "prompt": {"template": "Question: {question}\nEnd with 'Answer: <number>'.\n"},
        "extract": {"method": "regex", "regex": r"Answer:\s*([-0-9.,]+)"},
        "backend": {
            "kind": "simulated",
            "answer": "391",
            "accuracy": 0.5,
            "distractors": ["381", "401", "293"],
            "latency_ms": [0, 0],
            "prompt_tokens": 40,
            "output_tokens": 60,
            "call_log": str(calls),
        },
        "pricing": {
            "input_per_mtok": 0.15,
            "cached_input_per_mtok": 0.075,
            "output_per_mtok": 0.6,
            "verifier_per_mtok": 1.0,
        },
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = folder / "loop.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


def finish(tmp_path: Path, capsys: pytest.CaptureFixture[str], **sections: dict[str, Any]) -> Finished:
    calls = tmp_path / "calls.log"
    config = write_config(tmp_path, calls, **sections)
    runs = tmp_path / "runs"
    done = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", RUN, "--json")
    assert done.code in (0, 4), done.err
    return Finished(runs, config, calls, done.json)


@pytest.fixture
def finished(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Finished:
    return finish(tmp_path, capsys)


def after_the_run(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    end = next(i for i, e in enumerate(events) if e["type"] == "run.completed")
    return events[end + 1 :]


@dataclass
class Counting:
    """The simulated backend, counting the requests it is sent (by purpose)."""

    inner: SimulatedBackend = field(
        default_factory=lambda: SimulatedBackend(SimulatedConfig(accuracy=0.5, latency_ms=(0.0, 0.0)))
    )
    requests: list[SampleRequest] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def shares_prefix(self) -> bool:
        return self.inner.shares_prefix

    @property
    def max_lanes_per_request(self) -> int | None:
        return self.inner.max_lanes_per_request

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        return self.inner.count_prompt_tokens(request)

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.requests.append(request)
        async for outcome in self.inner.sample(request):
            yield outcome

    async def aclose(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _sys_path_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """`orchestrator run` puts the config's folder on sys.path (for `module:function`
    verifiers); each test gets the path back as it was."""
    monkeypatch.setattr(sys, "path", list(sys.path))


# -- no sampling ----------------------------------------------------------------------------------


def test_a_majority_re_reduction_builds_no_backend_and_appends_its_reduction(
    finished: Finished, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = finished.calls_made()
    assert calls  # the run itself sampled
    before = finished.events()

    def no_backend(section: Any) -> Any:
        raise AssertionError("a majority_vote re-reduction built a backend")

    monkeypatch.setattr("lanefold.execution._session.build_backend", no_backend)
    monkeypatch.setattr("lanefold.execution._runner.build_backend", no_backend)
    outcome = finished.reduce(capsys, "majority_vote", "--json")
    assert outcome.code == 0, outcome.err
    assert outcome.err == ""
    assert finished.calls_made() == calls
    events = finished.events()
    assert events[: len(before)] == before  # appended, nothing rewritten
    added = events[len(before) :]
    assert [e["type"] for e in added] == ["reduce.started", "reduce.completed"]
    assert added[0]["data"]["reduction"] == 2
    assert added[0]["data"]["reducer"] == "majority_vote"
    assert added[1]["data"]["reduction"] == 2
    result = outcome.json
    assert result["reducer"] == "majority_vote"
    assert (result["answer"], result["winner_lane"], result["votes"]) == (
        finished.result["answer"],
        finished.result["winner_lane"],
        finished.result["votes"],
    )


@pytest.mark.anyio
async def test_session_reduce_sends_no_sample_request(finished: Finished) -> None:
    backend = Counting()
    async with lanefold.Session(backend=backend, runs_dir=finished.runs) as session:
        result = await session.reduce(RUN, reducer="majority_vote")
        assert backend.requests == []
        judged = await session.reduce(RUN, reducer="judge_argmax")
    assert result.reducer == "majority_vote"
    assert result.answer == finished.result["answer"]
    assert backend.requests, "the judge ran its own wave"
    assert {r.purpose for r in backend.requests} == {"judge"}
    assert judged.reducer == "judge_argmax"
    assert set(judged.scores) == {
        lane["lane"] for lane in finished.result["lanes"] if lane["status"] == "completed"
    }


def test_a_judge_re_reduction_runs_only_its_own_governed_wave(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = finished.calls_made()
    sampled_waves = {wave for wave, _, _ in calls}
    outcome = finished.reduce(capsys, "judge_argmax", "--json")
    assert outcome.code == 0, outcome.err
    added = after_the_run(finished.events())
    (started,) = [e for e in added if e["type"] == "reduce.started"]
    judge_wave = started["data"]["first_wave"]
    assert judge_wave not in sampled_waves
    new_calls = finished.calls_made()[len(calls) :]
    assert new_calls and {wave for wave, _, _ in new_calls} == {judge_wave}
    waves = [e for e in added if e["type"] == "wave.started"]
    assert [(e["wave"], e["data"]["purpose"], e["data"]["bill"]) for e in waves] == [
        (judge_wave, "judge", "verifier")
    ]
    verdicts = [e["data"] for e in added if e["type"] == "judge.completed"]
    completed = sorted(lane["lane"] for lane in finished.result["lanes"] if lane["status"] == "completed")
    assert sorted(v["candidate_lane"] for v in verdicts) == completed
    assert {v["reduction"] for v in verdicts} == {2}
    result = outcome.json
    assert result["reducer"] == "judge_argmax"
    assert {int(k) for k in result["scores"]} == set(completed)
    assert result["usage"]["verifier_tokens"] > 0
    assert result["cost"]["verifier"] > 0
    assert result["usage"]["decode_tokens"] == finished.result["usage"]["decode_tokens"]


def test_a_usc_re_reduction_is_one_usc_wave_billed_as_verifier(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = finished.calls_made()
    outcome = finished.reduce(capsys, "usc", "--json")
    assert outcome.code == 0, outcome.err
    added = after_the_run(finished.events())
    waves = [e for e in added if e["type"] == "wave.started"]
    assert [(e["data"]["purpose"], e["data"]["bill"], e["data"]["k"]) for e in waves] == [
        ("usc", "verifier", 1)
    ]
    (usc_wave,) = [e["wave"] for e in waves]
    new_calls = finished.calls_made()[len(calls) :]
    assert [wave for wave, _, _ in new_calls] == [usc_wave]
    (completed,) = [e["data"] for e in added if e["type"] == "reduce.completed"]
    assert completed["reducer"] == "usc"
    assert completed["reduction"] == 2
    result = outcome.json
    assert result["reducer"] == "usc"
    assert result["answer"] in finished.result["votes"]
    assert result["usage"]["verifier_tokens"] > 0
    assert result["cost"]["verifier"] > 0


# -- reductions listed, the log still folds -------------------------------------------------------


def test_every_reduction_is_numbered_listed_and_the_log_still_folds(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    reducers = ["judge_argmax", "usc", "majority_vote", "judge_argmax"]
    for reducer in reducers:
        outcome = finished.reduce(capsys, reducer, "--json")
        assert outcome.code == 0, outcome.err
        assert outcome.json["reducer"] == reducer

    completed = [e["data"] for e in finished.events() if e["type"] == "reduce.completed"]
    assert [(d["reduction"], d["reducer"]) for d in completed] == [
        (1, "majority_vote"),
        *((n, r) for n, r in enumerate(reducers, start=2)),
    ]

    shown = cli(capsys, "show", RUN, "--runs-dir", finished.runs, "--json")
    assert shown.code == 0, shown.err
    document = shown.json
    assert isinstance(document["reductions"], list)
    assert [(d["reduction"], d["reducer"]) for d in document["reductions"]] == [
        (1, "majority_vote"),
        *((n, r) for n, r in enumerate(reducers, start=2)),
    ]
    # the run's own result stands: `show` reports it, the original reduction first
    assert document["reducer"] == "majority_vote"
    assert document["answer"] == finished.result["answer"]
    assert document["reductions"][0]["winner"] == finished.result["answer"]

    text = cli(capsys, "show", RUN, "--runs-dir", finished.runs)
    assert text.code == 0, text.err
    for number, reducer in enumerate(reducers, start=2):
        assert f"reduction {number}: {reducer} -> " in text.out

    assert cli(capsys, "tail", RUN, "--runs-dir", finished.runs).code == 0
    state = fold(JsonlEventLog(finished.log).read(), run_id=RUN)
    assert sorted(state.reductions) == [1, 2, 3, 4, 5]
    assert state.open_reduction is None
    assert state.result is not None and state.result["reducer"] == "majority_vote"
    resumed = lanefold.resume_sync(RUN, runs_dir=finished.runs)
    assert resumed.reducer == "majority_vote"  # a finished run returns its own result
    assert resumed.answer == finished.result["answer"]


def test_agreement_and_margin_are_reported_for_each_reduction(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    votes = finished.result["votes"]
    top = votes[finished.result["answer"]]
    assert finished.result["agreement"] == pytest.approx(top / sum(votes.values()))
    assert finished.result["margin"] == pytest.approx(
        top - max((v for a, v in votes.items() if a != finished.result["answer"]), default=0)
    )
    judged = finished.reduce(capsys, "judge_argmax", "--json").json
    scores = sorted((s for s in judged["scores"].values() if s is not None), reverse=True)
    assert judged["margin"] == pytest.approx(scores[0] - scores[1])
    answers = [lane["answer"] for lane in finished.result["lanes"] if lane["answer"]]
    assert judged["agreement"] == pytest.approx(answers.count(judged["answer"]) / len(answers))
    shown = cli(capsys, "show", RUN, "--runs-dir", finished.runs, "--json").json
    first, second = shown["reductions"]
    assert first["agreement"] == pytest.approx(finished.result["agreement"])
    assert first["margin"] == pytest.approx(finished.result["margin"])
    assert second["agreement"] == pytest.approx(judged["agreement"])
    assert second["margin"] == pytest.approx(judged["margin"])


# -- extraction -----------------------------------------------------------------------------------


def test_extract_regex_changes_the_answers_the_new_reduction_reads(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    before = finished.events()
    outcome = finished.reduce(capsys, "majority_vote", "--extract-regex", r"gives (\d)", "--json")
    assert outcome.code == 0, outcome.err
    result = outcome.json
    first_digits = {answer[0] for answer in finished.result["votes"]}
    assert set(result["votes"]) == first_digits
    assert sum(result["votes"].values()) == sum(finished.result["votes"].values())
    (started,) = [e["data"] for e in after_the_run(finished.events()) if e["type"] == "reduce.started"]
    assert started["extract"]["regex"] == r"gives (\d)"
    # the lanes' recorded answers are the run's, untouched
    lanes = [e["data"]["answer"] for e in before if e["type"] == "lane.completed"]
    assert [e["data"]["answer"] for e in finished.events() if e["type"] == "lane.completed"] == lanes
    shown = cli(capsys, "show", RUN, "--runs-dir", finished.runs, "--json").json
    assert shown["reductions"][1]["votes"] == result["votes"]
    assert shown["votes"] == finished.result["votes"]


def test_extract_method_reads_answers_with_that_method(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = finished.reduce(capsys, "majority_vote", "--extract", "last_number", "--json")
    assert outcome.code == 0, outcome.err
    assert outcome.json["votes"] == finished.result["votes"]  # the text ends in its answer


def test_a_bad_extract_regex_is_refused_before_the_log_is_touched(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    before = finished.log.read_bytes()
    outcome = finished.reduce(capsys, "majority_vote", "--extract-regex", "no group")
    assert outcome.code == 2
    assert outcome.error_line.startswith("orchestrator reduce: --extract-regex: ")
    assert finished.log.read_bytes() == before


def test_session_reduce_takes_an_extract_spec(finished: Finished) -> None:
    from lanefold.primitives import ExtractSpec

    async def go() -> lanefold.RunResult:
        async with lanefold.Session(runs_dir=finished.runs) as session:
            return await session.reduce(
                RUN, reducer="majority_vote", extract=ExtractSpec(regex=r"gives (\d)")
            )

    result = anyio.run(go)
    assert set(result.votes) == {answer[0] for answer in finished.result["votes"]}


# -- refusals -------------------------------------------------------------------------------------


def test_an_unknown_reducer_exits_2_naming_the_option(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    before = finished.log.read_bytes()
    outcome = finished.reduce(capsys, "no_such_reducer")
    assert outcome.code == 2
    line = outcome.error_line
    assert line.startswith("orchestrator reduce: --reducer: ")
    assert "no_such_reducer" in line
    assert finished.log.read_bytes() == before


def test_an_unfinished_run_exits_2(finished: Finished, capsys: pytest.CaptureFixture[str]) -> None:
    lines = finished.log.read_text(encoding="utf-8").splitlines(keepends=True)
    assert json.loads(lines[-1])["type"] == "run.completed"
    finished.log.write_text("".join(lines[:-1]), encoding="utf-8")  # a crash before the end
    before = finished.log.read_bytes()
    outcome = finished.reduce(capsys, "majority_vote")
    assert outcome.code == 2
    assert "has not completed" in outcome.error_line
    assert finished.log.read_bytes() == before


def test_a_second_writer_exits_2(finished: Finished, capsys: pytest.CaptureFixture[str]) -> None:
    before = finished.log.read_bytes()
    lock = RunLock.acquire(finished.runs / RUN, RUN)  # another writer holds the run
    try:
        outcome = finished.reduce(capsys, "majority_vote")
    finally:
        lock.release()
    assert outcome.code == 2
    assert outcome.error_line.startswith(
        f"orchestrator reduce: run {RUN} is being written by another process"
    )
    assert finished.log.read_bytes() == before
    assert finished.reduce(capsys, "majority_vote").code == 0  # the lock was given back


def test_a_missing_run_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = cli(capsys, "reduce", "nope", "--reducer", "majority_vote", "--runs-dir", tmp_path / "runs")
    assert outcome.code == 2
    assert "nope" in outcome.error_line


def test_a_reducer_refused_for_want_of_a_verifier_leaves_the_run_reducible(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = finished.reduce(capsys, "any_pass")
    assert refused.code == 2
    assert "verifier" in refused.error_line
    # The refusal is misuse, not a cut-off reduction: the run takes another reducer after it.
    again = finished.reduce(capsys, "majority_vote", "--json")
    assert again.code == 0, again.err
    events = finished.events()
    opened = [e for e in events if e["type"] == "reduce.started"]
    closed = [e for e in events if e["type"] == "reduce.completed" and e["data"]["reduction"] > 1]
    assert len(opened) == len(closed)


# -- verifiers in a re-reduction ------------------------------------------------------------------


CHECK = """\
import sys
text = sys.stdin.read()
passed = text.rstrip().endswith("Answer: 391")
print(9 if passed else 1)
sys.exit(0 if passed else 1)
"""


def test_any_pass_re_reduction_runs_the_configured_verifier_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = tmp_path / "check.py"
    check.write_text(CHECK, encoding="utf-8")
    run = finish(
        tmp_path,
        capsys,
        judge={"verifier_command": [sys.executable, str(check)]},
        loop={"reducer": "weighted_vote", "weighting": "verifier"},
    )
    calls = run.calls_made()
    outcome = run.reduce(capsys, "any_pass", "--json")
    assert outcome.code == 0, outcome.err
    assert run.calls_made() == calls  # a verifier is no model: nothing sampled
    result = outcome.json
    assert result["answer"] == "391"
    lanes = {lane["lane"]: lane["answer"] for lane in run.result["lanes"]}
    assert result["winner_lane"] == min(lane for lane, a in lanes.items() if a == "391")
    verdicts = [e["data"] for e in after_the_run(run.events()) if e["type"] == "judge.completed"]
    assert {v["candidate_lane"]: v["passed"] for v in verdicts} == {
        lane: answer == "391" for lane, answer in lanes.items()
    }
    assert {v["reduction"] for v in verdicts} == {2}
    assert all(v["judge"].startswith("command:") for v in verdicts)


def test_a_re_reduction_with_no_passing_lane_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = tmp_path / "never.py"
    check.write_text("import sys\nsys.stdin.read()\nsys.exit(3)\n", encoding="utf-8")
    run = finish(
        tmp_path,
        capsys,
        judge={"verifier_command": [sys.executable, str(check)]},
        loop={"reducer": "weighted_vote", "weighting": "verifier"},
    )
    outcome = run.reduce(capsys, "any_pass", "--json")
    assert outcome.code == 4, outcome.err
    result = outcome.json
    assert result["status"] == "no_answer" and result["answer"] is None
    assert "no lane passed" in result["reason"]
    (completed,) = [e["data"] for e in after_the_run(run.events()) if e["type"] == "reduce.completed"]
    assert completed["winner"] is None


def test_session_reduce_with_a_verifier_callable(finished: Finished) -> None:
    seen: list[str | None] = []

    def check(question: str, text: str, answer: str | None) -> bool:
        seen.append(answer)
        return answer == "391"

    async def go() -> lanefold.RunResult:
        async with lanefold.Session(runs_dir=finished.runs, verifier=check) as session:
            return await session.reduce(RUN, reducer="any_pass")

    calls = finished.calls_made()
    result = anyio.run(go)
    assert result.reducer == "any_pass"
    assert result.answer == "391"
    assert finished.calls_made() == calls
    assert sorted(seen, key=str) == sorted(
        (lane["answer"] for lane in finished.result["lanes"] if lane["status"] == "completed"), key=str
    )
    verdicts = [e["data"] for e in after_the_run(finished.events()) if e["type"] == "judge.completed"]
    assert len(verdicts) == len(seen)
    assert all("passed" in v for v in verdicts)


def test_reduce_finds_a_module_verifier_beside_the_config_in_a_fresh_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # `run` resolves `module:function` from the config's folder (and the working directory);
    # the same run reduced later, from another directory in a new process (the folder not on
    # sys.path, the module not imported), must find it as `run` did.
    module = "lanefold_reduce_check_fixture"
    beside = tmp_path / "configs"
    beside.mkdir()
    (beside / f"{module}.py").write_text(
        "def check(question, text, answer):\n    return answer == '391'\n", encoding="utf-8"
    )
    run = finish(beside, capsys, judge={"verifier": f"{module}:check"}, loop={"reducer": "any_pass"})
    assert run.result["answer"] == "391"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(
        sys, "path", [p for p in sys.path if Path(p or ".").resolve() not in (beside, elsewhere)]
    )
    monkeypatch.delitem(sys.modules, module)
    outcome = run.reduce(capsys, "judge_argmax", "--json")
    assert outcome.code == 0, outcome.err
    assert outcome.json["answer"] == "391"
    assert outcome.json["reducer"] == "judge_argmax"


@pytest.mark.anyio
async def test_a_re_reduction_reports_sampling_time_not_the_idle_time_since(tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {"loop": {"k": 3, "seed": 2}, "backend": {"kind": "simulated", "latency_ms": [0, 0]}}
    )
    async with lanefold.Session(config, runs_dir=tmp_path) as session:
        first = await session.run("q", run_id="idle")
        await anyio.sleep(0.3)  # the run sits finished; a re-reduction later must not bill it
        again = await session.reduce("idle", reducer="majority_vote")
    assert again.elapsed_s == first.elapsed_s  # a vote dispatches nothing: no time added


@pytest.mark.anyio
async def test_a_re_reduction_of_a_multi_wave_run_reads_every_wave(tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {
            "loop": {
                "coordinator": "adaptive_sample",
                "window": 2,
                "max_lanes": 10,
                "rule": "beta",
                "threshold": 0.99,
                "seed": 4,
            },
            "backend": {"kind": "simulated", "accuracy": 0.5},
        }
    )
    async with lanefold.Session(config, runs_dir=tmp_path) as session:
        first = await session.run("q", run_id="waves")
        again = await session.reduce("waves", reducer="majority_vote")
    assert first.outcome["waves"] > 1
    assert sum(again.votes.values()) == sum(first.votes.values()) == first.outcome["completed"]
    assert (again.answer, again.votes) == (first.answer, first.votes)
