"""`orchestrator compare`: McNemar against closed forms, equal budgets, the table, resume and
bad input.

Everything runs on the simulated backend, whose answers are a function of the prompt and the
lane's seed: rankings are exact for the seeds used, and resume counts backend calls
(`call_log`), never timings.
"""

from __future__ import annotations

import io
import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

import lanefold
import lanefold.cli._main as cli
from lanefold.cli._compare import command, print_comparison
from lanefold.evaluate._compare import (
    Comparison,
    arm_names,
    mcnemar,
    mcnemar_p,
    run_compare,
)
from lanefold.evaluate._equal_budget import (
    WorstCase,
    apply_limit,
    checked_budget,
    lane_cap,
    prompt_tokens,
    worst_case,
    worst_in,
)
from lanefold.evaluate._eval import read_manifest
from lanefold.evaluate._eval_records import read_results
from lanefold.evaluate._item import Item
from lanefold.evaluate._paired import holm
from lanefold.primitives import BudgetTooSmallError, ConfigError, Pricing


def config(**sections: Any) -> lanefold.LoopConfig:
    loop = {"seed": 3, **sections.pop("loop", {})}
    backend = {"kind": "simulated", "accuracy": 0.6, **sections.pop("backend", {})}
    return lanefold.parse_config({"loop": loop, "backend": backend, "log": {"fsync": "never"}, **sections})


def write_config(path: Path, k: int, *, extra: str = "", backend: str = "") -> Path:
    path.write_text(
        f'[loop]\nk = {k}\nseed = 3\n{extra}\n[backend]\nkind = "simulated"\n'
        f'accuracy = 0.6\n{backend}\n[log]\nfsync = "never"\n'
    )
    return path


def items(n: int) -> list[Item]:
    return [Item(i, f"Question number {i}?", "391", source=f"<test>:{i + 1}") for i in range(n)]


def write_dataset(path: Path, n: int) -> Path:
    path.write_text(
        "".join(json.dumps({"question": f"Question number {i}?", "answer": "391"}) + "\n" for i in range(n))
    )
    return path


def compare_cli(*argv: str) -> int:
    """The `compare` command's handler on the CLI's own parser: errors arrive as exceptions."""
    return command(cli._parser().parse_args(["compare", *argv]))


# -- McNemar ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (0, 0, Fraction(1)),
        (3, 3, Fraction(1)),
        (0, 5, Fraction(2, 2**5)),  # 2 * C(5,0) / 2^5
        (1, 6, Fraction(2 * (1 + 7), 2**7)),  # 2 * (C(7,0) + C(7,1)) / 2^7
        (9, 2, Fraction(2 * (1 + 11 + 55), 2**11)),
        (12, 12, Fraction(1)),
    ],
)
def test_mcnemar_exact_p_is_the_two_sided_binomial(b: int, c: int, p: Fraction) -> None:
    value, method = mcnemar_p(b, c)
    assert method == "exact"
    assert value == pytest.approx(float(p), rel=1e-12)


@given(st.integers(0, 300), st.integers(0, 300))
def test_mcnemar_p_is_the_exact_binomial_sum_for_any_number_of_pairs(b: int, c: int) -> None:
    n = b + c
    tail = sum(Fraction(math.comb(n, i), 2**n) for i in range(min(b, c) + 1))
    value, method = mcnemar_p(b, c)
    assert method == "exact"
    assert value == float(min(Fraction(1), 2 * tail))
    assert value == mcnemar_p(c, b)[0]  # two-sided: symmetric


def test_mcnemar_never_uses_the_chi_square_approximation() -> None:
    """Chi-square with continuity correction (what 25 discordant pairs or more used to get)
    gives 0.100 for 10 vs 20; the exact test 0.0987."""
    assert mcnemar_p(10, 20) == (pytest.approx(2 * sum(math.comb(30, i) for i in range(11)) / 2**30), "exact")
    assert mcnemar_p(10, 20)[0] == pytest.approx(0.09873714, abs=1e-8)
    assert mcnemar_p(9, 20)[0] == pytest.approx(2 * sum(math.comb(29, i) for i in range(10)) / 2**29)
    assert mcnemar_p(20, 20) == (1.0, "exact")


