"""`orchestrator curve`: pass@k and majority@k from one eval's pool, sampling nothing.

The estimators are checked against brute force (every subset voted by `vote_fold`) and closed
forms; the command against an eval of the simulated backend's binary sampler (accuracy 0.7,
one distractor), whose majority curve is the binomial tail. Random subsets are seeded, so
every number here is the same on every run.
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lanefold
import lanefold.cli._main as cli
import lanefold.execution._runner
import lanefold.execution._session
from lanefold.backends.simulated import SimulatedBackend
from lanefold.cli._curve import parse_ks
from lanefold.evaluate._curve import (
    Pool,
    PoolQuestion,
    curve_seed,
    majority_at_k,
    pass_at_k,
    read_pool,
    scaling_curve,
)
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import QuestionResult, append_result
from lanefold.evaluate._item import Item
from lanefold.primitives import Ballot, ConfigError, vote_fold

EVAL = "binary"
LANES = 16
QUESTIONS = 300
BINOMIAL = {1: 0.700, 3: 0.784, 5: 0.837, 9: 0.901}  # P(more than k/2 of k right), p = 0.7


# -- brute force ----------------------------------------------------------------------------------


def comb_pass(n: int, c: int, k: int) -> Fraction:
    """pass@k by enumeration: the share of k-subsets holding a correct lane."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def voted(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> Fraction:
    """majority@k by enumeration: every k-subset voted by `vote_fold` (first_lane ties); the
    vote is right when its winning lane is."""
    subsets = list(itertools.combinations(range(len(answers)), k))
    wins = 0
    for subset in subsets:
        result = vote_fold([Ballot(i, answers[i]) for i in subset], tie_break="first_lane")
        wins += result.winner_lane is not None and correct[result.winner_lane]
    return Fraction(wins, len(subsets))


