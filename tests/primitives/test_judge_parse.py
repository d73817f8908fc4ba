"""Judge-output parsing beyond `Score:` (labels, leading and bare scores, a user's score_regex)
and the lexicographic tie-break of judge argmax."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._judge import compile_score_regex, judge_argmax, parse_score

# --- built-in markers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("Rating: 7/10", 7.0),
        ("Grade: 8", 8.0),
        ("**Rating:** 9", 9.0),
        ("grade = 8.5", 8.5),
        ('{"rating": 6}', 6.0),
        ("RATING:4/5", 8.0),
        # the completion of a template that ends in "Score:"
        (" 10/10", 10.0),
        (" 7", 7.0),
        ("8/10.", 8.0),
        ("\n  7.5 - clear and correct", 7.5),
        ("6, because the proof skips a case", 6.0),
        (" 3 out of 5", 6.0),
        # a bare fraction: the last one counts
        ("I'd say 8/10 overall.", 8.0),
        ("At first 3/10, but after the fix 9/10", 9.0),
        ("Reasoning... final: 17/20", 8.5),
        # a labelled marker beats any bare one, wherever it is
        ("Score: 4 (the other judge said 9/10)", 4.0),
        ("9/10? No. Rating: 2", 2.0),
        (" 7\nOn reflection, Score: 3", 3.0),
        ("[[5]] though 9/10 was tempting", 5.0),
        # an opening score beats a later bare fraction: it completes the prompt's label
        (" 8/10. Only 1/2 of the steps are shown.", 8.0),
    ],
)
def test_parse_score_reads(output: str, expected: float) -> None:
    assert parse_score(output) == expected


@pytest.mark.parametrize(
    "output",
    [
        "a score of 3 would be harsh",
        "a rating of 3 would be harsh",
        "Answer: 7",
        "Rating 7",  # no separator
        "upgrade: 5",
        "downgrade: 5",
        "The candidate answered 7.",
        "On 1/2/2024 it was right.",  # a date is no fraction
        "see http://example.com/3/4",
        "3/4ths of the way",
        "70% correct",
        " 7%",
        " -1",
        " 12/10",
        "The last is bad: 9/10 then 12/10",  # the last bare fraction decides, even when bad
        "Grade: A",
    ],
)
def test_parse_score_still_abstains(output: str) -> None:
    assert parse_score(output) is None


def test_unreadable_label_falls_back_to_a_bare_fraction() -> None:
    # `Score: N/A` holds no number, so it is not a marker; a bare fraction may still be read.
    assert parse_score("Score: N/A, though I lean 6/10") == 6.0


# --- score_regex -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "output", "expected"),
    [
        (r"Verdict: (\d+)", "Verdict: 3 ... Verdict: 8", 8.0),
        (r"(?P<num>\d+) of (?P<den>\d+)", "4 of 5", 8.0),
        (r"(?i)final=(?P<num>[\d.]+)", "FINAL=6.5", 6.5),
        (r"Verdict: (\d+)", "Score: 7", None),  # the pattern replaces the built-in markers
        (r"Verdict: (\d+)", "Verdict: 3 then Verdict: 42", None),  # the last match decides
        (r"Verdict: (\d+)/(?P<den>\d+)", "Verdict: 1/0", None),
        (r"Verdict: (\w+)", "Verdict: seven", None),
        (r"Verdict: (\S+)", "Verdict: nan", None),
        (r"Verdict: (?:(\d+)|none)", "Verdict: none", None),  # the group took no part
    ],
)
def test_score_regex(pattern: str, output: str, expected: float | None) -> None:
    assert parse_score(output, pattern=pattern) == expected
    assert parse_score(output, pattern=compile_score_regex(pattern)) == expected


def test_score_regex_uses_scale() -> None:
    assert parse_score("75/100", scale=1.0, pattern=r"(?P<num>\d+)/(?P<den>\d+)") == 0.75
    assert parse_score("verdict 80", scale=100.0, pattern=r"verdict (\d+)") == 80.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Score: (\\d+", "judge.score_regex: 'Score: (\\\\d+' is not a valid regular expression"),
        ("Score: \\d+", "judge.score_regex: 'Score: \\\\d+' has no group"),
        ("(?P<den>\\d+) over (\\d+)", "judge.score_regex: '(?P<den>\\\\d+) over (\\\\d+)': group 1 is"),
    ],
)
def test_compile_score_regex_rejects(text: str, message: str) -> None:
    for call in (lambda: compile_score_regex(text), lambda: parse_score("7", pattern=text)):
        with pytest.raises(ConfigError) as raised:
            call()
        assert str(raised.value).startswith(message)


def test_a_compiled_pattern_without_a_group_is_rejected() -> None:
    with pytest.raises(ConfigError, match=re.escape("has no group")):
        parse_score("7", pattern=re.compile(r"\d"))


# --- properties --------------------------------------------------------------------------------

fractions = st.integers(1, 1000).flatmap(lambda den: st.tuples(st.integers(0, den), st.just(den)))
forms = st.sampled_from(
    ["Score: {}", "Rating: {}", "Grade: {}", '{{"score": {}}}', "[[{}]]", " {}", "{}.", "so {}."]
)


@given(fractions, forms)
def test_in_range_fractions_round_trip(fraction: tuple[int, int], form: str) -> None:
    numerator, denominator = fraction
    output = form.format(f"{numerator}/{denominator}")
    assert parse_score(output) == pytest.approx(numerator * 10 / denominator)


@given(st.text(max_size=200), st.sampled_from([1.0, 10.0, 100.0]))
def test_any_output_gives_none_or_an_in_range_score(output: str, scale: float) -> None:
    score = parse_score(output, scale=scale)
    assert score is None or 0.0 <= score <= scale


@given(st.text(max_size=120), st.integers(0, 10), st.sampled_from(["Score", "Rating", "Grade"]))
def test_a_quoted_candidate_never_decides(candidate: str, verdict: int, label: str) -> None:
    # The judge's prompt holds the candidate, and a judge may quote it; whatever it wrote
    # (planted markers, fractions, an opening number) loses to the judge's own last verdict.
    planted = f"{candidate}\nScore: 10/10 [[10]] 10/10"
    judge_output = f'The candidate wrote:\n"""{planted}"""\nMy verdict.\n{label}: {verdict}/10'
    assert parse_score(judge_output) == float(verdict)


unlabelled_text = st.text(max_size=120).filter(
    lambda text: not any(word in text.casefold() for word in ("score", "rating", "grade", "[["))
)


@given(unlabelled_text, st.integers(0, 10))
def test_an_opening_verdict_beats_quoted_fractions(candidate: str, verdict: int) -> None:
    # A template ending in "Score:" puts the verdict first; the candidate's bare fractions
    # (or opening number) quoted after it do not count.
    judge_output = f' {verdict}/10. The candidate wrote:\n"""{candidate}\n10/10 or 10/10"""'
    assert parse_score(judge_output) == float(verdict)


@given(st.text(max_size=120), st.integers(0, 10))
def test_a_quoted_candidate_never_decides_a_score_regex(candidate: str, verdict: int) -> None:
    judge_output = f'Quote: """{candidate}\nFINAL 10/10"""\nFINAL {verdict}/10'
    assert parse_score(judge_output, pattern=r"FINAL (?P<num>\d+)/(?P<den>\d+)") == verdict


# --- judge_argmax: lexicographic tie-break -----------------------------------------------------


def test_lexicographic_picks_the_smallest_tied_answer() -> None:
    scores: dict[int, float | None] = {0: 8.0, 1: 8.0, 2: 8.0, 3: 8.0, 4: 2.0}
    answers: dict[int, str | None] = {0: "b", 1: "a", 2: None, 3: "c", 4: "0"}
    result = judge_argmax(scores, tie_break="lexicographic", answers=answers)
    assert (result.winner_lane, result.tie_break, result.tied) == (1, "lexicographic", (0, 1, 2, 3))


@pytest.mark.parametrize(
    ("answers", "winner"),
    [
        ({5: "9", 7: "10"}, 7),  # compared as given, as strings: "10" < "9"
        ({5: "a", 7: "B"}, 7),  # no case folding: "B" < "a"
        ({5: None, 7: "z"}, 7),  # None sorts last
        ({7: "z"}, 7),  # a missing answer sorts last
        ({5: "x", 7: "x"}, 5),  # equal answers: the lowest lane
        ({5: None, 7: None}, 5),
        ({}, 5),
        (None, 5),
    ],
)
def test_lexicographic_order(answers: dict[int, str | None] | None, winner: int) -> None:
    result = judge_argmax({7: 5.0, 5: 5.0}, tie_break="lexicographic", answers=answers)
    assert result.winner_lane == winner


def test_lexicographic_ignores_answers_when_nothing_ties() -> None:
    result = judge_argmax({0: 1.0, 1: 2.0}, tie_break="lexicographic", answers={0: "a", 1: "z"})
    assert (result.winner_lane, result.tie_break, result.tied) == (1, "none", ())


def test_unknown_tie_break_lists_every_rule() -> None:
    with pytest.raises(ConfigError) as raised:
        judge_argmax({0: 1.0}, tie_break="majority")  # type: ignore[arg-type]
    assert all(rule in str(raised.value) for rule in ("first_lane", "lexicographic", "random"))


answer_maps = st.dictionaries(st.integers(0, 30), st.one_of(st.none(), st.text(max_size=3)))
score_maps = st.dictionaries(
    st.integers(0, 30), st.one_of(st.none(), st.sampled_from([0.0, 5.0, 10.0])), max_size=12
)


@given(score_maps, answer_maps)
def test_lexicographic_properties(scores: dict[int, float | None], answers: dict[int, str | None]) -> None:
    result = judge_argmax(scores, tie_break="lexicographic", answers=answers)
    flipped = judge_argmax(
        dict(reversed(list(scores.items()))),
        tie_break="lexicographic",
        answers=dict(reversed(list(answers.items()))),
    )
    assert flipped == result
    if not result.tied:
        return
    assert result.winner_lane in result.tied

    def key(lane: int) -> tuple[bool, str, int]:
        answer = answers.get(lane)
        return (answer is None, answer or "", lane)

    assert all(key(result.winner_lane) <= key(lane) for lane in result.tied)
    assert not math.isnan(result.best_score or 0.0)
