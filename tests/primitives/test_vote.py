"""The vote fold: examples, tie-breaks, weights, and Hypothesis properties."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lanefold.primitives import Ballot, ConfigError, VoteResult, VoteTieBreak, normalize_answer, vote_fold
from lanefold.primitives.internal import logprob_weight


def ballots(*answers: str | None) -> list[Ballot]:
    return [Ballot(lane, answer) for lane, answer in enumerate(answers)]


def test_majority_wins() -> None:
    result = vote_fold(ballots("7", "8", "7", "7", "8"))
    assert result == VoteResult(
        winner="7",
        winner_lane=0,
        votes={"7": 3.0, "8": 2.0},
        counts={"7": 3, "8": 2},
        tie_break="none",
        tied=(),
        abstentions=0,
    )


def test_answers_are_normalised_before_counting() -> None:
    result = vote_fold(ballots("1,000", "Paris", "1000.", " 1000.0 ", "paris"))
    assert result.winner == "1000"
    assert result.votes == {"1000": 3.0, "paris": 2.0}
    assert result.winner_lane == 0


def test_abstentions_are_ignored_and_counted() -> None:
    result = vote_fold(ballots(None, "5", None, "...", "6", "5"))
    assert result.winner == "5"
    assert result.winner_lane == 1
    assert result.abstentions == 3  # two None, one that normalises to nothing
    assert result.counts == {"5": 2, "6": 1}


@pytest.mark.parametrize("given_ballots", [[], ballots(None, None), ballots("", "?")])
def test_no_votes_means_no_winner(given_ballots: list[Ballot]) -> None:
    result = vote_fold(given_ballots)
    assert result.winner is None
    assert result.winner_lane is None
    assert result.votes == {}
    assert result.tie_break == "none"
    assert result.abstentions == len(given_ballots)


def test_votes_are_ordered_by_first_lane_not_input_order() -> None:
    result = vote_fold([Ballot(3, "c"), Ballot(1, "b"), Ballot(0, "a"), Ballot(2, "c")])
    assert list(result.votes) == ["a", "b", "c"]
    assert list(result.counts) == ["a", "b", "c"]


def test_first_lane_uses_lane_index_not_position() -> None:
    # "b" appears first in the list but "a" holds the lowest lane.
    given_ballots = [Ballot(5, "b"), Ballot(9, "a"), Ballot(2, "a"), Ballot(7, "b")]
    result = vote_fold(given_ballots)
    assert result.winner == "a"
    assert result.winner_lane == 2
    assert result.tie_break == "first_lane"
    assert result.tied == ("a", "b")


def test_lexicographic_tie_break() -> None:
    result = vote_fold(ballots("zeta", "alpha", "mid"), tie_break="lexicographic")
    assert result.winner == "alpha"
    assert result.winner_lane == 1
    assert result.tie_break == "lexicographic"
    assert result.tied == ("zeta", "alpha", "mid")


def test_random_tie_break_is_seeded_choice_among_sorted() -> None:
    tied = ["d", "b", "a", "c"]
    for seed in range(10):
        result = vote_fold(ballots(*tied), tie_break="random", seed=seed)
        assert result.winner == random.Random(seed).choice(sorted(tied))
        assert result.tie_break == "random"
    winners = {vote_fold(ballots(*tied), tie_break="random", seed=s).winner for s in range(40)}
    assert len(winners) > 1  # the seed matters


def test_tie_break_not_used_when_no_tie() -> None:
    result = vote_fold(ballots("b", "a", "a"), tie_break="lexicographic")
    assert result.winner == "a"
    assert result.tie_break == "none"
    assert result.tied == ()


def test_weights_decide() -> None:
    given_ballots = [Ballot(0, "x", 0.2), Ballot(1, "x", 0.2), Ballot(2, "y", 0.9)]
    result = vote_fold(given_ballots)
    assert result.winner == "y"
    assert result.counts == {"x": 2, "y": 1}
    assert result.votes["x"] == pytest.approx(0.4)


def test_rounding_noise_is_a_tie() -> None:
    # 0.1 + 0.2 != 0.3 in floats; the fold must not let that decide.
    given_ballots = [Ballot(0, "y", 0.3), Ballot(1, "x", 0.1), Ballot(2, "x", 0.2)]
    result = vote_fold(given_ballots)
    assert result.tied == ("y", "x")
    assert result.winner == "y"


@pytest.mark.parametrize("weight", [-1.0, math.nan, math.inf])
def test_bad_weight_is_rejected(weight: float) -> None:
    with pytest.raises(ConfigError):
        Ballot(0, "x", weight)


def test_one_ballot_per_lane() -> None:
    with pytest.raises(ConfigError, match="lane 1"):
        vote_fold([Ballot(1, "a"), Ballot(0, "b"), Ballot(1, "b")])


def test_unknown_tie_break_is_rejected() -> None:
    with pytest.raises(ConfigError):
        vote_fold(ballots("a", "b"), tie_break="coin")  # type: ignore[arg-type]


def test_ballot_is_frozen() -> None:
    ballot = Ballot(0, "a")
    with pytest.raises(AttributeError):
        ballot.answer = "b"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("logprobs", "expected"),
    [
        (None, 1.0),
        ([], 1.0),
        ([0.0, 0.0], 1.0),
        ([math.log(0.5)], 0.5),
        ([math.log(0.25), 0.0], 0.5),  # exp of the mean: geometric mean probability
        ([-1.0, -3.0], math.exp(-2.0)),
        ([-math.inf, -1.0], 0.0),
        ([math.nan, -1.0], 1.0),
        ([0.5], 1.0),  # a positive logprob is capped at probability 1
    ],
)
def test_logprob_weight(logprobs: list[float] | None, expected: float) -> None:
    assert logprob_weight(logprobs) == pytest.approx(expected)


@given(st.lists(st.floats(min_value=-50.0, max_value=0.0), min_size=1, max_size=20))
def test_logprob_weight_is_a_probability(logprobs: list[float]) -> None:
    weight = logprob_weight(logprobs)
    assert 0.0 <= weight <= 1.0
    assert weight >= math.exp(min(logprobs)) * (1 - 1e-12)


# --- properties --------------------------------------------------------------------------------

# A small answer alphabet, written in several spellings, so that ties and merges are common.
spellings = st.sampled_from(["7", "7.0", "seven", "Seven.", "1,000", "1000", "x", "X!", "", None])
tie_breaks: st.SearchStrategy[VoteTieBreak] = st.sampled_from(["first_lane", "lexicographic", "random"])


@st.composite
def ballot_lists(draw: st.DrawFn, weighted: bool = False) -> list[Ballot]:
    answers = draw(st.lists(spellings, max_size=12))
    lanes = draw(st.lists(st.integers(0, 1000), min_size=len(answers), max_size=len(answers), unique=True))
    if weighted:
        weights = draw(
            st.lists(
                st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0]),
                min_size=len(answers),
                max_size=len(answers),
            )
        )
    else:
        weights = [1.0] * len(answers)
    return [
        Ballot(lane, answer, weight) for lane, answer, weight in zip(lanes, answers, weights, strict=True)
    ]


@given(
    ballot_lists(weighted=True),
    st.randoms(use_true_random=False),
    tie_breaks,
    st.integers(0, 2**32),
)
def test_permutation_invariance(
    given_ballots: list[Ballot], rng: random.Random, tie_break: VoteTieBreak, seed: int
) -> None:
    shuffled = list(given_ballots)
    rng.shuffle(shuffled)
    expected = vote_fold(given_ballots, tie_break=tie_break, seed=seed)
    got = vote_fold(shuffled, tie_break=tie_break, seed=seed)
    assert got == expected
    assert list(got.votes) == list(expected.votes)  # same order, not only same contents


@given(ballot_lists(weighted=True), tie_breaks, st.integers(0, 2**32))
def test_deterministic_tie_break(given_ballots: list[Ballot], tie_break: VoteTieBreak, seed: int) -> None:
    first = vote_fold(given_ballots, tie_break=tie_break, seed=seed)
    again = vote_fold(list(given_ballots), tie_break=tie_break, seed=seed)
    assert again == first


@given(ballot_lists(weighted=True), tie_breaks, st.integers(-20, 20))
def test_weight_scaling_invariance(given_ballots: list[Ballot], tie_break: VoteTieBreak, power: int) -> None:
    # Powers of two scale floats exactly, so the comparison tests the fold, not rounding.
    factor = 2.0**power
    scaled = [Ballot(b.lane, b.answer, b.weight * factor) for b in given_ballots]
    base = vote_fold(given_ballots, tie_break=tie_break)
    got = vote_fold(scaled, tie_break=tie_break)
    assert (got.winner, got.winner_lane, got.tie_break, got.tied) == (
        base.winner,
        base.winner_lane,
        base.tie_break,
        base.tied,
    )
    assert got.votes == {answer: total * factor for answer, total in base.votes.items()}


@given(ballot_lists())
def test_winner_has_the_most_votes_and_accounting_adds_up(given_ballots: list[Ballot]) -> None:
    result = vote_fold(given_ballots)
    assert sum(result.counts.values()) + result.abstentions == len(given_ballots)
    if result.winner is None:
        assert result.counts == {}
        return
    assert result.votes[result.winner] == max(result.votes.values())
    voters = [
        b.lane for b in given_ballots if b.answer is not None and normalize_answer(b.answer) == result.winner
    ]
    assert result.winner_lane == min(voters)
    # first_lane: no tied answer was voted for by a lower lane than the winner's first lane
    for answer in result.tied:
        first = min(
            b.lane for b in given_ballots if b.answer is not None and normalize_answer(b.answer) == answer
        )
        assert first >= result.winner_lane
    assert result.tie_break == ("first_lane" if result.tied else "none")


@given(ballot_lists())
def test_spellings_of_one_answer_vote_together(given_ballots: list[Ballot]) -> None:
    result = vote_fold(given_ballots)
    assert set(result.votes) <= {"7", "seven", "1000", "x"}