@pytest.mark.parametrize(
    ("p", "adjusted"),
    [
        ([0.01, 0.04, 0.03], [0.03, 0.06, 0.06]),  # 3 x 0.01; 2 x 0.03; 1 x 0.04, kept >= 0.06
        ([0.5, None, 0.01], [0.5, None, 0.02]),  # None is no test: m = 2
        ([0.4, 0.3, 0.2, 0.1], [0.6, 0.6, 0.6, 0.4]),
        ([0.9], [0.9]),
        ([0.6, 0.7], [1.0, 1.0]),  # capped at 1
    ],
)
def test_holm_adjusts_each_p_by_its_rank_and_keeps_them_ordered(
    p: list[float | None], adjusted: list[float | None]
) -> None:
    got = holm(p)
    assert [g is None for g in got] == [a is None for a in adjusted]
    assert [g for g in got if g is not None] == pytest.approx([a for a in adjusted if a is not None])


def test_configs_are_named_by_their_stems() -> None:
    assert arm_names(["a/greedy.toml", "b/greedy.toml", "vote 8.toml", "x/---.toml"]) == [
        "greedy",
        "greedy_2",
        "vote-8",
        "config",
    ]


def test_mcnemar_pairs_questions_by_index() -> None:
    best = {0: True, 1: True, 2: False, 3: True, 9: True}
    other = {0: True, 1: False, 2: True, 3: False, 7: False}
    test = mcnemar(best, other)
    assert (test.paired, test.only_first, test.only_second) == (4, 2, 1)
    assert test.p_value == 1.0  # 2 * (C(3,0) + C(3,1)) / 2^3, capped at 1
    assert mcnemar({0: True}, {1: True}).p_value is None


# -- equal budgets ----------------------------------------------------------------------------


def test_worst_cases_of_the_built_in_loops() -> None:
    sampling = {"max_tokens": 100}
    prompt = 64  # the simulated backend's count
    cases = {
        # What the ledger holds on the simulated backend: a request's lanes share its prompt
        # (one pass a request), each lane its max_tokens; cached prefill is not paid.
        "parallel": (config(loop={"k": 4}, sampling=sampling), 4, 64 + 4 * 100),
        "adaptive": (  # three waves of two, each a request that pays the prompt again
            config(loop={"coordinator": "adaptive_sample", "window": 2, "max_lanes": 6}, sampling=sampling),
            6,
            3 * 64 + 6 * 100,
        ),
        "split": (  # k = 20 at max_concurrency 8: three requests
            config(loop={"k": 20, "max_concurrency": 8}, sampling=sampling),
            20,
            3 * 64 + 20 * 100,
        ),
        "refine": (
            config(
                loop={"coordinator": "sequential_refine", "steps": 3, "mode": "markov"}, sampling=sampling
            ),
            3,
            3 * 164 + 2 * (256 + 164),
        ),
        "debate": (
            config(loop={"coordinator": "debate", "agents": 3, "rounds": 1}, sampling=sampling),
            6,
            64 + 3 * 100 + 3 * (64 + 256 + 3 * 164) + 3 * 100,  # the first round's prompt once
        ),
    }
    for name, (cfg, lanes, tokens) in cases.items():
        case = worst_case(cfg, prompt)
        assert case is not None, name
        assert (case.lanes, case.tokens) == (lanes, tokens), name
    usc = worst_case(config(loop={"k": 2, "reducer": "usc"}, sampling=sampling), prompt)
    assert usc is not None and (usc.judge_prompt_tokens, usc.judge_output_tokens) == (64 + 256 + 2 * 164, 64)
    unshared = config(loop={"k": 4}, sampling=sampling, backend={"shares_prefix": False})
    assert worst_in(unshared, "tokens", prompt) == 4 * (64 + 100)  # every lane pays its prompt
    assert worst_case(config(loop={"coordinator": "plan_verify_replan"}), prompt) is None


def test_worst_case_cost_prices_every_line() -> None:
    case = WorstCase(
        lanes=2,
        prompt_tokens=1000,
        output_tokens=500,
        judge_prompt_tokens=100,
        judge_output_tokens=10,
        cached_tokens=300,
    )
    pricing = Pricing(input_per_mtok=2.0, cached_input_per_mtok=1.0, output_per_mtok=8.0)
    assert case.cost_usd(pricing) == pytest.approx((1100 * 2.0 + 300 * 1.0 + 510 * 8.0) * 1e-6)
    assert case.tokens == 1000 + 500 + 110  # cached prefill is not computed again
    judged = Pricing(input_per_mtok=2.0, output_per_mtok=8.0, verifier_per_mtok=50.0)
    assert case.cost_usd(judged) == pytest.approx((1000 * 2.0 + 500 * 8.0 + 110 * 50.0) * 1e-6)


