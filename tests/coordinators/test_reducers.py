"""The reducers as plug-ins, each run through a real RunContext over a MemoryEventLog.

majority_vote, weighted_vote (mean token logprob or verifier score), judge_argmax (an LLM
judge wave or a verifier), usc (one more governed call picks the most consistent candidate)
and any_pass (the first lane a verifier accepts). The backend is scripted: each lane of a
sample wave says what the test tells it, each judge or usc lane answers what the test's
`reply` says, and every request is kept, so a test can see what reached the backend.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.coordinators import (
    AnyPass,
    JudgeArgmax,
    MajorityVote,
    UniversalSelfConsistency,
    WeightedVote,
    as_verifier,
)
from lanefold.primitives import (
    CallableVerifier,
    ConfigError,
    ExtractSpec,
    JudgeSettings,
    Lane,
    Ledger,
    Limits,
    MemoryEventLog,
    Pricing,
    ReduceOptions,
    Reduction,
    RunState,
    Sample,
    SampleRequest,
    SamplingParams,
    Usage,
    Verifier,
    fold,
    hash_config,
    resolve_reducer,
)
from lanefold.primitives.events import RunStarted, RunStartedData
from lanefold.primitives.internal import Dispatcher, Recorder, RunContext, reducer_names

QUESTION = "What is 17 * 23?"
EXTRACT = ExtractSpec(regex=r"Answer:\s*(\S+)")
JUDGE_TEMPLATE = "Question: {question}\nCandidate: {candidate}\nGrade it."


def said(answer: str) -> str:
    return f"Working it through gives {answer}.\nAnswer: {answer}"


Reply = Callable[[str, str, int], str]  # (purpose, prompt, lane) -> the lane's text


@dataclass
class Scripted:
    """A backend that says what it is told: lane i of a sample wave says `texts[i]` (with
    `logprobs[i]`), a lane of any other wave (judge, usc) says `reply(purpose, prompt, lane)`.
    Every request is kept."""

    texts: Sequence[str] = ()
    logprobs: Sequence[Sequence[float] | None] = ()
    reply: Reply = lambda purpose, prompt, lane: ""
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
                given_lp = self.logprobs[lane.lane] if lane.lane < len(self.logprobs) else None
                logprobs = tuple(given_lp) if given_lp is not None else None
            else:
                text, logprobs = self.reply(request.purpose, request.prompt, lane.lane), None
            yield Sample(lane.lane, text, "stop", Usage(10, 0, 5), logprobs=logprobs)

    async def aclose(self) -> None:
        pass

    def purposes(self) -> list[str]:
        return [request.purpose for request in self.requests]


@dataclass
class Run:
    """One run's context and what it wrote."""

    ctx: RunContext
    log: MemoryEventLog
    ledger: Ledger

    def events(self, kind: str | None = None) -> list[Any]:  # Any: the test reads `data`
        return [e for e in self.log.read() if kind is None or e.type == kind]

    def waves(self) -> dict[int, Any]:
        return {e.wave: e.data for e in self.events("wave.started")}

    async def sample(self, k: int) -> list[Lane]:
        return await self.ctx.wave([self.ctx.prompt()] * k)

    async def reduce(self, lanes: Sequence[Lane], reducer: str, **options: Any) -> Reduction:
        return await self.ctx.reduce(lanes, reducer, options=ReduceOptions(**options))


