"""Every built-in loop's reduction re-derived from its log, with every built-in reducer.

A run of each loop with each reducer (a vote, logprob and verifier weights, an LLM judge, a
verifier judge, usc, any_pass) reads back as it was written; the same log with its reduce and
result rewritten alike to crown another candidate (a record that agrees with itself and names
a lane that ran) is refused at the reduce's line, because the reducer run again over the
lanes gives another winner. A Session's own verifier, which no config names, reads back too.
A vote held to a quorum of answers it did not reach reads back as no answer, run again with the
quorum it records; without that quorum it would name the lone ballot, and is refused.
The forgeries of each loop's own records, on both stores, are in tests/test_record_refusal.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.cli import main
from lanefold.primitives import LaneOutcome, Sample, SampleRequest

QUESTION = "17 * 23?"
VERIFIERS = """
def length(question, text, answer):
    return (len(text) % 7) / 7

def passes(question, text, answer):
    return answer == "391"
"""
JUDGE = {"template": "Question: {question}\nCandidate: {candidate}\nScore (0-10):"}
REDUCERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "majority_vote": ({"reducer": "majority_vote"}, {}),
    "logprob vote": ({"reducer": "majority_vote", "weighting": "mean_logprob"}, {}),
    "weighted_vote": ({"reducer": "weighted_vote"}, {}),
    "verifier weights": ({"reducer": "weighted_vote", "weighting": "verifier"}, {"verifier": "V:length"}),
    "llm judge": ({"reducer": "judge_argmax"}, JUDGE),
    "verifier judge": ({"reducer": "judge_argmax"}, {"verifier": "V:length"}),
    "usc": ({"reducer": "usc"}, {}),
    "any_pass": ({"reducer": "any_pass"}, {"verifier": "V:passes"}),
}
LOOPS: dict[str, dict[str, Any]] = {
    "parallel_sample": {"k": 6},
    "adaptive_sample": {"window": 3, "max_lanes": 6, "rule": "beta", "threshold": 0.99},
    "debate": {"agents": 3, "rounds": 1, "early_exit": False},
    "sequential_refine": {"steps": 3, "stop_on_pass": False},
}
CASES = [(loop, name) for loop in LOOPS for name in REDUCERS]


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "V.py").write_text(VERIFIERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "runs"


def config(loop: str, reducer: str) -> lanefold.LoopConfig:
    keys, judge = REDUCERS[reducer]
    if loop == "sequential_refine":
        keys = {("reduce" if k == "reducer" else k): v for k, v in keys.items()}
    raw: dict[str, Any] = {
        "loop": {"coordinator": loop, **LOOPS[loop], **keys, "seed": 3},
        "backend": {"kind": "simulated", "accuracy": 0.6},
        "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
    }
    if judge:
        raw["judge"] = judge
    return lanefold.parse_config(raw)


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def shown(runs: Path, run_id: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["show", run_id, "--runs-dir", str(runs), "--json"])
    return code, capsys.readouterr().err


def crown_another(events: list[dict[str, Any]]) -> int | None:
    """The reduce and result rewritten alike to name another candidate that completed (its
    answer, lane, wave and text); the reduce's line, or None where there is no other one."""
    reduced = next(e for e in events if e["type"] == "reduce.completed")
    reduce, result = reduced["data"], events[-1]["data"]["result"]
    waves = reduce.get("candidate_waves") or [reduced["wave"]]
    winner = (result["winner_wave"], reduce["winner_lane"])
    other = next(
        (
            e
            for e in events
            if e["type"] == "lane.completed" and e["wave"] in waves and (e["wave"], e["lane"]) != winner
        ),
        None,
    )
    if other is None:
        return None
    answer = other["data"]["answer"]
    reduce.update(winner=answer, winner_lane=other["lane"])
    if "winner_wave" in reduce:
        reduce["winner_wave"] = other["wave"]
    result.update(
        answer=answer, winner_lane=other["lane"], winner_wave=other["wave"], winner_text=other["data"]["text"]
    )
    result["status"] = "answered"
    return int(reduced["sequence"])


@pytest.mark.parametrize(("loop", "reducer"), CASES)
def test_a_loops_reduce_reads_back_and_another_winner_is_refused(
    runs: Path, capsys: pytest.CaptureFixture[str], loop: str, reducer: str
) -> None:
    result = lanefold.run_sync(config(loop, reducer), QUESTION, runs_dir=runs, run_id="r")
    assert result.status in ("answered", "no_answer") and result.events is not None
    assert shown(runs, "r", capsys) == (0 if result.status == "answered" else 4, "")
    path = Path(result.events)
    events = read(path)
    line = crown_another(events)
    assert line is not None, "every case has a second candidate to crown"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, err = shown(runs, "r", capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(
        rf"events\.jsonl:{line}: corrupt event log line: reduce\.completed does not follow", err
    ), err


def test_a_sessions_own_verifier_reads_back(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A verifier given to the run, not named by its config, judged the candidates: the
    replay ranks them by its recorded verdicts, not by the config's LLM judge."""

    def longest(question: str, text: str, answer: str | None) -> float:
        return float(len(text))

    judged = lanefold.run_sync(
        config("parallel_sample", "llm judge"), QUESTION, runs_dir=runs, run_id="v", verifier=longest
    )
    assert {
        e["data"]["judge"] for e in read(Path(judged.events or "")) if e["type"] == "judge.completed"
    } != {"llm"}
    assert shown(runs, "v", capsys) == (0, "")


class OneAnswer(SimulatedBackend):
    """Lane 0 of every wave answers 391 (a usc call's one lane too, which names no response);
    every other lane completes with nothing an extractor finds."""

    def __init__(self) -> None:
        super().__init__(SimulatedConfig())

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        async for outcome in super().sample(request):
            if isinstance(outcome, Sample):
                text = "Answer: 391" if outcome.lane == 0 else "I cannot tell."
                outcome = dataclasses.replace(outcome, text=text)
            yield outcome


QUORUM_LOOPS: dict[str, dict[str, Any]] = {
    "parallel_sample": {"k": 6, "min_quorum": 3},
    "adaptive_sample": {"window": 3, "max_lanes": 6, "rule": "esc", "min_quorum": 3},
}


@pytest.mark.parametrize("reducer", ["majority_vote", "weighted_vote", "usc"])
@pytest.mark.parametrize("loop", QUORUM_LOOPS)
def test_a_vote_below_its_quorum_reads_back_and_without_it_is_refused(
    runs: Path, capsys: pytest.CaptureFixture[str], loop: str, reducer: str
) -> None:
    raw = {"loop": {"coordinator": loop, **QUORUM_LOOPS[loop], "reducer": reducer, "seed": 3}}
    result = lanefold.run_sync(
        lanefold.parse_config(raw), QUESTION, runs_dir=runs, run_id="q", backend=OneAnswer()
    )
    assert (result.status, result.lanes_completed, result.lanes_answered) == ("no_answer", 6, 1)
    assert result.reason == "1 of 6 lanes answered, below the quorum of 3"
    assert shown(runs, "q", capsys) == (4, "")
    path = Path(result.events or "")
    events = read(path)
    reduced = next(e for e in events if e["type"] == "reduce.completed")
    assert reduced["data"]["detail"]["quorum"] == 3
    del reduced["data"]["detail"]["quorum"]  # as a vote before the quorum: it names the ballot
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, err = shown(runs, "q", capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(
        rf"events\.jsonl:{reduced['sequence']}: .*reduce\.completed does not follow from .*: "
        r"it says winner = None, \w+ over them gives '391'",
        err,
    ), err
