"""The simulated backend's modes for the loop library, checked against their closed forms.

Per-question difficulty (Beta(a, b)), per-question golds, the refine mode's copying (Gu et al.'s
tunnel vision), the debate mode's keep-or-adopt update, and scripted outputs. The statistics run
over many seeded questions and lanes: fixed seeds, so they cannot flake, and tolerances of
several standard errors, so they stay true to the closed form rather than to one draw.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import anyio
import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams

TEMPLATE = "Question: {question}\nThink briefly, then end with 'Answer: <answer>'.\n"
PARAMS = SamplingParams(max_tokens=256)


def request(prompt: str, seeds: Sequence[int], purpose: str = "sample", *, attempt: int = 1) -> SampleRequest:
    lanes = tuple(LaneRequest(i, seed=s, max_tokens=256, attempt=attempt) for i, s in enumerate(seeds))
    return SampleRequest(prompt, PARAMS, lanes, purpose=purpose)


async def _texts(backend: SimulatedBackend, requests: Iterable[SampleRequest]) -> list[list[str]]:
    out = []
    for req in requests:
        texts = [""] * len(req.lanes)
        async for outcome in backend.sample(req):
            assert isinstance(outcome, Sample)
            texts[outcome.lane] = outcome.text
        out.append(texts)
    return out


def texts(backend: SimulatedBackend, requests: Iterable[SampleRequest]) -> list[list[str]]:
    """Every request's lane texts, in lane order, in one event loop."""
    return anyio.run(_texts, backend, list(requests))


def answer(text: str) -> str:
    return text.rsplit("Answer: ", 1)[1]


# -- old configs say what they said --------------------------------------------------------------

_OPENERS = (
    "Let me work through this step by step.",
    "First, restate the problem in simpler terms.",
    "Breaking the question into parts helps here.",
    "A quick estimate first, then the exact value.",
)


def _before_sample(cfg: SimulatedConfig, seed: int) -> str:
    """The sampler as it was before the modes existed (its formula, copied)."""
    rng = random.Random(seed)
    correct = rng.random() < cfg.accuracy
    ans = cfg.answer if correct else rng.choice(cfg.distractors)
    return f"{rng.choice(_OPENERS)} Working it through gives {ans}.\nAnswer: {ans}"


def _before_judge(cfg: SimulatedConfig, prompt: str, seed: int) -> str:
    import re

    rng = random.Random(seed)
    found = re.findall(r"Answer:\s*(.+)", prompt)
    candidate = found[-1].strip().rstrip(".").lower() if found else ""
    correct = candidate == cfg.answer.strip().lower()
    if rng.random() >= cfg.judge_accuracy:
        correct = not correct
    score = rng.randint(7, 10) if correct else rng.randint(1, 4)
    return f"The candidate's final answer is {'right' if correct else 'wrong'}.\nScore: {score}/10"


@pytest.mark.parametrize(
    "cfg", [SimulatedConfig(), SimulatedConfig(answer="42", accuracy=0.3, distractors=["41", "43"])]
)
def test_a_config_without_the_new_keys_says_what_it_said(cfg: SimulatedConfig) -> None:
    backend, seeds = SimulatedBackend(cfg), range(300)
    prompt = TEMPLATE.format(question="What is 17 * 23?")
    judged = f"{prompt}\nCandidate answer:\nAnswer: {cfg.answer}\n"
    (sampled, usc, judge) = texts(
        backend, [request(prompt, seeds), request(prompt, seeds, "usc"), request(judged, seeds, "judge")]
    )
    assert sampled == usc == [_before_sample(cfg, s) for s in seeds]
    assert judge == [_before_judge(cfg, judged, s) for s in seeds]


def test_refine_and_debate_without_history_sample_afresh() -> None:
    backend, seeds = SimulatedBackend(SimulatedConfig(copy_rate=1.0, debate_keep=1.0)), range(50)
    prompt = TEMPLATE.format(question="q")
    fresh, refine, debate = texts(
        backend, [request(prompt, seeds, p) for p in ("sample", "refine", "debate")]
    )
    assert fresh == refine == debate


def test_a_lane_dispatched_again_says_the_same_thing() -> None:
    cfg = SimulatedConfig(difficulty=(2, 2), copy_rate=0.5, seed=9)
    backend = SimulatedBackend(cfg)
    prompt = TEMPLATE.format(question="q") + "Answer: 401\nAnswer: 12\n"
    first, again = texts(
        backend, [request(prompt, range(40), "refine"), request(prompt, range(40), "refine", attempt=3)]
    )
    assert first == again
    assert texts(SimulatedBackend(cfg), [request(prompt, range(40), "refine")])[0] == first