def start(
    backend: Any,
    *,
    judge: JudgeSettings | None = None,
    verifier: Verifier | None = None,
    judge_backend: Any = None,
    seed: int = 5,
) -> Run:
    state = RunState(pricing=Pricing(input_per_mtok=1, output_per_mtok=2))
    log = MemoryEventLog()
    recorder = Recorder(log, "t", state)
    recorder.emit(
        RunStarted,
        RunStartedData(
            config={},
            config_hash=hash_config({}),
            question=QUESTION,
            coordinator="parallel_sample",
            backend=backend.name,
            library_version="test",
        ),
    )
    ledger = Ledger(Limits(), state.pricing)
    dispatcher = Dispatcher(backend, recorder, ledger, run_seed=seed, max_concurrency=8)
    judge_dispatcher = (
        Dispatcher(judge_backend, recorder, ledger, run_seed=seed, max_concurrency=8)
        if judge_backend is not None
        else None
    )
    ctx = RunContext(
        loop_name="parallel_sample",
        question=QUESTION,
        seed=seed,
        recorder=recorder,
        dispatcher=dispatcher,
        judge_dispatcher=judge_dispatcher,
        sampling=SamplingParams(max_tokens=16),
        extract=EXTRACT,
        template="Q: {question}",
        judge=judge,
        verifier=verifier,
    )
    return Run(ctx, log, ledger)


def scripted(*answers: str, **kwargs: Any) -> Scripted:
    return Scripted(texts=[said(a) for a in answers], **kwargs)


def by_answer(scores: dict[str, float | bool | None], default: float | None = 0.0) -> CallableVerifier:
    """A verifier scoring a lane by its extracted answer."""

    def check(question: str, text: str, answer: str | None) -> float | bool | None:
        return scores.get(answer or "", default)

    return CallableVerifier(check, name="tests:by_answer")


# -- the registry ---------------------------------------------------------------------------------


def test_the_five_reducers_are_registered_by_name() -> None:
    expected: dict[str, type[Any]] = {
        "majority_vote": MajorityVote,
        "weighted_vote": WeightedVote,
        "judge_argmax": JudgeArgmax,
        "usc": UniversalSelfConsistency,
        "any_pass": AnyPass,
    }
    assert set(expected) <= set(reducer_names())
    for name, cls in expected.items():
        assert resolve_reducer(name) is cls
        assert cls.name == name


def test_an_unknown_reducer_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^--reducer: .*'no_such_reducer'"):
        resolve_reducer("no_such_reducer", key="--reducer")


# -- majority_vote --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_majority_vote_reports_agreement_and_margin() -> None:
    run = start(scripted("391", "381", "391", "401", "391"))
    lanes = await run.sample(5)
    reduction = await run.reduce(lanes, "majority_vote")
    assert (reduction.winner, reduction.winner_lane) == ("391", 0)
    assert reduction.votes == {"391": 3.0, "381": 1.0, "401": 1.0}
    assert reduction.agreement == pytest.approx(3 / 5)
    assert reduction.margin == pytest.approx(2.0)
    (completed,) = run.events("reduce.completed")
    assert completed.data.reducer == "majority_vote"
    assert completed.data.agreement == pytest.approx(3 / 5)
    assert completed.data.margin == pytest.approx(2.0)
    assert completed.data.reduction == 1
    assert run.ledger.spent.verifier_tokens == 0


@pytest.mark.anyio
async def test_majority_vote_without_answers_says_why() -> None:
    run = start(Scripted(texts=["no answer line here"] * 3))
    reduction = await run.reduce(await run.sample(3), "majority_vote")
    assert reduction.winner is None and reduction.winner_lane is None
    assert reduction.agreement is None and reduction.margin is None
    assert reduction.reason is not None and "3 of 3 completed lanes gave no answer" in reduction.reason


