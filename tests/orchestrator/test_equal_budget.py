"""An equal budget that is equal: every loop pays 80-105% of what it was fitted to, on the
backend at hand (waves split into requests by `max_concurrency`, prefill paid per request where
the backend keeps no prefix from one request to the next, a cross-request cache measured by the
pilot), a config over 105% is never best and never on the frontier, and the fit is recorded.

All on the simulated backend: a prompt is 64 tokens and an answer 48, so what each shape pays
is known in closed form; seeds are fixed, so every figure is the same on every run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel, ConfigDict, Field
from starlette.testclient import TestClient

import lanefold
import lanefold.cli._main as cli
from lanefold.cli._compare import command
from lanefold.evaluate._compare import Comparison, run_compare
from lanefold.evaluate._item import Item
from lanefold.evaluate._sweep import Sweep, run_sweep
from lanefold.execution import open_store
from lanefold.primitives import (
    LOOPS,
    Allowance,
    CostShape,
    LoopContext,
    Outcome,
    largest_within,
    register_loop,
)
from lanefold.view._app import create_app

TAIL = '[log]\nfsync = "never"\n'


def write(path: Path, loop: str, *, backend: str = "", sampling: str = "", extra: str = "") -> str:
    path.write_text(
        f"[loop]\nseed = 3\n{loop}\n[sampling]\n{sampling}\n{extra}\n"
        f'[backend]\nkind = "simulated"\naccuracy = 0.6\n{backend}\n{TAIL}'
    )
    return str(path)


def write_dataset(path: Path, n: int) -> str:
    path.write_text(
        "".join(json.dumps({"question": f"Question number {i}?", "answer": "391"}) + "\n" for i in range(n))
    )
    return str(path)


def items(n: int) -> list[Item]:
    return [Item(i, f"Question number {i}?", "391", source=f"<test>:{i + 1}") for i in range(n)]


def compare_cli(*argv: str) -> int:
    return command(cli._parser().parse_args(["compare", *argv]))


def within(paid: float, budget: float) -> bool:
    return 0.8 * budget <= paid <= 1.05 * budget


# -- what the issue asks for ------------------------------------------------------------------


def test_parallel_and_adaptive_both_pay_the_budget_without_a_cross_request_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`compare --equal-budget tokens` of parallel_sample (k fitted, max_concurrency 8) and
    adaptive_sample (window 2) on the simulated backend, whose lanes share a prompt within a
    request only: both pay 80-105% of the budget, and the best is one that paid within it."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "par.toml", "k = 4\nmax_concurrency = 8")
    write(tmp_path / "ada.toml", 'coordinator = "adaptive_sample"\nwindow = 2')
    q = write_dataset(tmp_path / "q.jsonl", 40)
    argv = ["par.toml", "ada.toml", "--dataset", q, "--equal-budget", "tokens", "--budget", "1000"]
    assert compare_cli(*argv, "--compare-id", "eq", "--json") == 0
    comparison = json.loads(capsys.readouterr().out)
    lines = {line["name"]: line for line in comparison["configs"]}
    for name, line in lines.items():
        assert within(line["paid_mean"], 1000), (name, line["paid_mean"], line["fitted"])
        assert line["flag"] is None, name
    # k = 16 goes out as two requests of 8, each paying the prompt: 2 x 64 + 16 x 48 = 896;
    # k = 17 would be three requests, 3 x 64 + 17 x 48 = 1,008, over the budget.
    assert lines["par"]["fitted"]["k"] == 16 and lines["par"]["paid_mean"] == 896
    best = lines[comparison["best"]]
    assert best["flag"] is None and within(best["paid_mean"], 1000)


def test_compare_keeps_what_fit_chose_and_from_which_pilot_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Why k = 16: its pilot (10 questions of 4 lanes: 256 tokens each, 48 a lane, lanes 8
    a request, no prompt kept across requests) priced 16 lanes at 896 and 17 at 1,008."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "par.toml", "k = 4\nmax_concurrency = 8")
    write(tmp_path / "vote.toml", "k = 2")
    q = write_dataset(tmp_path / "q.jsonl", 12)
    argv = ["par.toml", "vote.toml", "--dataset", q, "--equal-budget", "tokens", "--budget", "1000"]
    assert compare_cli(*argv, "--compare-id", "rec", "--json") == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / "runs" / "rec" / "compare.json").read_text())
    assert printed == {**written, "configs": printed["configs"]}
    fit = next(line for line in written["configs"] if line["name"] == "par")["fit"]
    assert (fit["unit"], fit["budget"], fit["keys"], fit["greedy"]) == (
        "tokens",
        1000,
        {"k": 16, "min_quorum": 1},
        False,
    )
    assert fit["expected"] == 896
    assert fit["limit"] == 2 * 64 + 16 * 256  # each of two requests' prompt, each lane's max_tokens
    priced = {tuple(sorted(p["keys"].items())): p["expected"] for p in fit["priced"]}
    assert priced[(("k", 16),)] == 896 and priced[(("k", 17),)] == 3 * 64 + 17 * 48
    pilot = fit["pilot"]
    assert (pilot["eval_id"], pilot["questions"], pilot["mean_paid"]) == ("rec-par.pilot", 10, 64 + 4 * 48)
    assert (pilot["lanes_per_request"], pilot["within_request"], pilot["across_requests"]) == (8, True, False)
    assert (pilot["prefix_reuse"], pilot["reuse_measured"], pilot["decode_per_lane"]) == (0.0, False, 48.0)
    assert pilot["stops"] == [None] * 10  # every question ran its whole wave


def test_greedy_is_never_fitted_in_a_comparison(tmp_path: Path) -> None:
    """Greedy (one lane at temperature 0) keeps its one lane, runs no pilot, and does not set
    the default budget: the fitted configs' smallest pilot mean does."""
    greedy = write(tmp_path / "greedy.toml", "k = 1", sampling="temperature = 0")
    vote = write(tmp_path / "vote.toml", "k = 3")

    async def go() -> Comparison:
        return await run_compare(
            [greedy, vote],
            items(12),
            compare_id="g",
            runs_dir=tmp_path / "runs",
            equal_budget="tokens",
            plot=False,
        )

    comparison = anyio.run(go)
    lines = {line.name: line for line in comparison.configs}
    assert comparison.equal_budget is not None and comparison.equal_budget.limit == 64 + 3 * 48
    assert comparison.equal_budget.pilot == {"vote": 64 + 3 * 48}
    line = lines["greedy"]
    assert line.fit is not None and line.fit.greedy and line.fitted == {} and line.mean_lanes == 1
    assert line.paid_mean == 64 + 48 and line.flag is None and line.budget is None
    assert not (tmp_path / "runs" / "g-greedy.pilot").exists()


