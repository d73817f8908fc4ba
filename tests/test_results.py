"""What a run hands back, and how: a quiet library, honest no-answer outcomes, the result's
fields checked against the log, caller-owned objects left open, errors in the one tree.

Fast tests run on the simulated backend, named in every config (the default is the engine);
one slow test reuses a real EngineBackend across two runs.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.cli import main
from lanefold.primitives import LaneOutcome, Sample, SampleRequest

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is 17 * 23?"
SIMULATED = {"kind": "simulated", "accuracy": 0.5}
NEVER = {"regex": r"NEVER-MATCHES-(\d+)"}
FAST_RETRY = {"initial_backoff_s": 0.0, "max_backoff_s": 0.0, "jitter": 0.0}
VERIFIERS = (
    "def none(q, text, answer):\n    return None\n\n\ndef length(q, text, answer):\n"
    "    return float(len(text))\n"
)


def config(**sections: dict[str, Any]) -> lanefold.LoopConfig:
    raw: dict[str, Any] = {"loop": {"k": 6, "seed": 3}, "backend": dict(SIMULATED)}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return lanefold.parse_config(raw)


def events(result: lanefold.RunResult) -> list[dict[str, Any]]:
    assert result.events is not None
    return [json.loads(line) for line in Path(result.events).read_text().splitlines()]


def sample_lanes(log: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in log if e["type"] == kind and e.get("wave") == 1]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"  # not created in advance: a refused run leaves no trace


@pytest.fixture
def verifiers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A verifier module on sys.path for this test; its name, for `module:function`."""
    (tmp_path / "lanefold_results_verifiers.py").write_text(VERIFIERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "lanefold_results_verifiers"


@pytest.fixture
def bare_logger() -> Iterator[logging.Logger]:
    """The `lanefold` logger as a fresh process has it (an in-process CLI may have set it)."""
    logger = logging.getLogger("lanefold")
    handlers, level = list(logger.handlers), logger.level
    logger.handlers.clear()
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


# -- a quiet library --------------------------------------------------------------------------------


def test_a_library_run_prints_nothing_and_logs_under_lanefold(
    runs: Path,
    bare_logger: logging.Logger,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="lanefold")
    root_handlers = list(logging.getLogger().handlers)
    failing = config(backend={"failure_rate": 0.5}, retry={**FAST_RETRY, "max_attempts": 6})
    result = lanefold.run_sync(failing, QUESTION, runs_dir=runs)
    failed = [e for e in events(result) if e["type"] == "lane.failed"]
    assert failed, "the seed must make some lanes fail"
    assert capsys.readouterr() == ("", ""), "the library prints nothing"
    records = [r for r in caplog.records if r.getMessage().startswith("lane.failed")]
    assert len(records) == len(failed)
    assert all(r.name.startswith("lanefold") and r.levelno == logging.DEBUG for r in records)
    assert bare_logger.handlers == [], "the library configures no handler"
    assert logging.getLogger().handlers == root_handlers


@pytest.fixture
def failing_toml(tmp_path: Path) -> Path:
    path = tmp_path / "failing.toml"
    path.write_text(
        '[loop]\nk = 6\nseed = 3\n[backend]\nkind = "simulated"\nfailure_rate = 0.5\n'
        "[retry]\nmax_attempts = 6\ninitial_backoff_s = 0.0\nmax_backoff_s = 0.0\n"
    )
    return path


@pytest.mark.slow
def test_the_cli_shows_the_librarys_log_on_stderr_only_with_verbose(failing_toml: Path, runs: Path) -> None:
    def command(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "lanefold",
                "run",
                str(failing_toml),
                "--question",
                QUESTION,
                "--runs-dir",
                str(runs),
                "--json",
                *extra,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    quiet, verbose = command(), command("-v")
    assert (quiet.returncode, verbose.returncode) == (0, 0), verbose.stderr
    assert quiet.stderr == "" and "lane.failed" in verbose.stderr
    for done in (quiet, verbose):
        assert len(done.stdout.splitlines()) == 1, "stdout holds only the JSON result"


def test_each_cli_call_logs_to_the_stderr_it_was_given(
    failing_toml: Path,
    runs: Path,
    bare_logger: logging.Logger,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    argv = ["run", str(failing_toml), "--question", QUESTION, "--runs-dir", str(runs), "--json"]
    assert main(argv) == 0
    assert capsys.readouterr().err == ""
    assert main([*argv, "-v"]) == 0
    assert "lane.failed" in capsys.readouterr().err
    later = io.StringIO()  # the next call (a later test, a notebook cell) has another stderr
    monkeypatch.setattr(sys, "stderr", later)
    assert main([*argv, "-v"]) == 0
    assert "Logging error" not in later.getvalue() + capsys.readouterr().err
    assert "lane.failed" in later.getvalue()


# -- honest outcomes --------------------------------------------------------------------------------


def test_no_extractable_answer_completes_without_an_answer(runs: Path) -> None:
    result = lanefold.run_sync(config(extract=NEVER), QUESTION, runs_dir=runs)
    log = events(result)
    assert log[-1]["type"] == "run.completed"
    assert log[-1]["data"]["result"] == result.model_dump(mode="json")
    assert (result.status, result.answer, result.winner_lane) == ("no_answer", None, None)
    assert result.reason is not None and "6 of 6" in result.reason
    example = result.reason.split("e.g. ", 1)[1].strip("'\"…")
    texts = [" ".join(e["data"]["text"].split()) for e in sample_lanes(log, "lane.completed")]
    assert any(text.startswith(example) for text in texts), result.reason
    assert len(example) < max(map(len, texts)), "the example is shortened"


def test_a_judge_whose_scores_all_abstain_completes_without_an_answer(runs: Path, verifiers: str) -> None:
    judged = config(loop={"reducer": "judge_argmax"}, judge={"verifier": f"{verifiers}:none"})
    result = lanefold.run_sync(judged, QUESTION, runs_dir=runs)
    assert events(result)[-1]["type"] == "run.completed"
    assert (result.status, result.answer, result.winner_lane) == ("no_answer", None, None)
    assert result.reason is not None and "no candidate got a score" in result.reason
    assert "6 of 6" in result.reason and "e.g. " in result.reason  # a candidate left unscored


JUDGE_NO_SCORE = (
    '[loop]\nk = 3\nreducer = "judge_argmax"\n[backend]\nkind = "simulated"\n'
    '[judge]\ntemplate = "Q: {question}\\nA: {candidate}\\nScore:"\nmax_tokens = 2\n'
)
EXTRACT_NONE = "[loop]\nk = 4\n[backend]\nkind = \"simulated\"\n[extract]\nregex = 'NEVER-(\\d+)'\n"


@pytest.mark.parametrize(
    ("text", "said"),
    [(EXTRACT_NONE, "4 of 4 completed lanes"), (JUDGE_NO_SCORE, "no candidate got a score")],
    ids=["no extractable answer", "judge output without a score"],
)
def test_the_cli_exits_4_without_an_answer(
    text: str, said: str, runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loop.toml"  # the judge gets two tokens: its score is cut off each time
    path.write_text(text)
    code = main(["run", str(path), "--question", QUESTION, "--runs-dir", str(runs)])
    out, err = capsys.readouterr()
    assert (code, err) == (4, "")
    assert "no answer" in out and said in out and "e.g." in out
    code = main(["run", str(path), "--question", QUESTION, "--runs-dir", str(runs), "--json"])
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert (code, err) == (4, "")
    assert (result["status"], result["answer"]) == ("no_answer", None)
    assert said in result["reason"]


class OneAnswer(SimulatedBackend):
    """Lane 0 answers 7; every other lane completes with nothing an extractor finds."""

    def __init__(self) -> None:
        super().__init__(SimulatedConfig())

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        async for outcome in super().sample(request):
            if isinstance(outcome, Sample):
                text = "Answer: 7" if outcome.lane == 0 else "I cannot tell."
                outcome = dataclasses.replace(outcome, text=text)
            yield outcome


def test_a_quorum_counts_the_lanes_that_gave_an_answer(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 16 lanes complete, one gives an answer: below a quorum of 3, that one ballot is no vote.
    result = lanefold.run_sync(
        config(loop={"k": 16, "min_quorum": 3}), QUESTION, runs_dir=runs, backend=OneAnswer()
    )
    assert (result.status, result.answer, result.agreement) == ("no_answer", None, None)
    assert (result.lanes_completed, result.lanes_answered) == (16, 1)
    assert result.reason == "1 of 16 lanes answered, below the quorum of 3"
    assert main(["show", result.run_id, "--runs-dir", str(runs)]) == 4
    assert "1 of 16 lanes answered" in capsys.readouterr().out
    # A quorum of one takes the lone ballot, and says how few lanes answered.
    lone = lanefold.run_sync(config(loop={"k": 16}), QUESTION, runs_dir=runs, backend=OneAnswer())
    assert (lone.status, lone.answer, lone.agreement, lone.lanes_answered) == ("answered", "7", 1.0, 1)
    assert main(["show", lone.run_id, "--runs-dir", str(runs)]) == 0
    assert "1 of 16 lanes answered" in capsys.readouterr().out


def test_adaptive_sampling_counts_its_quorum_in_answers_too(runs: Path) -> None:
    adaptive = lanefold.parse_config(
        {
            "loop": {"coordinator": "adaptive_sample", "window": 4, "max_lanes": 8, "min_quorum": 3},
            "backend": dict(SIMULATED),
        }
    )
    result = lanefold.run_sync(adaptive, QUESTION, runs_dir=runs, backend=OneAnswer())
    assert (result.status, result.answer) == ("no_answer", None)
    assert result.reason == "1 of 8 lanes answered, below the quorum of 3"
    assert result.lanes_answered == 1


# -- the result's fields ----------------------------------------------------------------------------


def test_a_majority_result_matches_its_log(runs: Path) -> None:
    flaky = config(
        loop={"k": 12, "min_quorum": 1},
        backend={"failure_rate": 0.3},
        retry={**FAST_RETRY, "max_attempts": 2},
    )
    result = lanefold.run_sync(flaky, QUESTION, runs_dir=runs)
    log = events(result)
    completed = {e["lane"]: e for e in sample_lanes(log, "lane.completed")}
    dispatched = [e["lane"] for e in sample_lanes(log, "lane.dispatched")]
    assert result.lanes_failed > 0 and len(result.votes) > 1, "the seed must give a contest"
    assert (result.status, result.reason) == ("answered", None)
    assert result.winner_text == completed[result.winner_lane]["data"]["text"]
    assert [lane.lane for lane in result.lanes] == list(range(12))
    for lane in result.lanes:
        assert lane.attempts == dispatched.count(lane.lane)
        assert lane.score is None
        if lane.lane in completed:
            data = completed[lane.lane]["data"]
            assert lane.status == "completed"
            assert (lane.answer, lane.finish_reason) == (data["answer"], data["finish_reason"])
            assert lane.tokens == data["usage"]["gen_ai.usage.output_tokens"]
        else:
            assert (lane.status, lane.answer, lane.tokens) == ("failed", None, 0)
    ranked = sorted(result.votes.values(), reverse=True)
    assert result.agreement == pytest.approx(result.votes[result.answer] / sum(ranked))
    assert result.margin == pytest.approx(ranked[0] - ranked[1])


def test_a_judge_result_has_its_scores_margin_and_winner_text(runs: Path, verifiers: str) -> None:
    # The text's length is the score: free-form, no extractable answer, still a winner.
    judged = config(
        loop={"reducer": "judge_argmax"}, extract=NEVER, judge={"verifier": f"{verifiers}:length"}
    )
    result = lanefold.run_sync(judged, QUESTION, runs_dir=runs)
    texts = {e["lane"]: e["data"]["text"] for e in sample_lanes(events(result), "lane.completed")}
    assert (result.status, result.answer) == ("answered", None)
    assert result.winner_lane is not None
    assert result.winner_text == texts[result.winner_lane]
    assert len(result.winner_text) == max(map(len, texts.values()))
    ranked = sorted((s for s in result.scores.values() if s is not None), reverse=True)
    assert result.margin == pytest.approx(ranked[0] - ranked[1])
    assert {lane.lane: lane.score for lane in result.lanes} == result.scores
    alone = config(loop={"reducer": "judge_argmax", "k": 1}, judge={"verifier": f"{verifiers}:length"})
    lone = lanefold.run_sync(alone, QUESTION, runs_dir=runs)
    assert (lone.winner_lane, lone.margin) == (0, None), "no runner-up: no lead to report"


# -- caller-owned objects and errors ----------------------------------------------------------------


class Borrowed(SimulatedBackend):
    """A backend the caller owns: the simulated one, counting `aclose` calls (or failing)."""

    def __init__(self, fail_with: type[BaseException] | None = None) -> None:
        super().__init__(SimulatedConfig())
        self.fail_with, self.closes = fail_with, 0

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        if self.fail_with is not None:
            raise self.fail_with("a bug inside the backend")
        async for outcome in super().sample(request):
            yield outcome

    async def aclose(self) -> None:
        self.closes += 1


@pytest.mark.anyio
async def test_what_the_caller_gives_is_never_closed(runs: Path) -> None:
    judged = config(
        loop={"reducer": "judge_argmax"}, judge={"template": "Q: {question}\nA: {candidate}\nScore:"}
    )
    backend, judge, limiter = Borrowed(), Borrowed(), anyio.CapacityLimiter(8)
    first = await lanefold.run(
        judged, QUESTION, runs_dir=runs, backend=backend, judge_backend=judge, limiter=limiter
    )
    second = await lanefold.run(
        judged, QUESTION, runs_dir=runs, backend=backend, judge_backend=judge, limiter=limiter
    )
    assert first.status == second.status == "answered"
    assert judge.requests > 0, "the judge wave went to the judge backend"
    assert (backend.closes, judge.closes) == (0, 0)
    assert (limiter.borrowed_tokens, limiter.total_tokens) == (0, 8)
    async with limiter:
        assert limiter.borrowed_tokens == 1


@pytest.mark.anyio
async def test_a_shared_limiter_smaller_than_k_bounds_lanes_without_deadlock(runs: Path) -> None:
    limiter = anyio.CapacityLimiter(2)  # shared by runs; k = 6 lanes must take turns
    with anyio.fail_after(10):  # milliseconds of work; a deadlock fails instead of hanging
        result = await lanefold.run(config(), QUESTION, runs_dir=runs, limiter=limiter)
    assert result.lanes_completed == 6
    assert limiter.borrowed_tokens == 0


@pytest.mark.parametrize("error", [RuntimeError, AssertionError])
def test_a_backend_bug_reaches_the_caller_as_a_run_error(error: type[BaseException], runs: Path) -> None:
    backend = Borrowed(fail_with=error)
    with pytest.raises(lanefold.RunError) as caught:
        lanefold.run_sync(config(), QUESTION, runs_dir=runs, run_id="bug", backend=backend)
    assert isinstance(caught.value, lanefold.LanefoldError)
    assert not isinstance(caught.value, BaseExceptionGroup)
    assert error.__name__ in str(caught.value)
    log = (runs / "bug" / "events.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["type"] == "run.failed"
    assert backend.closes == 0


@pytest.mark.anyio
async def test_run_sync_works_inside_a_running_event_loop(runs: Path) -> None:
    result = lanefold.run_sync(config(), QUESTION, runs_dir=runs)  # a notebook's cell
    assert isinstance(result, lanefold.RunResult) and result.status == "answered"


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_one_engine_backend_serves_two_runs(runs: Path) -> None:
    from lanefold.backends.engine import EngineBackend, EngineConfig

    small = lanefold.parse_config({"loop": {"k": 2}, "sampling": {"max_tokens": 4}})
    backend = EngineBackend(EngineConfig())
    try:
        for _ in range(2):
            result = await lanefold.run(small, "What is 2 + 2?", runs_dir=runs, backend=backend)
            assert result.lanes_completed == 2
            assert events(result)[-1]["type"] == "run.completed"
    finally:
        await backend.aclose()


# -- votes: counts are integers, weights are not ----------------------------------------------------


def int_counts(votes: dict[str, Any]) -> bool:
    return bool(votes) and all(type(v) is int for v in votes.values())


def test_a_plain_votes_are_ballot_counts_as_integers(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = lanefold.run_sync(config(), QUESTION, runs_dir=runs)
    assert int_counts(result.votes)
    assert sum(result.votes.values()) == result.lanes_completed  # every lane here answered
    assert int_counts(json.loads(result.model_dump_json())["votes"])  # {"391": 5}, not 5.0
    log = events(result)
    (reduced,) = [e for e in log if e["type"] == "reduce.completed"]
    assert int_counts(reduced["data"]["votes"])
    assert int_counts(log[-1]["data"]["result"]["votes"])
    assert main(["show", result.run_id, "--runs-dir", str(runs), "--json"]) == 0
    assert int_counts(json.loads(capsys.readouterr().out)["votes"])


def test_a_weighted_votes_are_total_weights(runs: Path, verifiers: str) -> None:
    weighted = config(
        loop={"reducer": "weighted_vote", "weighting": "verifier"}, judge={"verifier": f"{verifiers}:length"}
    )
    result = lanefold.run_sync(weighted, QUESTION, runs_dir=runs)
    assert result.votes and all(type(v) is float for v in result.votes.values())
    assert any(not v.is_integer() or v > result.lanes_completed for v in result.votes.values())
    (reduced,) = [e for e in events(result) if e["type"] == "reduce.completed"]
    assert all(type(v) is float for v in reduced["data"]["votes"].values())


def test_a_log_that_recorded_counts_as_floats_still_reads(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Logs written before counts were integers hold them as 5.0: they fold, pass the audit,
    # show and resume as recorded; a re-reduction records integers.
    result = lanefold.run_sync(config(), QUESTION, runs_dir=runs)
    assert result.events is not None
    path = Path(result.events)
    lines = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        votes = (
            event["data"]
            if event["type"] == "reduce.completed"
            else event["data"].get("result", {})
            if event["type"] == "run.completed"
            else {}
        )
        if "votes" in votes:
            votes["votes"] = {answer: float(count) for answer, count in votes["votes"].items()}
            line = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        lines.append(line)
    path.write_text("\n".join(lines) + "\n")
    for command in ("show", "resume"):
        assert main([command, result.run_id, "--runs-dir", str(runs), "--json"]) == 0
        out, err = capsys.readouterr()
        assert err == ""
        shown = json.loads(out)["votes"]
        assert shown == result.votes and all(type(v) is float for v in shown.values())
    assert (
        main(["reduce", result.run_id, "--reducer", "majority_vote", "--runs-dir", str(runs), "--json"]) == 0
    )
    capsys.readouterr()
    reductions = [json.loads(line) for line in path.read_text().splitlines() if '"reduce.completed"' in line]
    assert [int_counts(e["data"]["votes"]) for e in reductions] == [False, True]
