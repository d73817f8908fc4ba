"""Judge-score parse, judge argmax and prompt rendering: examples and properties."""

from __future__ import annotations

import math
import random
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanefold.primitives import (
    ConfigError,
    JudgeResult,
    JudgeTieBreak,
    judge_argmax,
    parse_score,
    render_judge_prompt,
)
from lanefold.primitives.internal import render_prompt as render_sample_prompt

# --- parse_score -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Score: 7/10", 7.0),
        ("Score: 7", 7.0),
        ("score = 8.5", 8.5),
        ("SCORE:9", 9.0),
        ("[[7]]", 7.0),
        ("[[ 6.5 ]]", 6.5),
        ("[[4/5]]", 8.0),
        ('{"score": 7}', 7.0),
        ('{"reason": "clear", "score": 6}', 6.0),
        ('{"score": "5"}', 5.0),
        ("**Score:** 9", 9.0),
        ("Score: 4/5", 8.0),  # rescaled to 10
        ("Score: 85/100", 8.5),
        ("Score: 17/20", 8.5),
        ("Score: 3 out of 10", 3.0),
        ("Score: 0", 0.0),
        ("Score: 10/10", 10.0),
        ("Score: 7.", 7.0),
        ("The answer is right.\nScore: 2/10\nOn reflection it is complete.\nScore: 9/10", 9.0),
        ("[[3]] then finally Score: 8", 8.0),
        ("Score: 8 then finally [[3]]", 3.0),
    ],
)
def test_parse_score(output: str, expected: float) -> None:
    assert parse_score(output) == expected


@pytest.mark.parametrize(
    "output",
    [
        "",
        "The candidate is good.",
        "Answer: 7",  # a candidate's answer line is not a score
        "I would give it a 7.",
        "a score of 3 would be harsh",  # no separator: prose, not a verdict
        "final_score: 8",
        "underscore: 8",
        "Score: 11",  # above the scale
        "Score: 12/10",
        "Score: -1",
        "Score: 3/0",
        "Score: 8\nScore: 42",  # the last marker decides, even when it is bad
        "Score: N/A",
        "[[A]]",
    ],
)
def test_parse_score_abstains(output: str) -> None:
    assert parse_score(output) is None


@pytest.mark.parametrize(
    ("output", "scale", "expected"),
    [
        ("Score: 4/5", 5.0, 4.0),
        ("Score: 7/10", 100.0, 70.0),
        ("Score: 50", 100.0, 50.0),
        ("Score: 50", 10.0, None),
        ("[[1/2]]", 1.0, 0.5),
    ],
)
def test_parse_score_scale(output: str, scale: float, expected: float | None) -> None:
    assert parse_score(output, scale=scale) == expected


@pytest.mark.parametrize("scale", [0.0, -10.0, math.inf, math.nan])
def test_parse_score_rejects_bad_scale(scale: float) -> None:
    with pytest.raises(ConfigError):
        parse_score("Score: 1", scale=scale)


candidate_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"]).filter(lambda c: c not in "[]"),
    max_size=60,
).filter(lambda text: "score" not in text.casefold())


@given(candidate_text, st.integers(0, 10))
def test_candidate_text_never_yields_a_score(text: str, number: int) -> None:
    # What a lane writes (rationale, "Answer: 7") holds no score marker; parse_score must
    # abstain on it rather than mistake the answer for a grade. (A bare "7/10" is a score.)
    candidate = f"Reasoning: {text.replace('/', ' ')}\nAnswer: {number}"
    assert parse_score(candidate) is None


@given(candidate_text, st.integers(0, 10), st.integers(0, 10))
def test_only_the_judges_own_verdict_counts(text: str, planted: int, verdict: int) -> None:
    # A judge that quotes the candidate (even a candidate that plants its own "Score:") still
    # ends with its verdict, which is the one read.
    candidate = f"{text}\nAnswer: 3\nScore: {planted}/10"
    judge_output = f'The candidate wrote:\n"""{candidate}"""\nMy verdict.\nScore: {verdict}/10'
    assert parse_score(judge_output) == float(verdict)


@given(st.integers(0, 100), st.integers(1, 100), st.sampled_from(["Score: {}", "[[{}]]"]))
def test_fraction_rescale_round_trip(numerator: int, denominator: int, form: str) -> None:
    score = parse_score(form.format(f"{numerator}/{denominator}"))
    if numerator > denominator:
        assert score is None
    else:
        assert score == pytest.approx(10.0 * numerator / denominator)


@given(st.decimals(min_value=0, max_value=10, places=2))
def test_in_range_scores_round_trip(value: Decimal) -> None:
    assert parse_score(f'{{"score": {value}}}') == pytest.approx(float(str(value)))


# --- judge_argmax ------------------------------------------------------------------------------