def test_prompts_a_backend_cannot_count_are_bytes_plus_a_margin() -> None:
    engine = lanefold.parse_config(
        {"loop": {"k": 2}, "prompt": {"template": "Q: {question}\n"}, "sampling": {"max_tokens": 10}}
    )
    questions = ["short?", "a longer question?"]
    longest = len(b"Q: a longer question?\n") + 32
    assert prompt_tokens(engine, questions) == longest
    assert worst_in(engine, "tokens", longest) == longest + 2 * 10  # one request, its prompt once


def test_a_budget_is_a_positive_number_whole_but_for_cost() -> None:
    assert checked_budget("cost", 0.25) == 0.25 and checked_budget("tokens", 900) == 900
    for bad in (0, -1, math.inf, 2.5):
        with pytest.raises(ConfigError, match="--budget"):
            checked_budget("lanes", bad)


def test_applying_a_budget_fits_the_loop_and_writes_its_limit() -> None:
    cfg = config(loop={"k": 8, "min_quorum": 6})
    # Without a price a token budget keeps the params: the limit is their worst case, paid:
    # one request's prompt and each lane's [sampling] max_tokens.
    assert apply_limit(cfg, "tokens", 1234.0, "a.toml").budget.max_tokens == 64 + 8 * 256
    assert apply_limit(cfg, "tokens", 9000.0, "a.toml").budget.max_tokens == 9000

    # With one (what a pilot measured), k fills the budget: 64 prefill + 48 a lane.
    def paid(params: Any) -> float:
        return 64 + 48 * params.k

    fitted = apply_limit(cfg, "tokens", 1234.0, "a.toml", price=paid)
    assert fitted.loop_params.k == (1234 - 64) // 48  # type: ignore[attr-defined]
    assert fitted.budget.max_tokens == 2 * 64 + 24 * 256  # two requests of at most 16 lanes
    with pytest.raises(ConfigError, match=r"a.toml: --budget: 100 tokens .* below what the loop pays"):
        apply_limit(cfg, "tokens", 100.0, "a.toml", price=paid)
    priced = config(loop={"k": 8}, pricing={"input_per_mtok": 1.0, "output_per_mtok": 4.0})
    assert apply_limit(priced, "cost", 0.5, "a.toml").budget.max_cost_usd == 0.5
    capped = apply_limit(cfg, "lanes", 3, "a.toml")
    assert (capped.loop_params.k, capped.loop_params.min_quorum) == (3, 3)  # type: ignore[attr-defined]
    assert capped.budget == cfg.budget
    debate = config(loop={"coordinator": "debate", "agents": 3, "rounds": 3})
    assert lane_cap(debate, 7, "d.toml") == {"agents": 3, "rounds": 1}  # 6 lanes
    assert lane_cap(debate, 4, "d.toml") == {"agents": 2, "rounds": 1}
    with pytest.raises(BudgetTooSmallError, match=r"d\.toml: .*a debate of 1 round needs at least 4 lanes"):
        lane_cap(debate, 3, "d.toml")  # two agents without a round are a vote, not a debate
    vote = config(loop={"coordinator": "debate", "agents": 3, "rounds": 0})
    assert lane_cap(vote, 2, "v.toml") == {"agents": 2, "rounds": 0}  # configured without rounds
    adaptive = config(loop={"coordinator": "adaptive_sample", "window": 4, "max_lanes": 20})
    assert lane_cap(adaptive, 3, "x") == {"max_lanes": 3, "window": 3, "min_quorum": 1}
    with pytest.raises(ConfigError, match="cannot cap the lanes"):
        lane_cap(config(loop={"coordinator": "plan_verify_replan"}), 4, "p.toml")


# -- the comparison ---------------------------------------------------------------------------


def _compare(tmp_path: Path, **kwargs: Any) -> Comparison:
    async def go() -> Comparison:
        return await run_compare(
            {"greedy": config(loop={"k": 1}), "vote5": config(loop={"k": 5})},
            items(60),
            compare_id="cmp",
            runs_dir=tmp_path,
            concurrency=8,
            **kwargs,
        )

    return anyio.run(go)