@given(st.lists(st.sampled_from(["7", "8", "9", None]), min_size=1, max_size=12), st.randoms())
@settings(max_examples=60, deadline=None)
def test_majority_vote_is_a_fold_over_lanes_in_any_order(answers: list[str | None], rng: Any) -> None:
    # The vote reads no context: a pure fold over the lanes, whatever order they come in.
    lanes = [Lane(1, i, "completed", text=None, answer=a) for i, a in enumerate(answers)]
    shuffled = list(lanes)
    rng.shuffle(shuffled)
    reducer = MajorityVote(ReduceOptions(tie_break="lexicographic"))
    first = anyio.run(reducer.reduce, None, lanes)  # type: ignore[arg-type]
    second = anyio.run(reducer.reduce, None, shuffled)  # type: ignore[arg-type]
    assert (first.winner, first.winner_lane, dict(first.votes)) == (
        second.winner,
        second.winner_lane,
        dict(second.votes),
    )
    given_answers = [a for a in answers if a is not None]
    if not given_answers:
        assert first.winner is None and first.agreement is None and first.margin is None
        return
    counts = {a: given_answers.count(a) for a in given_answers}
    top = max(counts.values())
    assert first.winner == min(a for a, n in counts.items() if n == top)
    assert first.agreement == pytest.approx(top / len(given_answers))
    runner_up = max((n for a, n in counts.items() if a != first.winner), default=0)
    assert first.margin == pytest.approx(top - runner_up)


# -- weighted_vote --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("weighting", ["mean_logprob", "none"])
async def test_weighted_vote_weighs_lanes_by_mean_token_probability(weighting: str) -> None:
    # Two unsure lanes say 381, one sure lane says 391: by probability 391 wins, by count not.
    backend = scripted("381", "391", "381", logprobs=[[-3.0, -3.0], [0.0, 0.0], [-3.0]])
    run = start(backend)
    reduction = await run.reduce(await run.sample(3), "weighted_vote", weighting=weighting)
    unsure = math.exp(-3.0)
    assert (reduction.winner, reduction.winner_lane) == ("391", 1)
    assert reduction.votes == pytest.approx({"381": 2 * unsure, "391": 1.0})
    assert reduction.detail == {"weighting": "mean_logprob"}
    assert reduction.agreement == pytest.approx(1.0 / (1.0 + 2 * unsure))
    assert reduction.margin == pytest.approx(1.0 - 2 * unsure)
    majority = await MajorityVote().reduce(run.ctx, await run.ctx.wave([run.ctx.prompt()] * 3))
    assert majority.winner == "381"  # the same lanes unweighted


@pytest.mark.anyio
async def test_weighted_vote_by_verifier_score_records_each_verdict() -> None:
    verifier = by_answer({"381": 5.0, "391": 1.0, "401": -10.0})
    run = start(scripted("391", "391", "381", "401", "401", "401"), verifier=verifier)
    reduction = await run.reduce(await run.sample(6), "weighted_vote", weighting="verifier")
    assert (reduction.winner, reduction.winner_lane) == ("381", 2)
    # a lane the verifier scores 0 or less does not vote (it abstains)
    assert reduction.votes == {"391": 2.0, "381": 5.0}
    assert reduction.abstentions == 3
    assert reduction.scores == {0: 1.0, 1: 1.0, 2: 5.0, 3: -10.0, 4: -10.0, 5: -10.0}
    assert reduction.detail == {"weighting": "verifier"}
    assert reduction.agreement == pytest.approx(5 / 7)
    assert reduction.margin == pytest.approx(3.0)
    verdicts = {e.data.candidate_lane: e.data for e in run.events("judge.completed")}
    assert sorted(verdicts) == list(range(6))
    assert {lane: v.score for lane, v in verdicts.items()} == {
        0: 1.0,
        1: 1.0,
        2: 5.0,
        3: -10.0,
        4: -10.0,
        5: -10.0,
    }
    assert {lane: v.passed for lane, v in verdicts.items()} == {
        0: True,
        1: True,
        2: True,
        3: False,
        4: False,
        5: False,
    }
    assert all(v.judge == "tests:by_answer" and v.error is None for v in verdicts.values())
    assert [w.purpose for w in run.waves().values()] == ["sample"]  # no LLM judge wave


@pytest.mark.anyio
async def test_weighted_vote_by_verifier_needs_a_verifier() -> None:
    run = start(scripted("391", "391"))
    lanes = await run.sample(2)
    with pytest.raises(ConfigError, match="verifier"):
        await run.reduce(lanes, "weighted_vote", weighting="verifier")