def test_argmax_picks_the_highest() -> None:
    result = judge_argmax({0: 3.0, 1: 9.0, 2: None, 3: 7.5})
    assert result == JudgeResult(winner_lane=1, best_score=9.0, tie_break="none", tied=(), abstentions=1)


def test_argmax_first_lane_tie_break_uses_lane_index() -> None:
    result = judge_argmax({7: 8.0, 2: 8.0, 5: 8.0, 0: 1.0})
    assert result.winner_lane == 2
    assert result.tied == (2, 5, 7)
    assert result.tie_break == "first_lane"


def test_argmax_random_tie_break_is_seeded() -> None:
    scores: dict[int, float | None] = {4: 5.0, 1: 5.0, 9: 5.0, 3: 5.0}
    for seed in range(10):
        result = judge_argmax(scores, tie_break="random", seed=seed)
        assert result.winner_lane == random.Random(seed).choice([1, 3, 4, 9])
        assert result.tie_break == "random"
    winners = {judge_argmax(scores, tie_break="random", seed=s).winner_lane for s in range(40)}
    assert len(winners) > 1


@pytest.mark.parametrize("scores", [{}, {0: None, 1: None}, {0: math.nan}])
def test_argmax_with_no_scores(scores: dict[int, float | None]) -> None:
    result = judge_argmax(scores)
    assert result.winner_lane is None
    assert result.best_score is None
    assert result.abstentions == len(scores)


def test_argmax_zero_is_a_score_not_an_abstention() -> None:
    result = judge_argmax({0: None, 1: 0.0})
    assert (result.winner_lane, result.best_score, result.abstentions) == (1, 0.0, 1)


def test_argmax_rejects_unknown_tie_break() -> None:
    with pytest.raises(ConfigError):
        judge_argmax({0: 1.0}, tie_break="majority")  # type: ignore[arg-type]


score_maps = st.dictionaries(
    st.integers(0, 500),
    st.one_of(st.none(), st.sampled_from([0.0, 2.5, 5.0, 7.0, 10.0])),
    max_size=12,
)


judge_tie_breaks: st.SearchStrategy[JudgeTieBreak] = st.sampled_from(["first_lane", "random"])


@given(score_maps, judge_tie_breaks, st.integers(0, 2**32))
def test_argmax_properties(scores: dict[int, float | None], tie_break: JudgeTieBreak, seed: int) -> None:
    result = judge_argmax(scores, tie_break=tie_break, seed=seed)
    reversed_order = dict(reversed(list(scores.items())))
    assert judge_argmax(reversed_order, tie_break=tie_break, seed=seed) == result
    valid = {lane: s for lane, s in scores.items() if s is not None}
    assert result.abstentions == len(scores) - len(valid)
    if not valid:
        assert result.winner_lane is None
        return
    assert result.winner_lane is not None
    assert result.best_score == max(valid.values()) == valid[result.winner_lane]
    if result.tied:
        assert result.winner_lane in result.tied
        assert result.tie_break == tie_break
        if tie_break == "first_lane":
            assert result.winner_lane == min(result.tied)


# --- rendering ---------------------------------------------------------------------------------


def test_render_judge_prompt_substitutes_both_slots() -> None:
    template = "Question: {question}\nCandidate: {candidate}\nReply with Score: N/10."
    assert render_judge_prompt(template, question="2+2?", candidate="4") == (
        "Question: 2+2?\nCandidate: 4\nReply with Score: N/10."
    )


def test_render_keeps_other_braces_literal() -> None:
    template = 'Q: {question}\nA: {candidate}\nReply as JSON: {"score": <0-10>} {0} {}'
    rendered = render_judge_prompt(template, question="f(x) = {x}", candidate='{"a": 1} {0}')
    assert rendered == ('Q: f(x) = {x}\nA: {"a": 1} {0}\nReply as JSON: {"score": <0-10>} {0} {}')


def test_render_is_one_pass() -> None:
    # A candidate cannot inject the question (or itself) by writing a slot name.
    rendered = render_judge_prompt("{question} | {candidate}", question="{candidate}", candidate="{question}")
    assert rendered == "{candidate} | {question}"


def test_render_prompt_only_knows_question() -> None:
    assert render_sample_prompt("Q: {question} {candidate}", question="{}") == "Q: {} {candidate}"


def test_render_every_occurrence() -> None:
    assert render_sample_prompt("{question}/{question}", question="x") == "x/x"


@given(st.text(max_size=40), st.text(max_size=40))
def test_render_values_pass_through_verbatim(question: str, candidate: str) -> None:
    rendered = render_judge_prompt("<<{question}>><<{candidate}>>", question=question, candidate=candidate)
    assert rendered == f"<<{question}>><<{candidate}>>"