# -- difficulty and golds per question -----------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [(2.0, 3.0), (0.5, 0.5), (6.0, 1.5)])
def test_a_difficulty_mixture_has_mean_accuracy_a_over_a_plus_b(a: float, b: float) -> None:
    backend = SimulatedBackend(SimulatedConfig(difficulty=(a, b), seed=1))
    prompts = [TEMPLATE.format(question=f"Question number {q}?") for q in range(4000)]
    results = texts(backend, [request(p, [q]) for q, p in enumerate(prompts)])
    accuracy = sum(answer(t) == "391" for (t,) in results) / len(results)
    drawn = sum(backend.accuracy_of(p) for p in prompts) / len(prompts)
    assert abs(drawn - a / (a + b)) < 0.03
    assert abs(accuracy - a / (a + b)) < 0.035  # one Bernoulli per question: sd < 0.008


def test_a_question_keeps_its_accuracy_across_lanes_and_prompts() -> None:
    backend = SimulatedBackend(SimulatedConfig(difficulty=(2.0, 2.0), seed=4))
    q = "Question: How many primes are below 100?"
    p = backend.accuracy_of(q)
    assert p == backend.accuracy_of(q + "\nanother instruction\nAnswer: 7\n")
    assert p == random.Random(f"4:{q}").betavariate(2.0, 2.0)  # the documented formula
    assert p != SimulatedBackend(SimulatedConfig(difficulty=(2.0, 2.0), seed=5)).accuracy_of(q)
    (lanes,) = texts(backend, [request(q + "\n", range(3000))])
    assert abs(sum(answer(t) == "391" for t in lanes) / 3000 - p) < 0.04
    assert SimulatedBackend(SimulatedConfig(accuracy=0.3)).accuracy_of(q) == 0.3


def test_answers_name_a_question_by_its_first_line() -> None:
    cfg = SimulatedConfig(
        answers={"What is 7 + 8?": "15", "Question: Capital of France?": "Paris"},
        distractors=["14", "15", "16"],
        accuracy=0.5,
    )
    backend = SimulatedBackend(cfg)
    assert backend.answer_of(TEMPLATE.format(question="What is 7 + 8?")) == "15"
    assert backend.answer_of("What is 7 + 8?\nmore") == "15"
    assert backend.answer_of("Question: Capital of France?\n") == "Paris"
    assert backend.answer_of("Question: something else\nWhat is 7 + 8?") == "391"
    prompt = TEMPLATE.format(question="What is 7 + 8?")
    (lanes,) = texts(backend, [request(prompt, range(400))])
    right = sum(answer(t) == "15" for t in lanes) / 400
    assert 0.4 < right < 0.6  # a wrong answer is never the question's own gold
    assert {answer(t) for t in lanes} == {"14", "15", "16"}


def test_the_judge_scores_against_the_questions_gold() -> None:
    backend = SimulatedBackend(SimulatedConfig(answers={"What is 7 + 8?": "15"}, judge_accuracy=1.0))
    base = "Question: What is 7 + 8?\n\nCandidate answer:\n"
    right, wrong = texts(
        backend,
        [
            request(base + "Answer: 15\n", range(20), "judge"),
            request(base + "Answer: 391\n", range(20), "judge"),
        ],
    )
    assert all("right" in t for t in right) and all("wrong" in t for t in wrong)


# -- refine: copying earlier attempts ------------------------------------------------------------


@functools.cache
def _chains(
    p: float,
    rho: float,
    *,
    mode: str = "autoregressive",
    instruction: str = "",
    chains: int = 2000,
    steps: int = 16,
) -> float:
    """Coverage of `chains` sequential chains of `steps` refine attempts at accuracy `p` and
    copy rate `rho`: the share whose attempts include the gold. Each step's prompt shows the
    earlier answers (all, or in "markov" mode the last), as a loop would. Computed once."""
    cfg = SimulatedConfig(accuracy=p, copy_rate=rho, explore_copy_factor=0.5)

    async def run() -> float:
        backend, covered = SimulatedBackend(cfg), 0
        for c in range(chains):
            question, seen = TEMPLATE.format(question=f"Chain question {c}?"), list[str]()
            for step in range(steps):
                shown = seen if mode == "autoregressive" else seen[-1:]
                prompt = (
                    question
                    + "".join(f"Attempt {i + 1}:\nAnswer: {a}\n" for i, a in enumerate(shown))
                    + instruction
                )
                (texts_,) = await _texts(backend, [request(prompt, [c * 1000 + step], "refine")])
                seen.append(answer(texts_[0]))
            covered += "391" in seen
        return covered / chains

    return anyio.run(run)


def coverage_sequential(p: float, rho: float, n: int) -> float:
    return 1 - (1 - p) * (1 - (1 - rho) * p) ** (n - 1)