def test_the_table_ranks_configs_and_tests_each_against_the_best(tmp_path: Path) -> None:
    comparison = _compare(tmp_path)
    assert comparison.best == "vote5"
    vote, greedy = comparison.configs
    assert (vote.name, greedy.name) == ("vote5", "greedy")
    assert vote.accuracy > greedy.accuracy
    assert (vote.mean_lanes, greedy.mean_lanes) == (5, 1)
    assert vote.against_best is None and greedy.against_best is not None
    # McNemar from the evals' own rows, by the closed form.
    best = read_results(tmp_path / "cmp-vote5" / "results.jsonl")
    other = read_results(tmp_path / "cmp-greedy" / "results.jsonl")
    b = sum(best[i].correct and not other[i].correct for i in best)
    c = sum(other[i].correct and not best[i].correct for i in best)
    test = greedy.against_best
    assert (test.paired, test.only_first, test.only_second) == (60, b, c)
    assert test.p_value == mcnemar_p(b, c)[0]
    on_disk = Comparison.model_validate_json((tmp_path / "cmp" / "compare.json").read_text())
    assert on_disk == comparison
    assert comparison.plot == str(tmp_path / "cmp" / "compare.png")
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = io.StringIO()
    print_comparison(comparison, Console(file=out, width=200))
    table = out.getvalue()
    assert table.index("vote5") < table.index("greedy")
    assert "best" in table and f"p={test.p_value:.3g}" in table and "95% CI" in table


LANE_PAID = {"tokens": 48.0, "cost": 48 * 4e-6, "lanes": 1.0}  # a lane's decode, paid
PROMPT_PAID = {"tokens": 64.0, "cost": 64 * 1e-6, "lanes": 0.0}  # the shared prefix, once


@pytest.mark.parametrize(
    ("mode", "budget"), [("tokens", None), ("cost", None), ("lanes", None), ("lanes", 3.0), ("tokens", 700.0)]
)
def test_equal_budget_fits_every_config_to_what_a_question_pays(
    tmp_path: Path, mode: str, budget: float | None
) -> None:
    pricing = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}

    async def go() -> Comparison:
        return await run_compare(
            {
                "greedy": config(loop={"k": 1}, pricing=pricing),
                "vote5": config(loop={"k": 5}, pricing=pricing),
            },
            items(12),
            compare_id="eq",
            runs_dir=tmp_path,
            equal_budget=mode,
            budget=budget,
            plot=False,
        )

    comparison = anyio.run(go)
    settled = comparison.equal_budget
    assert settled is not None and settled.mode == mode
    # On the simulated backend a question of k lanes pays the prefix once and 48 tokens a lane.
    pilot = {name: PROMPT_PAID[mode] + LANE_PAID[mode] * k for name, k in (("greedy", 1), ("vote5", 5))}
    if budget is None:
        assert settled.source == "pilot" and settled.pilot_questions == 10
        assert settled.pilot == pytest.approx(pilot)
        assert settled.limit == pytest.approx(min(pilot.values()))  # the smallest config's mean
    else:
        assert settled.source == "--budget" and settled.limit == budget
        assert settled.pilot == ({} if mode == "lanes" else pytest.approx(pilot))
    recorded = {line.name: line for line in comparison.configs}
    manifests = {name: read_manifest(tmp_path, f"eq-{name}").config for name in recorded}
    for name, line in recorded.items():
        k = manifests[name]["loop"]["k"]  # type: ignore[index]
        assert line.fitted["k"] == k and line.budget == settled.limit
        assert line.unit == {"tokens": "tokens", "cost": "USD", "lanes": "lanes"}[mode]
        assert line.paid_mean == pytest.approx(PROMPT_PAID[mode] + LANE_PAID[mode] * k)
        assert line.paid_min == line.paid_max == pytest.approx(line.paid_mean)
        if mode == "lanes":  # a cap, never a fill: the loops' own keys capped, [budget] untouched
            assert k == min({"greedy": 1, "vote5": 5}[name], int(settled.limit))
            assert line.limits == config().budget.model_dump(mode="json")
        else:  # k fills the budget: the most lanes whose expected spend it holds
            assert k == int((settled.limit - PROMPT_PAID[mode]) / LANE_PAID[mode] + 1e-9)
            assert 0.8 * settled.limit <= line.paid_mean <= 1.05 * settled.limit and line.flag is None
            key = "max_tokens" if mode == "tokens" else "max_cost_usd"
            assert line.limits[key] >= settled.limit  # at least the budget: the fit's waves run whole
    if mode != "lanes":  # the same k for both: the same spend and the same votes
        assert {line.pareto for line in comparison.configs} == {True}
    assert recorded["greedy"].pareto  # nothing pays less
    if budget == 700.0:  # 700 tokens pay for 13 lanes after the prefix
        assert recorded["vote5"].fitted == {"k": 13, "min_quorum": 1}