# -- every built-in loop, with and without a shared prefix, max_concurrency below k -----------

BACKENDS = {
    "shared": "",  # a request's lanes share its prefill; nothing kept across requests
    "unshared": "shares_prefix = false",  # every lane pays its prompt
    "cached": "prefix_cache = true",  # a prompt sent again is served from a cross-request cache
}
LOOPS_AT = {
    # (loop keys, the budget a question: large enough that each shape's granularity fits)
    "parallel": ("k = 3\nmax_concurrency = 4", 900),
    "adaptive": ('coordinator = "adaptive_sample"\nwindow = 2', 900),  # piloted at max_lanes = 40
    "refine": ('coordinator = "sequential_refine"\nsteps = 2', 900),
    "debate": ('coordinator = "debate"\nagents = 3\nrounds = 3', 800),
    "judged": ('k = 2\nreducer = "judge_argmax"\nmax_concurrency = 4', 900),
}
JUDGE = '[judge]\ntemplate = "{question}\\n{candidate}\\nScore:"'  # each candidate judged alone


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("loop", sorted(LOOPS_AT))
def test_every_built_in_loop_pays_80_to_105_percent(tmp_path: Path, loop: str, backend: str) -> None:
    keys, budget = LOOPS_AT[loop]
    sampling = "max_tokens = 64"  # a lane's worst case above what it writes (48): the ledger's hold
    extra = JUDGE if loop == "judged" else ""
    config = write(tmp_path / f"{loop}.toml", keys, backend=BACKENDS[backend], sampling=sampling, extra=extra)

    async def go() -> Sweep:
        return await run_sweep(
            [config], items(30), sweep_id="sw", budgets=[budget], runs_dir=tmp_path / "runs", plot=False
        )

    (line,) = anyio.run(go).configs
    (point,) = line.points
    assert within(point.paid_mean, budget), (loop, backend, point.paid_mean, point.fitted)
    assert point.flag is None
    assert point.paid_max <= point.fit.limit  # no question passed the per-question limit
    assert point.fit.limit is not None and point.fit.expected is not None
    assert within(point.fit.expected, budget)