# -- judge_argmax ---------------------------------------------------------------------------------


def judge_replies(outputs: dict[int, str]) -> Reply:
    """A judge that gives candidate lane i the output `outputs[i]`."""

    def reply(purpose: str, prompt: str, lane: int) -> str:
        assert purpose == "judge"
        return outputs[lane]

    return reply


@pytest.mark.anyio
@pytest.mark.parametrize(
    "template", [JUDGE_TEMPLATE, JUDGE_TEMPLATE + "\nScore:"], ids=["no-score-label", "ends-in-score"]
)
async def test_the_judges_output_is_read_whether_or_not_the_template_ends_in_score(template: str) -> None:
    outputs = {0: " 10/10", 1: "8/10", 2: "Rating: 7/10", 3: "It looks fine to me."}
    backend = scripted("391", "381", "401", "293", reply=judge_replies(outputs))
    run = start(backend, judge=JudgeSettings(template=template))
    reduction = await run.reduce(await run.sample(4), "judge_argmax")
    assert reduction.scores == {0: 10.0, 1: 8.0, 2: 7.0, 3: None}
    assert (reduction.winner, reduction.winner_lane) == ("391", 0)
    assert reduction.abstentions == 1
    assert reduction.margin == pytest.approx(2.0)
    assert reduction.agreement == pytest.approx(1 / 4)
    verdicts = {e.data.candidate_lane: e.data for e in run.events("judge.completed")}
    assert {lane: v.score for lane, v in verdicts.items()} == reduction.scores
    assert all(v.judge == "llm" for v in verdicts.values())
    assert verdicts[3].detail == "no score in output"


@pytest.mark.anyio
async def test_the_judge_wave_is_governed_and_billed_on_the_verifier_line() -> None:
    outputs = {0: "Score: 9/10", 1: "Score: 3/10"}
    backend = scripted("391", "381", reply=judge_replies(outputs))
    run = start(backend, judge=JudgeSettings(template=JUDGE_TEMPLATE))
    await run.reduce(await run.sample(2), "judge_argmax")
    waves = run.waves()
    assert [(w.purpose, w.bill) for _, w in sorted(waves.items())] == [
        ("sample", "sample"),
        ("judge", "verifier"),
    ]
    judged = [r for r in backend.requests if r.purpose == "judge"]
    assert {r.prompt for r in judged} == {
        f"Question: {QUESTION}\nCandidate: {said(a)}\nGrade it." for a in ("391", "381")
    }
    spent = run.ledger.spent
    assert spent.decode_tokens == 2 * 5  # the sampled lanes only
    assert spent.verifier_tokens == 2 * (10 + 5)  # the judge's prompt and output


@pytest.mark.anyio
async def test_score_regex_replaces_the_built_in_score_reading() -> None:
    # The judge quotes a rubric line holding `Score: 2/10`; only VERDICT= is its verdict.
    outputs = {
        0: "Rubric: Score: 2/10 means poor.\nVERDICT=4",
        1: "Score: 2/10\nVERDICT=9",
        2: "Score: 10/10 and no verdict",
    }
    backend = scripted("391", "381", "401", reply=judge_replies(outputs))
    plain = start(backend, judge=JudgeSettings(template=JUDGE_TEMPLATE))
    assert (await plain.reduce(await plain.sample(3), "judge_argmax")).scores == {0: 2.0, 1: 2.0, 2: 10.0}
    run = start(backend, judge=JudgeSettings(template=JUDGE_TEMPLATE, score_regex=r"VERDICT=(\d+)"))
    reduction = await run.reduce(await run.sample(3), "judge_argmax")
    assert reduction.scores == {0: 4.0, 1: 9.0, 2: None}
    assert (reduction.winner, reduction.winner_lane) == ("381", 1)