def test_a_default_budget_below_one_lane_of_a_config_is_raised_to_it(tmp_path: Path) -> None:
    # `short` pays 16 + 16 a question, `long` 64 + 48: the smaller pilot mean (32) is below
    # what `long` pays at its least (one lane), so the budget is that, and `short` gets 6 lanes.
    short = config(loop={"k": 1}, backend={"prompt_tokens": 16, "output_tokens": 16})

    async def go() -> Comparison:
        return await run_compare(
            {"short": short, "long": config(loop={"k": 1})},
            items(12),
            compare_id="raised",
            runs_dir=tmp_path,
            equal_budget="tokens",
            plot=False,
        )

    comparison = anyio.run(go)
    settled = comparison.equal_budget
    assert settled is not None and settled.pilot == {"short": 32, "long": 112}
    assert (settled.limit, settled.source, settled.raised_for) == (112, "pilot", "long")
    lines = {line.name: line for line in comparison.configs}
    assert lines["short"].fitted["k"] == 6 and lines["short"].paid_mean == 16 + 6 * 16
    out = io.StringIO()
    print_comparison(comparison, Console(file=out, width=300))
    assert "the least long can pay" in out.getvalue()


def test_equal_tokens_gives_the_closed_form_accuracy_of_the_fitted_k(tmp_path: Path) -> None:
    """Two answers (the gold and one distractor), so a vote of odd k is a binomial majority."""
    backend = {"distractors": ["381"]}
    budget = 64 + 9 * 48  # the prefix and nine lanes: k = 9 for every parallel_sample config
    known = {"p60": 0.6, "p75": 0.75}

    async def go() -> Comparison:
        return await run_compare(
            {
                name: config(loop={"k": 1 + i * 4, "seed": 11 + i}, backend={**backend, "accuracy": p})
                for i, (name, p) in enumerate(known.items())
            },
            items(240),
            compare_id="closed",
            runs_dir=tmp_path,
            equal_budget="tokens",
            budget=budget,
            plot=False,
        )

    comparison = anyio.run(go)
    for line in comparison.configs:
        assert line.fitted["k"] == 9
        assert 0.8 * budget <= line.paid_mean <= 1.05 * budget and line.flag is None
        p = known[line.name]
        majority = sum(math.comb(9, j) * p**j * (1 - p) ** (9 - j) for j in range(5, 10))
        low, high = line.interval
        assert low <= majority <= high, (line.name, majority, line.interval)


def test_the_same_command_again_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    calls = tmp_path / "calls.log"
    log = f'call_log = "{calls}"'
    write_config(tmp_path / "greedy.toml", 1, backend=log)
    write_config(tmp_path / "vote3.toml", 3, backend=log)
    write_dataset(tmp_path / "q.jsonl", 10)
    argv = (
        "greedy.toml",
        "vote3.toml",
        "--dataset",
        "q.jsonl",
        "--compare-id",
        "again",
        "--equal-budget",
        "tokens",
        "--json",
    )
    assert compare_cli(*argv) == 0
    first = json.loads(capsys.readouterr().out)
    made = calls.read_text()
    # Pilots of 1 and 3 lanes, then both fitted to greedy's pilot mean: one lane each.
    assert made.count("\n") == 10 * (1 + 3) + 10 * (1 + 1)
    rows = (tmp_path / "runs" / "again-vote3" / "results.jsonl").read_text()
    assert compare_cli(*argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert calls.read_text() == made  # no backend call: every question was recorded
    assert (tmp_path / "runs" / "again-vote3" / "results.jsonl").read_text() == rows
    for one in (first, second):
        for line in one["configs"]:
            line.pop("wall_s")
    assert first == second
    assert second == {
        **json.loads((tmp_path / "runs" / "again" / "compare.json").read_text()),
        "configs": second["configs"],
    }
    # Another budget under the same id is refused before anything runs.
    with pytest.raises(ConfigError, match="greedy was run with another config or budget"):
        compare_cli(*argv[:-1], "--budget", "500")
    with pytest.raises(ConfigError, match="greedy was run on other questions"):
        compare_cli(*argv, "--limit", "4")
    assert calls.read_text() == made


def test_the_cli_prints_one_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "a.toml", 1)
    write_config(tmp_path / "b.toml", 3)
    write_dataset(tmp_path / "q.jsonl", 8)
    assert compare_cli("a.toml", "b.toml", "--dataset", "q.jsonl", "--limit", "5") == 0
    out = capsys.readouterr().out
    assert "5 questions of q.jsonl" in out and "vs best (McNemar)" in out
    made = [p for p in (tmp_path / "runs").iterdir() if (p / "compare.json").is_file()]
    assert len(made) == 1 and (made[0] / "compare.png").is_file()