def test_parallel_sample_with_max_concurrency_below_k_pays_its_requests(tmp_path: Path) -> None:
    """k lanes at `max_concurrency = 4` go out as ceil(k / 4) requests, each paying the prompt:
    the fit prices that, so a question pays 64 x requests + 48 x k, within the budget."""
    config = write(tmp_path / "par.toml", "k = 2\nmax_concurrency = 4")

    async def go() -> Sweep:
        return await run_sweep(
            [config],
            items(20),
            sweep_id="sw",
            budgets=[700, 1500],
            runs_dir=tmp_path / "runs",
            plot=False,
            pool=False,  # a real run at each budget
        )

    (line,) = anyio.run(go).configs
    for point in line.points:
        k = point.fitted["k"]
        assert point.source == "eval"
        assert point.paid_mean == 64 * -(-k // 4) + 48 * k
        assert within(point.paid_mean, point.budget), (point.budget, k, point.paid_mean)
    # 700: k = 10 (3 x 64 + 10 x 48 = 672; k = 11 would pay 720); 1,500: k = 23 (6 requests, 1,488)
    assert [point.fitted["k"] for point in line.points] == [10, 23]


def test_a_cross_request_cache_is_measured_by_the_pilot(tmp_path: Path) -> None:
    """A backend that keeps a prompt across requests serves every request after the first
    from its cache: the pilot measures it, and the fit gets more lanes for the same budget."""
    cached = write(tmp_path / "cached.toml", "k = 12\nmax_concurrency = 4", backend="prefix_cache = true")
    plain = write(tmp_path / "plain.toml", "k = 12\nmax_concurrency = 4")

    async def go() -> Sweep:
        return await run_sweep(
            [cached, plain], items(20), sweep_id="sw", budgets=[700], runs_dir=tmp_path / "runs", plot=False
        )

    lines = {line.name: line for line in anyio.run(go).configs}
    (with_cache,) = lines["cached"].points
    (without,) = lines["plain"].points
    assert with_cache.fit.pilot is not None and with_cache.fit.pilot.prefix_reuse == 1.0
    assert without.fit.pilot is not None and without.fit.pilot.prefix_reuse == 0.0
    assert with_cache.fitted["k"] == 13  # the prompt computed once: 64 + 13 x 48 = 688
    assert without.fitted["k"] == 10  # three requests of at most 4: 3 x 64 + 10 x 48 = 672
    for point in (with_cache, without):
        assert within(point.paid_mean, 700)


# -- over budget: never best, never on the frontier -------------------------------------------


class GreedyLaterParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(1, ge=1)


class GreedyLater:
    """A plug-in whose declared shape holds on the pilot's questions only: on a question
    marked `late` it runs three waves where it declared one, so it pays over its budget."""

    name: ClassVar[str] = "test_greedy_later"
    Params: ClassVar[type[BaseModel]] = GreedyLaterParams

    def __init__(self, params: GreedyLaterParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        lanes = []
        for _ in range(3 if "late" in question else 1):
            lanes += await ctx.wave([ctx.prompt(question)] * self.params.n)
        best = next((lane for lane in lanes if lane.answer), None)
        if best is None:
            return Outcome(reason="no answer")
        return Outcome(answer=best.answer, winner_lane=best.lane, winner_text=best.text)

    @staticmethod
    def cost_shape(params: GreedyLaterParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        return CostShape(params.n, params.n * prompt_tokens, params.n, prefill_tokens=prompt_tokens)

    @staticmethod
    def fit(params: GreedyLaterParams, budget: Allowance) -> GreedyLaterParams:
        found = largest_within(budget, 1, lambda n: params.model_copy(update={"n": n}), most=64)
        return params if found is None else params.model_copy(update={"n": found})


@pytest.fixture
def greedy_later() -> Iterator[None]:
    loops = LOOPS.snapshot()
    register_loop(GreedyLater)
    yield
    LOOPS.restore(loops)


@pytest.mark.usefixtures("greedy_later")
def test_a_config_over_105_percent_is_never_best_nor_on_the_frontier(tmp_path: Path) -> None:
    config = {"log": {"fsync": "never"}}  # each lane may write 256 tokens: the limit's room

    over = lanefold.parse_config(
        {
            **config,
            "loop": {"coordinator": "test_greedy_later", "seed": 3},
            "backend": {"kind": "simulated", "accuracy": 1.0},
        }
    )
    fair = lanefold.parse_config(
        {**config, "loop": {"k": 1, "seed": 3}, "backend": {"kind": "simulated", "accuracy": 0.3}}
    )
    questions = [
        Item(i, f"Question number {i}{' late' if i >= 10 else ''}?", "391", source=f"<t>:{i}")
        for i in range(30)
    ]

    async def go() -> Comparison:
        return await run_compare(
            {"over": over, "fair": fair},
            questions,
            compare_id="ov",
            runs_dir=tmp_path,
            equal_budget="tokens",
            budget=400,
        )

    comparison = anyio.run(go)
    lines = {line.name: line for line in comparison.configs}
    assert lines["over"].flag == "over" and lines["over"].accuracy > lines["fair"].accuracy
    assert comparison.best == "fair"  # the most accurate paid over 105%: never the best
    assert not lines["over"].pareto and lines["fair"].pareto
    assert lines["over"].capped > 0  # cut at its per-question limit, and it says so
    written: dict[str, Any] = json.loads((tmp_path / "ov" / "compare.json").read_text())
    assert written["best"] == "fair"
    assert [line["pareto"] for line in written["configs"] if line["name"] == "over"] == [False]
    # The view's evals page marks it over its budget and keeps it off the frontier too.
    with TestClient(create_app(open_store(None, tmp_path))) as client:
        page = client.get("/evals", params={"prefix": "ov-"}).text
    assert "data-eval='ov-over' data-frontier='false' data-over='true'" in page
    assert "data-eval='ov-fair' data-frontier=" in page and "data-eval='ov-fair.pilot'" in page
    assert page.count("data-over='true'") == 1  # the pilots and fair were fitted to nothing, or within
    assert "class=over" in page  # drawn as a cross, not a point of the frontier


ENGINE = '''[loop]
k = 4
seed = 0
max_concurrency = 8

[sampling]
temperature = 0.8
max_tokens = 8
stop = ["\\n"]

[prompt]
template = """Question: What is 120 plus 35?
Answer: 155

Question: {question}
Answer:"""

[extract]
method = "last_number"

[backend]
kind = "engine"
model = "smollm2-135m"
device = "cpu"

[log]
fsync = "never"
'''


@pytest.mark.slow
def test_on_the_engine_a_wave_split_by_max_concurrency_pays_its_budget(tmp_path: Path) -> None:
    """SmolLM2 on the bundled engine: k fitted past `max_concurrency = 8` goes out as several
    requests, each prefilling the prompt (a prompt this short keeps few whole blocks in the
    prefix cache); the fit prices that, so the point pays 80-105% of its budget."""
    config = tmp_path / "vote.toml"
    config.write_text(ENGINE)
    questions = [
        Item(i, f"What is {a} plus {b}?", str(a + b))
        for i, (a, b) in enumerate((a, b) for a in range(1, 5) for b in range(1, 6))
    ]

    async def go() -> Sweep:
        return await run_sweep(
            [str(config)], questions, sweep_id="eng", budgets=[120], runs_dir=tmp_path / "runs", plot=False
        )

    (point,) = anyio.run(go).configs[0].points
    assert point.fitted["k"] > 8  # more lanes than one request carries
    assert within(point.paid_mean, 120), (point.fitted, point.paid_mean)
    assert point.fit is not None and point.fit.pilot is not None
    assert point.fit.pilot.lanes_per_request == 8 and point.fit.pilot.across_requests is True