@pytest.mark.anyio
async def test_the_judges_stop_and_sampling_reach_its_requests() -> None:
    backend = scripted("391", "381", reply=judge_replies({0: "Score: 6", 1: "Score: 5"}))
    params = SamplingParams(temperature=0.0, max_tokens=12, stop=("\n\n", "END"))
    run = start(backend, judge=JudgeSettings(template=JUDGE_TEMPLATE, params=params))
    await run.reduce(await run.sample(2), "judge_argmax")
    judged = [r for r in backend.requests if r.purpose == "judge"]
    assert judged and all(r.params.stop == ("\n\n", "END") for r in judged)
    assert all(r.params.temperature == 0.0 for r in judged)
    assert all(lane.max_tokens <= 12 for r in judged for lane in r.lanes)
    sampled = [r for r in backend.requests if r.purpose == "sample"]
    assert all(r.params.stop == () for r in sampled)  # the lanes keep their own sampling


@pytest.mark.anyio
@pytest.mark.parametrize(("tie_break", "winner", "lane"), [("lexicographic", "a", 1), ("first_lane", "c", 0)])
async def test_judge_ties_break_by_the_configured_rule(tie_break: str, winner: str, lane: int) -> None:
    outputs = dict.fromkeys(range(5), "Score: 9/10")
    outputs[4] = "Score: 2/10"
    backend = scripted("c", "a", "b", "a", "0", reply=judge_replies(outputs))
    run = start(backend, judge=JudgeSettings(template=JUDGE_TEMPLATE))
    reduction = await run.reduce(await run.sample(5), "judge_argmax", tie_break=tie_break)
    assert (reduction.winner, reduction.winner_lane) == (winner, lane)
    assert reduction.tie_break == tie_break
    assert reduction.tied == (0, 1, 2, 3)
    assert reduction.margin == pytest.approx(0.0)  # tied at the top: no lead


@pytest.mark.anyio
async def test_judge_argmax_with_a_verifier_runs_no_judge_wave() -> None:
    backend = scripted("391", "381", "391", reply=lambda *_: pytest.fail("no judge call"))
    run = start(
        backend, judge=JudgeSettings(template=JUDGE_TEMPLATE), verifier=by_answer({"391": 0.4, "381": 0.9})
    )
    reduction = await run.reduce(await run.sample(3), "judge_argmax")
    assert (reduction.winner, reduction.winner_lane) == ("381", 1)
    assert reduction.scores == {0: 0.4, 1: 0.9, 2: 0.4}
    assert reduction.margin == pytest.approx(0.5)
    assert reduction.agreement == pytest.approx(1 / 3)
    assert backend.purposes() == ["sample"]
    assert [e.data.judge for e in run.events("judge.completed")] == ["tests:by_answer"] * 3


@pytest.mark.anyio
async def test_judge_argmax_over_the_simulated_backend_scores_every_candidate() -> None:
    run = start(
        SimulatedBackend(SimulatedConfig(accuracy=0.5, latency_ms=(0.0, 0.0))),
        judge=JudgeSettings(template="Q: {question}\n{candidate}\n"),
    )
    lanes = await run.sample(6)
    reduction = await run.reduce(lanes, "judge_argmax")
    assert set(reduction.scores) == {lane.lane for lane in lanes}
    assert all(score is not None for score in reduction.scores.values())
    best = max(s for s in reduction.scores.values() if s is not None)
    assert reduction.scores[reduction.winner_lane] == best  # type: ignore[index]
    assert reduction.winner == lanes[reduction.winner_lane].answer  # type: ignore[index]


# -- usc ------------------------------------------------------------------------------------------


def usc_reply(text: str, seen: list[str] | None = None) -> Reply:
    def reply(purpose: str, prompt: str, lane: int) -> str:
        assert purpose == "usc"
        if seen is not None:
            seen.append(prompt)
        return text

    return reply