@pytest.mark.parametrize("mode", ["autoregressive", "markov"])
def test_refine_coverage_follows_the_tunnel_vision_closed_form(mode: str) -> None:
    expected = coverage_sequential(0.1, 0.6, 16)
    assert round(expected, 2) == 0.51
    coverage = _chains(0.1, 0.6, mode=mode)
    assert abs(coverage - expected) < 0.04  # sd 0.011
    parallel = _chains(0.1, 0.0, mode=mode)
    assert abs(parallel - (1 - 0.9**16)) < 0.04  # 0.815: no copying is independent lanes
    assert parallel - coverage > 0.2


def test_a_different_approach_lowers_the_copy_rate_and_narrows_the_gap() -> None:
    plain = _chains(0.1, 0.6)
    explored = _chains(0.1, 0.6, instruction="Try a Different Approach this time.\n")
    assert abs(explored - coverage_sequential(0.1, 0.3, 16)) < 0.04  # 0.70
    assert explored - plain > 0.12
    # The copy rate itself, on a prompt whose one earlier answer no fresh sample gives.
    shown = TEMPLATE.format(question="q") + "Answer: 12\n"
    backend = SimulatedBackend(SimulatedConfig(accuracy=0.1, copy_rate=0.6))
    same, explore = texts(
        backend,
        [
            request(shown, range(4000), "refine"),
            request(shown + "Please take a different approach.\n", range(4000), "refine"),
        ],
    )
    assert abs(sum(answer(t) == "12" for t in same) / 4000 - 0.6) < 0.03
    assert abs(sum(answer(t) == "12" for t in explore) / 4000 - 0.3) < 0.03


def test_refine_reads_only_answer_lines_after_the_first() -> None:
    backend = SimulatedBackend(SimulatedConfig(copy_rate=1.0))
    # The first line is the question; an instruction's `Answer: <answer>` is no attempt.
    nothing = "Answer: 7\nEnd with a line\nAnswer: <answer>\n"
    fresh, refined = texts(backend, [request(nothing, range(30)), request(nothing, range(30), "refine")])
    assert refined == fresh
    (copied,) = texts(
        backend, [request("Q\nAnswer: 5.\nfeedback: wrong\nAnswer:  6 \n", range(200), "refine")]
    )
    assert {answer(t) for t in copied} == {"5", "6"}  # uniformly over the attempts shown
    assert 70 < sum(answer(t) == "5" for t in copied) < 130


# -- debate: keep or adopt -----------------------------------------------------------------------


def _debate_accuracy(cfg: SimulatedConfig, groups: int, agents: int = 3) -> tuple[float, float]:
    """(round-0, round-1) per-agent accuracy over `groups` debates of `agents` agents."""
    backend = SimulatedBackend(cfg)
    questions = [TEMPLATE.format(question=f"Debate {g}?") for g in range(groups)]
    round0 = texts(
        backend, [request(q, [g * 10 + a for a in range(agents)], "debate") for g, q in enumerate(questions)]
    )
    prompts = []
    for g, (q, lanes) in enumerate(zip(questions, round0, strict=True)):
        said = [answer(t) for t in lanes]
        for a in range(agents):
            peers = "".join(f"Agent {b + 1} answered: {said[b]}\n" for b in range(agents) if b != a)
            prompts.append(
                request(f"{q}Your previous answer: {said[a]}\n{peers}", [50_000 + g * 10 + a], "debate")
            )
    round1 = texts(backend, prompts)
    before = sum(answer(t) == "391" for lanes in round0 for t in lanes) / (groups * agents)
    after = sum(answer(t) == "391" for (t,) in round1) / (groups * agents)
    return before, after


def debate_closed_form(p: float, keep: float, bias: float, peers: int) -> float:
    return keep * p + (1 - keep) * (bias * (1 - (1 - p) ** peers) + (1 - bias) * p)


@pytest.mark.parametrize(("keep", "bias"), [(0.5, 0.0), (0.2, 0.0), (0.5, 1.0), (0.5, 0.5), (0.0, 1.0)])
def test_debate_follows_its_closed_form(keep: float, bias: float) -> None:
    cfg = SimulatedConfig(accuracy=0.7, debate_keep=keep, debate_bias=bias)
    before, after = _debate_accuracy(cfg, 3000)
    assert abs(before - 0.7) < 0.03
    assert abs(after - debate_closed_form(0.7, keep, bias, 2)) < 0.03


def test_unbiased_debate_keeps_accuracy_and_biased_debate_raises_it() -> None:
    unbiased = _debate_accuracy(SimulatedConfig(accuracy=0.7), 3000)
    biased = _debate_accuracy(SimulatedConfig(accuracy=0.7, debate_bias=1.0), 3000)
    assert abs(unbiased[1] - unbiased[0]) < 0.03  # a martingale: expected accuracy unchanged
    assert biased[1] - biased[0] > 0.07  # 0.7 -> 0.805


