"""Verifiers and the `[judge]` section, from config (and from a caller) to the log.

A verifier is a Python callable passed directly (`Session(..., verifier=fn)`,
`lanefold.run(..., verifier=fn)`), `[judge] verifier = "module:function"`, or
`[judge] verifier_command` (the candidate on stdin, exit 0 passes, a number on stdout is the
score, `verifier_timeout_s`, several at once up to `loop.max_concurrency`). Every verdict, and
every failure of a verifier, is a `judge.completed` event. The LLM judge's `[judge]` keys
(`stop`, `score_regex`) and `[loop] tie_break` reach it.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import lanefold
from lanefold.cli import main
from lanefold.primitives import ConfigError, Sample, SampleRequest, Usage
from lanefold.stores.files import JsonlEventLog

QUESTION = "What is 17 * 23?"
RUN = "v"


def said(answer: str) -> str:
    return f"Working it through gives {answer}.\nAnswer: {answer}"


BASE: dict[str, Any] = {
    "loop": {"k": 4, "seed": 5, "max_concurrency": 4},  # lanes say 381 391 401 391
    "prompt": {"template": "Question: {question}\nEnd with 'Answer: <number>'.\n"},
    "extract": {"method": "regex", "regex": r"Answer:\s*([-0-9.,]+)"},
    "backend": {
        "kind": "simulated",
        "answer": "391",
        "accuracy": 0.5,
        "distractors": ["381", "401"],
        "latency_ms": [0, 0],
    },
}


def raw_config(**sections: dict[str, Any]) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(json.dumps(BASE))  # a deep copy
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


def config(**sections: dict[str, Any]) -> lanefold.LoopConfig:
    return lanefold.parse_config(raw_config(**sections))


def config_file(folder: Path, **sections: dict[str, Any]) -> Path:
    path = folder / "loop.json"
    path.write_text(json.dumps(raw_config(**sections)), encoding="utf-8")
    return path


def events(path: Path | str) -> list[Any]:
    return list(JsonlEventLog(Path(path)).read())


def verdicts(path: Path | str) -> dict[int, Any]:
    found = [e.data for e in events(path) if e.type == "judge.completed"]
    by_lane = {d.candidate_lane: d for d in found}
    assert len(by_lane) == len(found), "a candidate judged twice"
    return by_lane


def answers(result: lanefold.RunResult) -> dict[int, str | None]:
    return {lane.lane: lane.answer for lane in result.lanes if lane.status == "completed"}


def run_cli(capsys: pytest.CaptureFixture[str], cfg: Path, runs: Path) -> tuple[int, Any, str]:
    code = main(["run", str(cfg), "--question", QUESTION, "--runs-dir", str(runs), "--run-id", RUN, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


Reply = Callable[[str, str, int], str]


@dataclass
class Scripted:
    """Lane i of a sample wave says `texts[i]` (with logprobs when they are asked for);
    a judge or usc lane says `reply(purpose, prompt, lane)`. Every request is kept."""

    texts: Sequence[str]
    reply: Reply = lambda purpose, prompt, lane: ""
    logprobs: Sequence[Sequence[float]] = ()
    requests: list[SampleRequest] = field(default_factory=list)
    name: str = "scripted"
    shares_prefix: bool = False
    max_lanes_per_request: int | None = None

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 10

    async def sample(self, request: SampleRequest) -> Any:
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        for lane in request.lanes:
            if request.purpose == "sample":
                text = self.texts[lane.lane]
                logprobs = (
                    tuple(self.logprobs[lane.lane]) if request.params.logprobs and self.logprobs else None
                )
            else:
                text, logprobs = self.reply(request.purpose, request.prompt, lane.lane), None
            yield Sample(lane.lane, text, "stop", Usage(10, 0, 5), logprobs=logprobs)

    async def aclose(self) -> None:
        pass

    def of(self, purpose: str) -> list[SampleRequest]:
        return [r for r in self.requests if r.purpose == purpose]


@pytest.fixture(autouse=True)
def _sys_path_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """`orchestrator run` puts the config's folder on sys.path (for `module:function`
    verifiers); each test gets the path back as it was."""
    monkeypatch.setattr(sys, "path", list(sys.path))


# -- [judge] validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sections", "where"),
    [
        ({"judge": {"score_regex": "VERDICT"}}, "judge.score_regex"),
        ({"judge": {"score_regex": "("}}, "judge.score_regex"),
        ({"judge": {"verifier": "no_colon"}}, "judge.verifier"),
        ({"loop": {"reducer": "judge_argmax"}, "judge": {"template": "no slot"}}, "judge.template"),
        ({"loop": {"reducer": "any_pass"}, "judge": {"verifier_timeout_s": 0}}, "judge.verifier_timeout_s"),
        ({"loop": {"reducer": "any_pass"}, "judge": {"verifier_command": []}}, "judge.verifier_command"),
        (
            {"loop": {"reducer": "any_pass"}, "judge": {"verifier_command": "python check.py"}},
            "judge.verifier_command",
        ),
        ({"judge": {"verifier": "m:f"}}, "judge.verifier"),  # majority_vote reads no verifier
        ({"loop": {"reducer": "usc"}, "judge": {"verifier_command": ["x"]}}, "judge.verifier_command"),
        ({"loop": {"reducer": "weighted_vote"}, "judge": {"template": "{candidate}"}}, "judge.template"),
        ({"loop": {"reducer": "no_such_reducer"}}, "loop.reducer"),
        ({"loop": {"weighting": "by_vibes"}}, "loop.weighting"),
        ({"loop": {"tie_break": "alphabetical"}}, "loop.tie_break"),
    ],
)
def test_a_bad_judge_or_reducer_setting_is_refused_naming_its_field(
    sections: dict[str, dict[str, Any]], where: str
) -> None:
    with pytest.raises(ConfigError, match=f"^<config>: {re.escape(where)}: "):
        config(**sections)


@pytest.mark.parametrize(
    "sections",
    [
        {
            "loop": {"reducer": "usc"},
            "judge": {
                "usc_template": "{question}\n{candidates}",
                "stop": ["\n\n"],
                "temperature": 0.2,
                "max_tokens": 32,
            },
        },
        {
            "loop": {"reducer": "weighted_vote", "weighting": "verifier"},
            "judge": {"verifier_command": ["python", "check.py"], "verifier_timeout_s": 5},
        },
        {"loop": {"reducer": "any_pass"}, "judge": {"verifier_command": ["python", "check.py"]}},
        {
            "loop": {"reducer": "judge_argmax", "tie_break": "lexicographic"},
            "judge": {"template": "{question} {candidate}", "score_regex": r"VERDICT=(\d+)", "stop": ["###"]},
        },
    ],
)
def test_the_keys_a_reducer_reads_are_accepted(sections: dict[str, dict[str, Any]]) -> None:
    loaded = config(**sections)
    for key, value in sections.get("judge", {}).items():
        assert getattr(loaded.judge, key) == value


def test_a_reducer_that_needs_a_verifier_is_refused_before_the_run_without_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"judge\.verifier: reducer any_pass needs a verifier"):
        lanefold.Session(config(loop={"reducer": "any_pass"}), runs_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"judge\.template: reducer judge_argmax needs"):
        lanefold.Session(config(loop={"reducer": "judge_argmax"}), runs_dir=tmp_path)
    # a verifier given by the caller is enough
    lanefold.Session(config(loop={"reducer": "any_pass"}), runs_dir=tmp_path, verifier=lambda q, t, a: True)


def test_weighting_by_verifier_without_a_verifier_is_refused_before_sampling(tmp_path: Path) -> None:
    cfg = config(loop={"reducer": "weighted_vote", "weighting": "verifier"})
    with pytest.raises(ConfigError, match=r"judge\.verifier"):
        lanefold.Session(cfg, runs_dir=tmp_path)


def test_a_verifier_that_does_not_import_is_refused_before_the_run(tmp_path: Path) -> None:
    cfg = config(loop={"reducer": "any_pass"}, judge={"verifier": "lanefold_no_such_module_here:check"})
    with pytest.raises(ConfigError, match=r"judge\.verifier: cannot import"):
        lanefold.Session(cfg, runs_dir=tmp_path)


# -- a callable passed directly -------------------------------------------------------------------


def only_391(question: str, text: str, answer: str | None) -> bool:
    assert question == QUESTION
    assert text.endswith(f"Answer: {answer}")
    return answer == "391"


def test_orchestrator_run_takes_a_verifier_callable(tmp_path: Path) -> None:
    result = lanefold.run_sync(
        config(loop={"reducer": "any_pass"}), QUESTION, runs_dir=tmp_path, run_id=RUN, verifier=only_391
    )
    lanes = answers(result)
    assert result.reducer == "any_pass"
    assert result.answer == "391"
    assert result.winner_lane == min(lane for lane, a in lanes.items() if a == "391")
    assert result.agreement == pytest.approx(sum(a == "391" for a in lanes.values()) / len(lanes))
    judged = verdicts(result.events or "")
    assert {lane: v.passed for lane, v in judged.items()} == {lane: a == "391" for lane, a in lanes.items()}
    assert {v.judge for v in judged.values()} == {f"{__name__}:only_391"}
    assert all(v.error is None for v in judged.values())


@pytest.mark.anyio
async def test_a_session_takes_a_verifier_callable_in_place_of_the_configs(tmp_path: Path) -> None:
    cfg = config(
        loop={"reducer": "judge_argmax"},
        judge={"verifier_command": [sys.executable, "-c", "raise SystemExit(9)"]},
    )
    scores = {"391": 0.9, "381": 0.4, "401": 0.1}

    async def score(question: str, text: str, answer: str | None) -> float:
        await anyio.lowlevel.checkpoint()
        return scores[answer or ""]

    async with lanefold.Session(cfg, runs_dir=tmp_path, verifier=score) as session:
        result = await session.run(QUESTION, run_id=RUN)
    lanes = answers(result)
    assert result.scores == {lane: scores[a or ""] for lane, a in lanes.items()}
    best = max(result.scores.values(), key=lambda s: s or 0)
    assert result.answer == next(a for a, s in scores.items() if s == best)
    assert {v.judge for v in verdicts(result.events or "").values()} == {f"{__name__}:{score.__qualname__}"}


def test_a_sync_callable_runs_in_a_worker_thread(tmp_path: Path) -> None:
    threads: list[int] = []
    loop_threads: list[int] = []

    def check(question: str, text: str, answer: str | None) -> bool:
        threads.append(threading.get_ident())
        return True

    async def go() -> None:
        loop_threads.append(threading.get_ident())
        await lanefold.run(
            config(loop={"reducer": "any_pass"}), QUESTION, runs_dir=tmp_path, run_id=RUN, verifier=check
        )

    anyio.run(go)
    assert len(threads) == BASE["loop"]["k"]
    assert loop_threads[0] not in threads


def test_a_hung_sync_callable_times_out_after_verifier_timeout_s(tmp_path: Path) -> None:
    release = threading.Event()

    def hang(question: str, text: str, answer: str | None) -> bool:
        release.wait(5)  # far past the configured timeout; released at the end
        return True

    cfg = config(loop={"reducer": "any_pass"}, judge={"verifier_timeout_s": 0.3})
    try:
        result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id=RUN, verifier=hang)
    finally:
        release.set()
    assert result.status == "no_answer"
    judged = verdicts(result.events or "")
    assert len(judged) == BASE["loop"]["k"]
    assert {(v.error, v.passed, v.score) for v in judged.values()} == {("timeout", False, None)}


def test_every_failure_of_a_callable_is_a_judge_completed_event(tmp_path: Path) -> None:
    def moody(question: str, text: str, answer: str | None) -> object:
        if answer == "391":
            return 1.0
        if answer == "381":
            raise RuntimeError("checker crashed")
        return "maybe"

    result = lanefold.run_sync(
        config(loop={"reducer": "any_pass"}), QUESTION, runs_dir=tmp_path, run_id=RUN, verifier=moody
    )
    lanes = answers(result)
    assert set(lanes.values()) >= {"391", "381"}, "the seed must give both answers"
    expected = {"391": (None, True), "381": ("raised", False), "401": ("bad_output", False)}
    judged = verdicts(result.events or "")
    assert {lane: (v.error, v.passed) for lane, v in judged.items()} == {
        lane: expected[a or ""] for lane, a in lanes.items()
    }


# -- module:function ------------------------------------------------------------------------------


@pytest.fixture
def module_beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A verifier module beside the config (sys.path and sys.modules restored afterwards)."""
    name = "lanefold_verifier_config_fixture"
    (tmp_path / f"{name}.py").write_text(
        "import threading\n"
        "release = threading.Event()\n"
        "def check(question, text, answer):\n"
        "    return 7.0 if answer == '391' else 0.0\n"
        "def hang(question, text, answer):\n"
        "    release.wait(10)\n"
        "    return 1.0\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # also undoes what `run` adds to sys.path
    yield name
    module = sys.modules.pop(name, None)
    if module is not None:
        module.release.set()


def test_a_module_function_verifier_from_the_config(
    tmp_path: Path, module_beside: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(
        tmp_path, loop={"reducer": "judge_argmax"}, judge={"verifier": f"{module_beside}:check"}
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 0, err
    lanes = {lane["lane"]: lane["answer"] for lane in result["lanes"]}
    assert result["scores"] == {str(lane): 7.0 if a == "391" else 0.0 for lane, a in lanes.items()}
    assert result["answer"] == "391"
    assert result["margin"] == pytest.approx(0.0 if list(lanes.values()).count("391") > 1 else 7.0)
    judged = verdicts(result["events"])
    assert {v.judge for v in judged.values()} == {f"{module_beside}:check"}
    assert {lane: v.passed for lane, v in judged.items()} == {lane: a == "391" for lane, a in lanes.items()}


def test_a_module_function_verifier_times_out_after_verifier_timeout_s(
    tmp_path: Path, module_beside: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(
        tmp_path,
        loop={"reducer": "any_pass"},
        judge={"verifier": f"{module_beside}:hang", "verifier_timeout_s": 0.3},
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 4, err
    assert result["status"] == "no_answer"
    judged = verdicts(result["events"])
    assert {(v.error, v.passed) for v in judged.values()} == {("timeout", False)}


# -- a command ------------------------------------------------------------------------------------


CHECK = """\
import os, sys
text = sys.stdin.read()
answer = os.environ["LANEFOLD_ANSWER"]
assert os.environ["LANEFOLD_QUESTION"] == {question!r}
assert text.endswith("Answer: " + answer), text
if answer == "391":
    print("checking...")
    print(8.5)
    sys.exit(0)
print(2)
print("wrong answer", file=sys.stderr)
sys.exit(1)
"""


def script(folder: Path, name: str, code: str) -> list[str]:
    path = folder / name
    path.write_text(code, encoding="utf-8")
    return [sys.executable, str(path)]


def test_a_verifier_command_reads_the_candidate_on_stdin_and_scores_by_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = script(tmp_path, "check.py", CHECK.format(question=QUESTION))
    cfg = config_file(tmp_path, loop={"reducer": "judge_argmax"}, judge={"verifier_command": argv})
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 0, err
    lanes = {lane["lane"]: lane["answer"] for lane in result["lanes"]}
    assert result["scores"] == {str(lane): 8.5 if a == "391" else 2.0 for lane, a in lanes.items()}
    assert result["answer"] == "391"
    judged = verdicts(result["events"])
    for lane, answer in lanes.items():
        verdict = judged[lane]
        assert verdict.judge.startswith("command:")
        assert verdict.error is None
        assert verdict.passed is (answer == "391")
        if answer != "391":
            assert verdict.detail.startswith("exit status 1")
            assert "wrong answer" in verdict.detail


def test_weighting_by_a_verifier_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = script(tmp_path, "check.py", CHECK.format(question=QUESTION))
    cfg = config_file(
        tmp_path, loop={"reducer": "weighted_vote", "weighting": "verifier"}, judge={"verifier_command": argv}
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 0, err
    lanes = [lane["answer"] for lane in result["lanes"]]
    expected: dict[str, float] = {}
    for answer in lanes:
        expected[answer] = expected.get(answer, 0.0) + (8.5 if answer == "391" else 2.0)
    assert result["votes"] == pytest.approx(expected)
    assert result["answer"] == "391"
    assert len(verdicts(result["events"])) == len(lanes)


def test_a_hung_verifier_command_times_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = script(tmp_path, "hang.py", "import time\ntime.sleep(60)\n")
    cfg = config_file(
        tmp_path, loop={"reducer": "any_pass"}, judge={"verifier_command": argv, "verifier_timeout_s": 0.5}
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 4, err
    judged = verdicts(result["events"])
    assert len(judged) == BASE["loop"]["k"]
    assert {(v.error, v.passed, v.score) for v in judged.values()} == {("timeout", False, None)}


def test_a_verifier_command_that_cannot_start_is_a_recorded_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_file(
        tmp_path,
        loop={"reducer": "any_pass"},
        judge={"verifier_command": [str(tmp_path / "no-such-program")]},
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 4, err
    judged = verdicts(result["events"])
    assert len(judged) == BASE["loop"]["k"]
    assert {(v.error, v.passed) for v in judged.values()} == {("exit", False)}
    assert all("cannot start" in v.detail for v in judged.values())


BARRIER = """\
import os, sys, time
folder = sys.argv[1]
open(os.path.join(folder, str(os.getpid())), "w").close()
deadline = time.monotonic() + 30
while len(os.listdir(folder)) < int(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.01)
print(len(os.listdir(folder)))
"""


def test_verifier_commands_run_several_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each command waits until all four have started: run one at a time, the first would
    # give up after 30 s and score 1.
    folder = tmp_path / "started"
    folder.mkdir()
    argv = [*script(tmp_path, "barrier.py", BARRIER), str(folder), "4"]
    cfg = config_file(
        tmp_path,
        loop={"reducer": "any_pass", "k": 4, "max_concurrency": 4},
        judge={"verifier_command": argv, "verifier_timeout_s": 60},
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 0, err
    assert {v.score for v in verdicts(result["events"]).values()} == {4.0}


COUNT_RUNNING = """\
import os, sys, time
folder = sys.argv[1]
mine = os.path.join(folder, str(os.getpid()))
open(mine, "w").close()
time.sleep(0.05)
running = len(os.listdir(folder))
os.remove(mine)
print(running)
"""


def test_verifier_commands_run_at_most_max_concurrency_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "running"
    folder.mkdir()
    argv = [*script(tmp_path, "count.py", COUNT_RUNNING), str(folder)]
    cfg = config_file(
        tmp_path, loop={"reducer": "any_pass", "k": 6, "max_concurrency": 2}, judge={"verifier_command": argv}
    )
    code, result, err = run_cli(capsys, cfg, tmp_path / "runs")
    assert code == 0, err
    seen = [v.score for v in verdicts(result["events"]).values()]
    assert len(seen) == 6
    assert all(score is not None and 1 <= score <= 2 for score in seen)


# -- the LLM judge's keys -------------------------------------------------------------------------


def judge_says(outputs: dict[int, str]) -> Reply:
    def reply(purpose: str, prompt: str, lane: int) -> str:
        return outputs[lane] if purpose == "judge" else "The most consistent is Response 0"

    return reply


@pytest.mark.anyio
async def test_the_judges_stop_and_sampling_reach_its_requests(tmp_path: Path) -> None:
    backend = Scripted(
        [said(a) for a in ("391", "381", "391", "401")], reply=judge_says(dict.fromkeys(range(4), "Score: 5"))
    )
    cfg = config(
        loop={"reducer": "judge_argmax"},
        judge={
            "template": "Q: {question}\nC: {candidate}\n",
            "stop": ["\n\n", "###"],
            "temperature": 0.0,
            "max_tokens": 24,
        },
        sampling={"stop": ["STOP"], "temperature": 0.9, "max_tokens": 64},
    )
    async with lanefold.Session(cfg, backend=backend, runs_dir=tmp_path) as session:
        await session.run(QUESTION, run_id=RUN)
    judged = backend.of("judge")
    assert len({lane.lane for r in judged for lane in r.lanes}) == 4
    assert all(r.params.stop == ("\n\n", "###") for r in judged)
    assert all(r.params.temperature == 0.0 for r in judged)
    assert all(lane.max_tokens <= 24 for r in judged for lane in r.lanes)
    sampled = backend.of("sample")
    assert sampled and all(r.params.stop == ("STOP",) for r in sampled)


@pytest.mark.anyio
async def test_the_usc_call_uses_the_judges_sampling(tmp_path: Path) -> None:
    backend = Scripted([said(a) for a in ("391", "381", "401", "381")], reply=judge_says({}))
    cfg = config(loop={"reducer": "usc"}, judge={"stop": ["\n\n"], "temperature": 0.0, "max_tokens": 16})
    async with lanefold.Session(cfg, backend=backend, runs_dir=tmp_path) as session:
        result = await session.run(QUESTION, run_id=RUN)
    (usc,) = backend.of("usc")
    assert usc.params.stop == ("\n\n",) and usc.params.temperature == 0.0
    assert (result.reducer, result.answer, result.winner_lane) == ("usc", "391", 0)
    waves = [e.data for e in events(result.events or "") if e.type == "wave.started"]
    assert [(w.purpose, w.bill) for w in waves] == [("sample", "sample"), ("usc", "verifier")]
    assert result.usage.verifier_tokens == 10 + 5


@pytest.mark.anyio
@pytest.mark.parametrize("template_end", ["", "\nScore:"])
async def test_score_regex_and_the_built_in_reading_from_config(tmp_path: Path, template_end: str) -> None:
    outputs = {0: " 10/10", 1: "8/10", 2: "Rating: 7/10", 3: "Score: 1/10\nVERDICT=9"}
    texts = [said(a) for a in ("391", "381", "401", "293")]
    template = "Q: {question}\nC: {candidate}" + template_end
    backend = Scripted(texts, reply=judge_says(outputs))
    async with lanefold.Session(
        config(loop={"reducer": "judge_argmax"}, judge={"template": template}),
        backend=backend,
        runs_dir=tmp_path,
    ) as session:
        plain = await session.run(QUESTION, run_id="plain")
    assert plain.scores == {0: 10.0, 1: 8.0, 2: 7.0, 3: 1.0}
    assert (plain.answer, plain.winner_lane, plain.margin) == ("391", 0, 2.0)
    assert plain.agreement == pytest.approx(1 / 4)
    backend = Scripted(texts, reply=judge_says(outputs))
    async with lanefold.Session(
        config(
            loop={"reducer": "judge_argmax"}, judge={"template": template, "score_regex": r"VERDICT=(\d+)"}
        ),
        backend=backend,
        runs_dir=tmp_path,
    ) as session:
        regex = await session.run(QUESTION, run_id="regex")
    assert regex.scores == {0: None, 1: None, 2: None, 3: 9.0}
    assert (regex.answer, regex.winner_lane) == ("293", 3)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("tie_break", "answer", "lane"), [("lexicographic", "381", 1), ("first_lane", "401", 0)]
)
async def test_tie_break_from_config_works_under_the_judge(
    tmp_path: Path, tie_break: str, answer: str, lane: int
) -> None:
    outputs = {0: "Score: 9/10", 1: "Score: 9/10", 2: "Score: 9/10", 3: "Score: 3/10"}
    backend = Scripted([said(a) for a in ("401", "381", "391", "293")], reply=judge_says(outputs))
    cfg = config(
        loop={"reducer": "judge_argmax", "tie_break": tie_break}, judge={"template": "{question} {candidate}"}
    )
    async with lanefold.Session(cfg, backend=backend, runs_dir=tmp_path) as session:
        result = await session.run(QUESTION, run_id=RUN)
    assert (result.answer, result.winner_lane, result.tie_break) == (answer, lane, tie_break)
    assert result.margin == pytest.approx(0.0)


@pytest.mark.anyio
@pytest.mark.parametrize("weighting", [None, "mean_logprob"], ids=["default", "mean_logprob"])
async def test_weighted_vote_asks_the_backend_for_logprobs(tmp_path: Path, weighting: str | None) -> None:
    # Three unsure lanes say 381, one sure lane says 391: weighted by mean token probability
    # (weighted_vote's default weighting), 391 wins; unweighted, 381 would.
    backend = Scripted(
        [said(a) for a in ("381", "381", "391", "381")], logprobs=[[-4.0], [-4.0], [-0.01], [-4.0]]
    )
    loop: dict[str, Any] = {"reducer": "weighted_vote"}
    if weighting is not None:
        loop["weighting"] = weighting
    cfg = config(loop=loop)
    async with lanefold.Session(cfg, backend=backend, runs_dir=tmp_path) as session:
        result = await session.run(QUESTION, run_id=RUN)
    assert all(r.params.logprobs for r in backend.of("sample"))
    assert (result.answer, result.winner_lane) == ("391", 2)
    assert result.agreement is not None and result.agreement > 0.5


# -- verifiers are a plug-in kind -------------------------------------------------------------


def test_a_registered_verifier_is_named_in_config(tmp_path: Path) -> None:
    from lanefold.primitives import VERIFIERS, register_verifier

    @register_verifier("test_only_391")
    def only_391(question: str, text: str, answer: str | None) -> bool:
        return answer == "391"

    assert "test_only_391" in VERIFIERS.names()
    cfg = config(loop={"reducer": "any_pass"}, judge={"verifier": "test_only_391"})
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id=RUN)
    assert result.answer == "391"
    judged = [e for e in JsonlEventLog(tmp_path / RUN / "events.jsonl").read() if e.type == "judge.completed"]
    assert judged and all(e.data.judge == "test_only_391" for e in judged)


def test_an_unknown_verifier_name_lists_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError,
        match=r"judge.verifier: 'nope_not_here' must look like "
        r"'module:function' \(or name a registered verifier",
    ):
        lanefold.run_sync(
            config(loop={"reducer": "any_pass"}, judge={"verifier": "nope_not_here"}),
            QUESTION,
            runs_dir=tmp_path,
        )