@pytest.mark.anyio
async def test_usc_asks_the_model_once_and_takes_the_response_it_names() -> None:
    prompts: list[str] = []
    backend = scripted(
        "391", "381", "401", "381", reply=usc_reply("The most consistent response is Response 2.", prompts)
    )
    run = start(backend)
    reduction = await run.reduce(await run.sample(4), "usc")
    assert (reduction.winner, reduction.winner_lane) == ("401", 2)
    assert reduction.detail == {"selected": 2, "selected_lane": 2}
    assert reduction.agreement == pytest.approx(1 / 4)
    (prompt,) = prompts  # one governed call, one lane
    assert QUESTION in prompt
    for i, answer in enumerate(["391", "381", "401", "381"]):
        assert f"Response {i}:\n{said(answer)}\n" in prompt
    waves = run.waves()
    assert [(w.purpose, w.bill, w.k) for _, w in sorted(waves.items())] == [
        ("sample", "sample", 4),
        ("usc", "verifier", 1),
    ]
    spent = run.ledger.spent
    assert spent.decode_tokens == 4 * 5
    assert spent.verifier_tokens == 10 + 5
    (completed,) = run.events("reduce.completed")
    assert completed.data.reducer == "usc"
    assert completed.data.winner_lane == 2


@pytest.mark.anyio
async def test_usc_reads_its_own_template() -> None:
    prompts: list[str] = []
    backend = scripted("391", "381", reply=usc_reply("Response 1", prompts))
    run = start(backend, judge=JudgeSettings(usc_template="Q={question}\n{candidates}\nPick."))
    reduction = await run.reduce(await run.sample(2), "usc")
    assert reduction.winner_lane == 1
    assert prompts[0].startswith(f"Q={QUESTION}\nResponse 0:\n")
    assert prompts[0].endswith("\nPick.")


@pytest.mark.anyio
@pytest.mark.parametrize("output", ["I cannot decide.", "The most consistent is Response 7"])
async def test_usc_falls_back_to_the_vote_and_says_so(output: str) -> None:
    backend = scripted("381", "391", "391", reply=usc_reply(output))
    run = start(backend)
    reduction = await run.reduce(await run.sample(3), "usc")
    assert (reduction.winner, reduction.winner_lane) == ("391", 1)
    assert reduction.detail["fallback"] == "majority_vote"
    assert reduction.agreement == pytest.approx(2 / 3)
    assert reduction.margin == pytest.approx(1.0)
    assert "usc" in backend.purposes()


@pytest.mark.anyio
async def test_usc_with_one_candidate_calls_no_model() -> None:
    backend = Scripted(texts=[said("391"), "no answer"], reply=lambda *_: pytest.fail("called"))
    run = start(backend)
    lanes = await run.sample(2)
    only = [lane for lane in lanes if lane.lane == 0]
    reduction = await run.reduce(only, "usc")
    assert (reduction.winner, reduction.winner_lane) == ("391", 0)
    assert backend.purposes() == ["sample"]


@pytest.mark.anyio
async def test_usc_runs_on_the_judge_backend_when_there_is_one() -> None:
    judge = Scripted(reply=usc_reply("Response 0"))
    backend = scripted("391", "381", reply=lambda *_: pytest.fail("usc went to the sampler"))
    run = start(backend, judge_backend=judge)
    reduction = await run.reduce(await run.sample(2), "usc")
    assert reduction.winner_lane == 0
    assert judge.purposes() == ["usc"]
    assert backend.purposes() == ["sample"]


# -- any_pass -------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_any_pass_takes_the_lowest_lane_the_verifier_accepts() -> None:
    verifier = by_answer({"391": True}, default=False)
    run = start(scripted("381", "401", "391", "381", "391"), verifier=verifier)
    reduction = await run.reduce(await run.sample(5), "any_pass")
    assert (reduction.winner, reduction.winner_lane) == ("391", 2)
    assert reduction.agreement == pytest.approx(2 / 5)
    assert reduction.detail == {"passed": 2, "judged": 5}
    assert reduction.scores == {0: 0.0, 1: 0.0, 2: 1.0, 3: 0.0, 4: 1.0}
    passed = {e.data.candidate_lane: e.data.passed for e in run.events("judge.completed")}
    assert passed == {0: False, 1: False, 2: True, 3: False, 4: True}