def test_debate_keeps_its_own_answer_when_no_peer_is_shown() -> None:
    backend = SimulatedBackend(SimulatedConfig(debate_keep=0.0, debate_bias=1.0))
    (lanes,) = texts(backend, [request("Q\nYour previous answer: 12\n", range(20), "debate")])
    assert {answer(t) for t in lanes} == {"12"}


# -- scripts -------------------------------------------------------------------------------------


def test_the_first_script_rule_of_the_purpose_whose_regex_matches_answers() -> None:
    cfg = SimulatedConfig(
        script=[
            {"purpose": "verify", "match": r"sub-question: b\b", "output": "status: failed"},
            {"purpose": "verify", "output": "status: complete"},
            {"purpose": "plan", "match": "never", "output": "unused"},
            {"purpose": "judge", "output": "Score: 10/10"},
        ],
        output_tokens=5,
        judge_output_tokens=3,
    )
    backend = SimulatedBackend(cfg)
    b, a, plan, judge = texts(
        backend,
        [
            request("Q\nsub-question: b\n", [1, 2], "verify"),
            request("Q\nsub-question: a\n", [1], "verify"),
            request("Q\nplan it\n", [1], "plan"),
            request("Q\nAnswer: 1\n", [1], "judge"),
        ],
    )
    assert b == ["status: failed"] * 2 and a == ["status: complete"] and judge == ["Score: 10/10"]
    assert plan == texts(SimulatedBackend(SimulatedConfig()), [request("Q\nplan it\n", [1])])[0]


def test_a_script_output_is_cut_by_the_lanes_allotment_like_any_text() -> None:
    backend = SimulatedBackend(
        SimulatedConfig(script=[{"purpose": "plan", "output": "x" * 100}], output_tokens=50)
    )
    req = SampleRequest("Q", PARAMS, (LaneRequest(0, seed=1, max_tokens=10),), purpose="plan")

    async def one() -> Sample:
        async for outcome in backend.sample(req):
            assert isinstance(outcome, Sample)
            return outcome
        raise AssertionError

    sample = anyio.run(one)
    assert sample.finish_reason == "length" and sample.usage.output_tokens == 10


# -- config --------------------------------------------------------------------------------------

GOOD = """
[loop]
coordinator = "parallel_sample"
k = 4
[backend]
kind = "simulated"
seed = 3
difficulty = [2, 3]
answers = { "What is 7 + 8?" = "15" }
copy_rate = 0.6
explore_copy_factor = 0.25
debate_keep = 0.4
debate_bias = 0.1
[[backend.script]]
purpose = "plan"
match = '7 \\+ 8'
output = '{"subquestions": []}'
"""


def test_the_new_keys_load_from_toml_and_a_run_uses_them(tmp_path: Path) -> None:
    path = tmp_path / "modes.toml"
    path.write_text(GOOD)
    config = lanefold.load_config(path)
    backend = config.backend
    assert isinstance(backend, SimulatedConfig)
    assert backend.difficulty == (2.0, 3.0) and backend.script[0].match == r"7 \+ 8"
    result = lanefold.run_sync(config, "What is 7 + 8?", runs_dir=str(tmp_path / "runs"))
    assert result.answer in {"15", "381", "401", "293"}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("difficulty = [0, 1]", "backend.difficulty"),
        ("difficulty = [1.0]", "backend.difficulty"),
        ("difficulty = [1, 2]\naccuracy = 1.0\ndistractors = []", "backend.difficulty"),
        ("seed = 1.5", "backend.seed"),
        ("copy_rate = 1.5", "backend.copy_rate"),
        ("explore_copy_factor = -0.1", "backend.explore_copy_factor"),
        ("debate_keep = 2", "backend.debate_keep"),
        ("debate_bias = -1", "backend.debate_bias"),
        ("answers = { q = 5 }", "backend.answers"),
        ("answers = { q = '381' }\ndistractors = ['381']", "backend.answers"),
        ("[[backend.script]]\npurpose = 'plan'\nmatch = '('\noutput = 'x'", "backend.script.0.match"),
        ("[[backend.script]]\npurpose = 'plan'", "backend.script.0.output"),
        ("[[backend.script]]\npurpose = 'plan'\noutput = 'x'\nfoo = 1", "backend.script.0.foo"),
    ],
)
def test_a_bad_new_key_is_refused_by_name(text: str, where: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(f"[loop]\ncoordinator = 'parallel_sample'\n[backend]\nkind = 'simulated'\n{text}\n")
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.load_config(path)
    assert f": {where}" in str(caught.value)