def _bad_input_cases(tmp: Path) -> list[tuple[list[str], str]]:
    a = str(write_config(tmp / "a.toml", 1))
    b = str(write_config(tmp / "b.toml", 2))
    planner = tmp / "plan.toml"
    planner.write_text('[loop]\ncoordinator = "plan_verify_replan"\n[backend]\nkind = "simulated"\n')
    priced = str(write_config(tmp / "priced.toml", 2, extra="[pricing]\ninput_per_mtok = 1.0"))
    bad = tmp / "bad.toml"
    bad.write_text("[loop]\nk = 0\n")
    q = str(write_dataset(tmp / "q.jsonl", 3))
    return [
        ([a, "--dataset", q], "compare needs at least two configs, got 1"),
        ([a, str(tmp / "none.toml"), "--dataset", q], "none.toml: cannot read"),
        ([a, str(bad), "--dataset", q], "bad.toml: loop.k"),
        (
            [a, b, "--dataset", q, "--equal-budget", "time"],
            "--equal-budget: unknown 'time': tokens, cost or lanes",
        ),
        ([a, b, "--dataset", q, "--budget", "9"], "--budget: applies with --equal-budget"),
        (
            [a, b, "--dataset", q, "--equal-budget", "lanes", "--budget", "0"],
            "--budget: must be a positive number",
        ),
        ([a, b, "--dataset", q, "--equal-budget", "cost"], "every config costs $0"),
        (
            [a, b, "--dataset", q, "--equal-budget", "tokens", "--budget", "50"],
            "a.toml: --budget 50 tokens a question is below one lane of this config (65 tokens)",
        ),
        ([a, priced, "--dataset", q], "priced.toml priced, " + a + " not"),
        ([a, priced, "--dataset", q, "--equal-budget", "cost"], "priced.toml priced"),
        (
            [a, str(planner), "--dataset", q, "--equal-budget", "lanes", "--budget", "4"],
            "cannot cap the lanes of 'plan_verify_replan'",
        ),
        ([a, b, "--dataset", str(tmp / "missing.jsonl")], "missing.jsonl: no such file"),
        ([a, b, "--dataset", q, "--compare-id", "a/b"], "is not a plain name"),
        ([a, b, "--dataset", q, "--concurrency", "0"], "--concurrency: must be at least 1"),
        ([a, b, "--dataset", q, "--scorer", "fuzzy"], "unknown scorer 'fuzzy'"),
        (
            [a, str(write_config(tmp / "a-3.toml", 2)), "--dataset", q],
            "a-3: a config named like a question of 'a'",
        ),
    ]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    for argv, expected in _bad_input_cases(tmp_path):
        with pytest.raises(ConfigError) as caught:
            compare_cli(*argv, "--runs-dir", str(runs))
        message = str(caught.value)
        assert caught.value.exit_code == 2, argv
        assert expected in message, (argv, message)
        assert "\n" not in message, argv
        assert not runs.exists(), argv


def test_bad_input_reaches_the_terminal_as_one_line_once_wired(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cli._parser()  # the wired commands register their handlers as the parser is built
    if "compare" not in cli._COMMANDS:
        pytest.skip("`compare` is not wired into orchestrator.cli._main yet")
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "a.toml", 1)
    write_config(tmp_path / "b.toml", 2)
    write_dataset(tmp_path / "q.jsonl", 2)
    code = cli.main(["compare", "a.toml", "b.toml", "--dataset", "q.jsonl", "--equal-budget", "time"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == ("orchestrator compare: --equal-budget: unknown 'time': tokens, cost or lanes\n")
    assert not (tmp_path / "runs").exists()