@pytest.mark.anyio
async def test_any_pass_with_no_passing_lane_has_no_answer() -> None:
    run = start(scripted("381", "401"), verifier=by_answer({}, default=False))
    reduction = await run.reduce(await run.sample(2), "any_pass")
    assert reduction.winner is None and reduction.winner_lane is None
    assert reduction.reason is not None and "no lane passed the verifier" in reduction.reason
    (completed,) = run.events("reduce.completed")
    assert completed.data.winner is None


@pytest.mark.anyio
async def test_any_pass_needs_a_verifier() -> None:
    run = start(scripted("391"))
    lanes = await run.sample(1)
    with pytest.raises(ConfigError, match="any_pass needs a verifier"):
        await run.reduce(lanes, "any_pass")


# -- verifier failures are verdicts ---------------------------------------------------------------


@pytest.mark.anyio
async def test_every_failure_of_a_verifier_is_a_recorded_verdict() -> None:
    release = threading.Event()

    def check(question: str, text: str, answer: str | None) -> object:
        if answer == "boom":
            raise ValueError("the checker broke")
        if answer == "hang":
            release.wait(60)  # past the timeout: the thread is abandoned, released below
            return 1.0
        if answer == "word":
            return "yes"
        return answer == "391"

    verifier = CallableVerifier(check, name="tests:check", timeout_s=0.2)  # type: ignore[arg-type]
    run = start(scripted("boom", "391", "hang", "word", "381"), verifier=verifier)
    try:
        reduction = await run.reduce(await run.sample(5), "any_pass")
    finally:
        release.set()
    assert (reduction.winner, reduction.winner_lane) == ("391", 1)
    verdicts = {e.data.candidate_lane: e.data for e in run.events("judge.completed")}
    assert sorted(verdicts) == [0, 1, 2, 3, 4]
    assert {lane: (v.error, v.passed) for lane, v in verdicts.items()} == {
        0: ("raised", False),
        1: (None, True),
        2: ("timeout", False),
        3: ("bad_output", False),
        4: (None, False),
    }
    assert "ValueError" in verdicts[0].detail
    assert verdicts[0].score is None and verdicts[2].score is None


@pytest.mark.anyio
async def test_a_sync_verifier_runs_in_a_worker_thread() -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def check(question: str, text: str, answer: str | None) -> bool:
        threads.append(threading.get_ident())
        return True

    run = start(scripted("391", "381"), verifier=as_verifier(check))
    await run.reduce(await run.sample(2), "any_pass")
    assert len(threads) == 2
    assert loop_thread not in threads


@pytest.mark.anyio
async def test_an_async_verifier_is_awaited() -> None:
    async def check(question: str, text: str, answer: str | None) -> float:
        await anyio.lowlevel.checkpoint()
        assert question == QUESTION
        return 2.0 if answer == "381" else 0.5

    run = start(scripted("391", "381"), verifier=as_verifier(check))
    reduction = await run.reduce(await run.sample(2), "judge_argmax")
    assert reduction.scores == {0: 0.5, 1: 2.0}
    assert reduction.winner == "381"


# -- the log ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_reduced_runs_log_folds_to_its_reduction() -> None:
    backend = scripted("391", "381", reply=judge_replies({0: "Score: 3", 1: "Score: 8"}))
    run = start(backend, judge=JudgeSettings(template=JUDGE_TEMPLATE))
    reduction = await run.reduce(await run.sample(2), "judge_argmax")
    state = fold(run.log.read(), run_id="t")
    assert state.reductions[1].winner_lane == reduction.winner_lane == 1
    assert {key[2]: v.score for key, v in state.verdicts.items()} == {0: 3.0, 1: 8.0}
    with pytest.raises(Exception, match="reduces once"):
        await run.reduce(await run.sample(2), "majority_vote")