def binomial_majority(p: float, k: int) -> float:
    """P(more than half of k independent lanes are right), k odd."""
    return sum(math.comb(k, j) * p**j * (1 - p) ** (k - j) for j in range(k // 2 + 1, k + 1))


lanes_st = st.lists(st.sampled_from(["42", "41", " 42.", "7", "x", None, ""]), min_size=1, max_size=8)


# -- pass@k ---------------------------------------------------------------------------------------


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_enumeration(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(float(comb_pass(n, c, k)), abs=1e-12)
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


@given(st.integers(1, 3000).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_is_a_probability_rising_in_k(nc: tuple[int, int]) -> None:
    n, c = nc
    ks = range(1, n + 1) if n <= 64 else sorted({1, 2, n // 3, n // 2, n - 1, n})
    values = [pass_at_k(n, c, k) for k in ks]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert values == sorted(values)
    assert values[0] == pytest.approx(c / n, abs=1e-12)
    assert values[-1] == (1.0 if c else 0.0)


def test_pass_at_k_with_a_large_pool_needs_no_huge_integers() -> None:
    value = pass_at_k(100_000, 5, 1_000)
    assert value == pytest.approx(1 - (1 - 1_000 / 100_000) ** 5, rel=1e-3)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_what_is_not_a_pool(n: int, c: int, k: int) -> None:
    with pytest.raises(ConfigError):
        pass_at_k(n, c, k)


# -- majority@k -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(lanes_st, st.sets(st.sampled_from(["42", "41", "7", "x"])), st.data())
def test_majority_at_k_matches_every_subset_voted(
    answers: list[str | None], right: set[str], data: st.DataObject
) -> None:
    """Each answer right or wrong as a whole (an exact-match scorer): counted exactly."""
    from lanefold.primitives import normalize_answer

    correct = [a is not None and normalize_answer(a) in right for a in answers]
    k = data.draw(st.integers(1, len(answers)))
    got = majority_at_k(answers, correct, k)
    assert got.exact and got.se == 0.0
    assert got.value == pytest.approx(float(voted(answers, correct, k)), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(lanes_st, st.data())
def test_majority_at_k_with_a_verdict_per_lane_matches_every_subset(
    answers: list[str | None], data: st.DataObject
) -> None:
    """Lanes with one answer may differ (tests of code): the winner's first lane decides."""
    correct = data.draw(st.lists(st.booleans(), min_size=len(answers), max_size=len(answers)))
    k = data.draw(st.integers(1, len(answers)))
    got = majority_at_k(answers, correct, k)
    assert got.exact
    assert got.value == pytest.approx(float(voted(answers, correct, k)), abs=1e-12)


@pytest.mark.parametrize(("n", "c"), [(9, 0), (9, 4), (11, 7), (20, 13), (20, 20)])
def test_binary_majority_is_the_hypergeometric_tail(n: int, c: int) -> None:
    answers = ["391"] * c + ["381"] * (n - c)
    for k in range(1, n + 1, 2):
        tail = sum(math.comb(c, j) * math.comb(n - c, k - j) for j in range(k // 2 + 1, k + 1))
        got = majority_at_k(answers, [a == "391" for a in answers], k)
        assert got.exact and got.value == pytest.approx(tail / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_subsampled_majority_is_within_its_error_of_the_exact_value(seed: int) -> None:
    rng = random.Random(seed)
    answers = [rng.choice(["1", "2", "3", None]) for _ in range(12)]
    correct = [a == "1" for a in answers]
    for k in (2, 5, 8):
        exact = majority_at_k(answers, correct, k)
        sampled = majority_at_k(answers, correct, k, limit=0, samples=4000, rng=random.Random(seed))
        assert exact.exact and not sampled.exact
        assert abs(sampled.value - exact.value) <= 4 * max(sampled.se, 1e-3)


def test_a_large_pool_is_subsampled_with_a_standard_error() -> None:
    rng = random.Random(7)
    answers = [str(rng.randrange(40)) for _ in range(400)]
    got = majority_at_k(answers, [a == "3" for a in answers], 101, rng=random.Random(1), samples=500)
    assert not got.exact and 0.0 <= got.value <= 1.0 and 0.0 <= got.se <= 0.03
    same = majority_at_k(answers, [a == "3" for a in answers], 101, rng=random.Random(1), samples=500)
    assert same == got  # seeded: the same subsets


# -- the pool and the curve -----------------------------------------------------------------------


def binary_config() -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": LANES, "seed": 0},
            "backend": {"kind": "simulated", "accuracy": 0.7, "distractors": ["381"]},
            "log": {"fsync": "never"},
        }
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An eval of the binary sampler: 300 questions, 16 lanes each, gold 391."""
    folder = tmp_path_factory.mktemp("curve") / "runs"
    items = [Item(i, f"Question {i}: what is 17 * 23?", "391") for i in range(QUESTIONS)]

    async def go() -> None:
        await run_eval(binary_config(), items, eval_id=EVAL, runs_dir=folder, concurrency=16)

    anyio.run(go)
    return folder


@pytest.fixture
def no_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any backend built or sampled from fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the curve called a backend")

    monkeypatch.setattr(lanefold.execution._runner, "build_backend", refuse)
    monkeypatch.setattr(lanefold.execution._session, "build_backend", refuse)
    monkeypatch.setattr(SimulatedBackend, "sample", refuse)


def curve_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`orchestrator curve ...`, in process: its exit code, stdout and stderr."""
    code = cli.main(["curve", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_majority_curve_of_a_binary_sampler_is_the_binomial_tail(
    runs: Path, no_backend: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = curve_cli([EVAL, "--k", "1,3,5,9", "--runs-dir", str(runs)], capsys)
    assert (code, err) == (0, "")
    data = json.loads((runs / EVAL / "curve.json").read_text())
    assert data["questions"] == QUESTIONS and data["lanes_min"] == data["lanes_max"] == LANES
    assert data["scorer"] == "exact" and data["tie_break"] == "first_lane"
    for point in data["points"]:
        expected = BINOMIAL[point["k"]]
        assert expected == pytest.approx(binomial_majority(0.7, point["k"]), abs=5e-4)
        assert point["exact"] == QUESTIONS and point["majority_at_k_mc_se"] == 0.0
        assert 0.0 < point["majority_at_k_se"] < 0.02
        assert abs(point["majority_at_k"] - expected) <= 3 * point["majority_at_k_se"]
        assert point["pass_at_k"] == pytest.approx(1 - 0.3 ** point["k"], abs=0.03)
    assert "majority@k" in out and f"{data['points'][-1]['majority_at_k']:.3f}" in out
    assert (runs / EVAL / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_prints_curve_json(runs: Path, no_backend: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = curve_cli([EVAL, "--k", "2,1", "--runs-dir", str(runs), "--json"], capsys)
    assert (code, err) == (0, "")
    assert len(out.splitlines()) == 1
    printed = json.loads(out)
    assert printed == json.loads((runs / EVAL / "curve.json").read_text())
    assert [p["k"] for p in printed["points"]] == [1, 2]
    # Two lanes tie half the time; the first lane's answer wins: majority@2 = majority@1.
    one, two = printed["points"]
    assert two["majority_at_k"] == pytest.approx(one["majority_at_k"], abs=3 * two["majority_at_k_se"])


def test_reducer_pass_draws_pass_at_k_alone(
    runs: Path, no_backend: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = curve_cli([EVAL, "--k", "1,16", "--reducer", "pass", "--runs-dir", str(runs)], capsys)
    assert code == 0 and "majority" not in out.splitlines()[1]
    points = json.loads((runs / EVAL / "curve.json").read_text())["points"]
    assert all(p["majority_at_k"] is None and p["exact"] is None for p in points)


def test_the_curve_is_seeded(runs: Path, no_backend: None) -> None:
    pool = read_pool(runs, EVAL)
    pool = Pool(EVAL, pool.questions[:100])
    first = scaling_curve(pool, [3, 8], limit=0, samples=200)  # every question subsampled
    assert first == scaling_curve(pool, [3, 8], limit=0, samples=200)
    assert first.seed == curve_seed(EVAL)
    other = scaling_curve(pool, [3, 8], seed=1, limit=0, samples=200)
    assert other.points != first.points
    for point in first.points:
        assert point.exact == 0 and point.majority_at_k_mc_se is not None
        assert 0 < point.majority_at_k_mc_se <= (point.majority_at_k_se or 0)
        exact = scaling_curve(pool, [point.k]).points[0]
        assert point.majority_at_k == pytest.approx(exact.majority_at_k, abs=4 * point.majority_at_k_mc_se)


def test_failed_runs_are_left_out_and_counted(tmp_path: Path) -> None:
    folder = tmp_path / EVAL
    folder.mkdir()
    rows = [
        row(0, ["1", "1", "2"], [True, True, False]),
        row(1, [], [], status="failed"),
        row(2, ["2", None, "1"], [False, False, True]),
    ]
    for each in rows:
        append_result(folder / "results.jsonl", each)
    pool = read_pool(tmp_path, EVAL)
    assert pool.failed == 1 and [q.index for q in pool.questions] == [0, 2]
    assert pool.scorer is None  # no eval.json: an eval written by hand
    curve = scaling_curve(pool, [1, 3])
    assert curve.failed == 1 and curve.points[1].pass_at_k == 1.0
    # Question 0 votes 1 over 2; question 2 ties 2 against 1 and lane 0's answer (2) wins.
    assert curve.points[1].majority_at_k == 0.5


def row(
    index: int, answers: list[str | None], correct: list[bool], *, status: str = "answered"
) -> QuestionResult:
    return QuestionResult(
        index=index,
        run_id=f"{EVAL}-{index}",
        question=f"Q{index}?",
        answer=None,
        gold="1",
        correct=False,
        score=0.0,
        status=status,
        lanes=len(answers),
        lane_answers=answers,
        lane_correct=correct,
        tokens={},
        cost=0.0,
        seconds=0.0,
    )


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["nope", "--k", "1"], "no eval 'nope'"),
        ([EVAL, "--k", "1,32"], "k=32 is more than the 16 completed lanes of question"),
        ([EVAL, "--k", "1,two"], "--k '1,two': 'two' is not an integer"),
        ([EVAL, "--k", "1,,2"], "--k '1,,2': '' is not an integer"),
        ([EVAL, "--k", ""], "--k '': '' is not an integer"),
        ([EVAL, "--k", "0,1"], "--k '0,1': k must be at least 1"),
        ([EVAL, "--k", "-1"], "k must be at least 1"),
        ([EVAL, "--k", "1", "--reducer", "judge_argmax"], "--reducer: unknown reducer"),
        (["../elsewhere", "--k", "1"], ""),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    runs: Path, no_backend: None, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in (runs / EVAL).iterdir())
    written = {name: (runs / EVAL / name).stat().st_mtime_ns for name in before}
    code, out, err = curve_cli([*argv, "--runs-dir", str(runs)], capsys)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("orchestrator curve: ")
    assert says in err
    assert {p.name: p.stat().st_mtime_ns for p in (runs / EVAL).iterdir()} == written


def test_parse_ks_sorts_and_dedupes() -> None:
    assert parse_ks("8, 1,2,2,16") == [1, 2, 8, 16]


def test_a_pool_needs_questions_and_k_values() -> None:
    pool = Pool(EVAL, (PoolQuestion(0, "r", ("1",), (True,)),))
    with pytest.raises(ConfigError, match="no k values"):
        scaling_curve(pool, [])
    with pytest.raises(ConfigError, match="no questions"):
        scaling_curve(Pool(EVAL, ()), [1])
    with pytest.raises(ConfigError, match="unknown reducer"):
        scaling_curve(pool, [1], reducer="usc")
    assert scaling_curve(pool, [1]).points[0].majority_at_k == 1.0
