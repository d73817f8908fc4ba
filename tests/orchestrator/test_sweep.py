"""`orchestrator sweep`: every config fitted at every budget, points resumable, one
parallel_sample pool read at every smaller budget, a plug-in loop taking part, bad input.

On the simulated backend every prompt is 64 tokens and every answer 48, computed once for a
shared prefix: a question of k lanes pays 64 + 48 k tokens. Backend calls are counted from
`call_log`, never timed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import anyio
import pytest
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

import lanefold.cli._main as cli
from lanefold.cli._sweep import command, print_sweep
from lanefold.evaluate._compare_plot import spend_axis, tick_labels
from lanefold.evaluate._eval import read_manifest
from lanefold.evaluate._item import Item
from lanefold.evaluate._sweep import Sweep, run_sweep
from lanefold.evaluate._sweep_plot import plot_into
from lanefold.primitives import (
    LOOPS,
    Allowance,
    ConfigError,
    CostShape,
    LoopContext,
    Outcome,
    largest_within,
    register_loop,
)


class PhrasingsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(2, ge=1)


class Phrasings:
    """A plug-in: n phrasings of the question in one wave (no shared prefix), the first
    answer wins; it declares its shape and fits n by the budget's price."""

    name: ClassVar[str] = "sweep_phrasings"
    Params: ClassVar[type[BaseModel]] = PhrasingsParams

    def __init__(self, params: PhrasingsParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        lanes = await ctx.wave([ctx.prompt(f"{question} (take {i})") for i in range(self.params.n)])
        best = next((lane for lane in lanes if lane.answer), None)
        if best is None:
            return Outcome(reason="no answer")
        return Outcome(answer=best.answer, winner_lane=best.lane, winner_text=best.text)

    @staticmethod
    def cost_shape(params: PhrasingsParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        return CostShape(params.n, params.n * prompt_tokens, 0)

    @staticmethod
    def fit(params: PhrasingsParams, budget: Allowance) -> PhrasingsParams:
        found = largest_within(budget, 1, lambda n: params.model_copy(update={"n": n}), most=64)
        return params if found is None else params.model_copy(update={"n": found})


@pytest.fixture(autouse=True)
def plug_in() -> Iterator[None]:
    loops = LOOPS.snapshot()
    register_loop(Phrasings)
    yield
    LOOPS.restore(loops)


def write(path: Path, loop: str, *, calls: Path | None = None, extra: str = "") -> str:
    log = f'call_log = "{calls}"\n' if calls else ""
    path.write_text(
        f'[loop]\nseed = 3\n{loop}\n{extra}\n[backend]\nkind = "simulated"\naccuracy = 0.6\n{log}'
        '[log]\nfsync = "never"\n'
    )
    return str(path)


def items(n: int) -> list[Item]:
    return [Item(i, f"Question number {i}?", "391", source=f"<test>:{i + 1}") for i in range(n)]


def sweep(tmp_path: Path, configs: list[str], budgets: list[float], n: int = 20, **kwargs: object) -> Sweep:
    async def go() -> Sweep:
        return await run_sweep(
            configs, items(n), sweep_id="sw", budgets=budgets, runs_dir=tmp_path / "runs", **kwargs
        )

    return anyio.run(go)


def calls_in(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def test_parallel_sample_reads_every_smaller_budget_from_one_pool(tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    vote = write(tmp_path / "vote3.toml", "k = 3", calls=calls)
    budgets = [64 + 48.0, 64 + 3 * 48.0, 64 + 7 * 48.0]  # k = 1, 3, 7
    done = sweep(tmp_path, [vote], budgets)
    (line,) = done.configs
    assert [point.fitted["k"] for point in line.points] == [1, 3, 7]
    assert [point.source for point in line.points] == ["pool", "pool", "eval"]
    assert {point.eval_id for point in line.points} == {"sw-vote3-400"}  # the one pool
    # The pilot (10 questions of 3 lanes) and the largest budget (20 of 7): nothing else.
    assert calls_in(calls) == 10 * 3 + 20 * 7
    for point in line.points:
        assert point.paid_mean == pytest.approx(point.budget)  # 64 + 48 k, paid in full
        assert point.flag is None and point.interval[0] <= point.accuracy <= point.interval[1]
    assert not (tmp_path / "runs" / "sw-vote3-112").exists()  # a pool point samples nothing
    written = json.loads((tmp_path / "runs" / "sw" / "sweep.json").read_text())
    assert written == done.model_dump(mode="json")
    assert (tmp_path / "runs" / "sw" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_points_are_evals_and_resume(tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    refine = write(tmp_path / "refine.toml", 'coordinator = "sequential_refine"\nsteps = 2', calls=calls)
    budgets = [150.0, 400.0]
    first = sweep(tmp_path, [refine], budgets, plot=False)
    made = calls_in(calls)
    (line,) = first.configs
    for point in line.points:  # its own eval, fitted: steps within what the budget pays
        assert point.source == "eval" and point.point_id == point.eval_id
        manifest = read_manifest(tmp_path / "runs", point.eval_id).config
        assert manifest["loop"]["steps"] == point.fitted["steps"]  # type: ignore[index]
        assert point.paid_max <= 1.05 * point.budget
    assert line.points[0].fitted["steps"] < line.points[1].fitted["steps"]
    again = sweep(tmp_path, [refine], budgets, plot=False)
    assert calls_in(calls) == made  # every point and the pilot recorded: no backend call
    assert again == first


def test_a_plug_in_loop_and_the_greedy_baseline_take_part(tmp_path: Path) -> None:
    greedy = write(tmp_path / "greedy.toml", "k = 1", extra="[sampling]\ntemperature = 0")
    plug = write(tmp_path / "phrasings.toml", 'coordinator = "sweep_phrasings"\nn = 2')
    done = sweep(tmp_path, [greedy, plug], [200.0, 400.0], plot=True)
    lines = {line.name: line for line in done.configs}
    # No shared prefix: a phrasing pays its prompt and its answer, 112 tokens.
    assert [point.fitted["n"] for point in lines["phrasings"].points] == [1, 3]
    assert [point.paid_mean for point in lines["phrasings"].points] == [112, 336]
    assert done.baseline is not None and done.baseline.name == "greedy"
    assert 0 <= done.baseline.accuracy <= 1
    for point in lines["phrasings"].points:  # every real run tested against greedy, Holm-adjusted
        test = point.against_greedy
        assert test is not None and test.method == "exact" and test.adjusted_over == 2
        assert test.p_adjusted is not None and test.p_value is not None and test.p_adjusted >= test.p_value
    assert "Holm" in done.tests and "exact" in done.tests


def test_greedy_is_one_lane_at_its_real_spend_never_fitted(tmp_path: Path) -> None:
    """Greedy (k = 1, temperature 0) fitted to a budget was more lanes of the same answer,
    drawn at the budget's spend: it is one run as configured, at what one lane pays."""
    greedy = write(tmp_path / "greedy.toml", "k = 1", extra="[sampling]\ntemperature = 0")
    vote = write(tmp_path / "vote.toml", "k = 3")
    done = sweep(tmp_path, [greedy, vote], [200.0, 400.0], plot=False)
    assert [line.name for line in done.configs] == ["vote"]  # greedy is no line of fitted points
    base = done.baseline
    assert base is not None and base.eval_id == "sw-greedy-greedy"
    assert base.paid_mean == base.paid_min == base.paid_max == 64 + 48  # one lane, as configured
    manifest = read_manifest(tmp_path / "runs", "sw-greedy-greedy").config
    assert manifest["loop"]["k"] == 1 and manifest["budget"]["max_tokens"] is None  # type: ignore[index]
    runs = tmp_path / "runs"
    assert not (runs / "sw-greedy-200").exists() and not (runs / "sw-greedy.pilot").exists()


def sweep_cli(*argv: str) -> int:
    return command(cli._parser().parse_args(["sweep", *argv]))


def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    a = write(tmp_path / "a.toml", "k = 2")
    priced = write(tmp_path / "priced.toml", "k = 2", extra="[pricing]\ninput_per_mtok = 1.0")
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"question": f"Q {i}?", "answer": "391"}) + "\n" for i in range(3)))
    runs = tmp_path / "runs"
    cases = [
        ([a, "--budgets", "2x"], "--budgets: '2x' is not a number"),
        ([a, "--budgets", ","], "--budgets: give one or more budgets"),
        ([a, "--budgets", "0,400"], "--budget: must be a positive number"),
        ([a, "--budgets", "400", "--unit", "lanes"], "--unit: unknown 'lanes'"),
        ([a, "--budgets", "50,400"], "a.toml: --budget 50 tokens a question is below one lane"),
        ([a, priced, "--budgets", "0.001", "--unit", "cost"], "priced.toml priced"),
        ([a, str(tmp_path / "none.toml"), "--budgets", "400"], "none.toml: cannot read"),
        ([a, "--budgets", "400", "--sweep-id", "a/b"], "is not a plain name"),
    ]
    for argv, expected in cases:
        with pytest.raises(ConfigError) as caught:
            sweep_cli(*argv, "--dataset", str(q), "--runs-dir", str(runs))
        message = str(caught.value)
        assert caught.value.exit_code == 2, argv
        assert expected in message, (argv, message)
        assert "\n" not in message, argv
        assert not runs.exists(), argv


def test_the_cli_prints_config_by_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    a = write(tmp_path / "vote.toml", "k = 2")
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Q {i}?", "answer": "391"}) + "\n" for i in range(6))
    )
    assert sweep_cli(a, "--dataset", "q.jsonl", "--budgets", "112,208", "--sweep-id", "t") == 0
    out = capsys.readouterr().out
    assert "112 tokens" in out and "208 tokens" in out and "~" in out
    assert sweep_cli(a, "--dataset", "q.jsonl", "--budgets", "112,208", "--sweep-id", "t", "--json") == 0
    assert json.loads(capsys.readouterr().out)["sweep_id"] == "t"


def test_a_loop_that_cannot_use_a_budget_is_shown_as_such_not_as_a_point(tmp_path: Path) -> None:
    """A debate whose budget funds no rebuttal round is a vote, not a debate; a planner whose
    budget refuses every run scores 0 by failing: neither is drawn or tabled as a point."""
    debate = write(tmp_path / "debate.toml", 'coordinator = "debate"\nagents = 3\nrounds = 1')
    planner = write(tmp_path / "plan.toml", 'coordinator = "plan_verify_replan"')
    done = sweep(tmp_path, [debate, planner], [300.0, 900.0], n=12, plot=True)
    lines = {line.name: line for line in done.configs}
    low, high = lines["debate"].points
    # Two agents' first answers and a rebuttal round pay 64 + 2 x 48 + 2 x (64 + 48) = 384 at
    # most (less where they agree at once and stop): more than 300.
    assert (low.status, low.source, low.accuracy, low.eval_id) == ("below_least", "none", None, None)
    assert low.note is not None and "below a debate's least: two agents and 1 round" in low.note
    assert not (tmp_path / "runs" / "sw-debate-300").exists()  # nothing ran
    assert high.status == "ran" and high.fitted["rounds"] >= 1 and high.accuracy is not None
    refused, funded = lines["plan"].points
    assert refused.status == "refused" and refused.accuracy is None and refused.refused == 12
    # No cost shape: its limit is the budget itself, paid tokens, and no question passes it.
    assert funded.status == "ran" and funded.fit is not None and funded.fit.limit == 900
    assert funded.paid_max <= 900
    out = io.StringIO()
    print_sweep(done, Console(file=out, width=300))
    table = out.getvalue()
    assert "cannot run at this budget" in table and "refused (12 runs)" in table


def test_the_plot_draws_pool_points_hollow_and_no_point_for_a_budget_not_used(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.lines import Line2D

    vote = write(tmp_path / "vote3.toml", "k = 3")
    debate = write(tmp_path / "debate.toml", 'coordinator = "debate"\nagents = 3\nrounds = 1')
    done = sweep(tmp_path, [vote, debate], [300.0, 900.0], n=12, plot=False)
    figure, axes = pyplot.subplots()
    try:
        plot_into(axes, done)
        drawn = {
            artist.get_gid(): artist
            for container in axes.containers
            for artist in container.get_children()
            # the point's marker, not its bars or their caps
            if artist.get_gid() and isinstance(artist, Line2D) and artist.get_marker() in ("o", "X")
        }
    finally:
        pyplot.close(figure)
    pool, run = drawn["vote3@300:pool"], drawn["vote3@900:eval"]
    assert pool.get_markerfacecolor() == "none"  # read from a pool: hollow
    assert run.get_markerfacecolor() != "none"  # a real run: filled
    assert "debate@300:none" not in drawn and "debate@900:eval" in drawn  # no point it cannot use


@pytest.mark.parametrize(
    ("values", "unit", "labels"),
    [
        ([10.0, 10.5, 11.0], "tokens", ["10.0", "10.5", "11.0"]),
        ([200.0, 400.0, 600.0], "tokens", ["200", "400", "600"]),
        ([1200.0, 1250.0], "tokens", ["1,200", "1,250"]),
        ([0.0012, 0.00125, 0.0013], "USD", ["$0.0012", "$0.00125", "$0.0013"]),
        ([0.0, 0.001], "USD", ["$0", "$0.001"]),
    ],
)
def test_tick_labels_are_plain_and_never_repeat(values: list[float], unit: str, labels: list[str]) -> None:
    assert tick_labels(values, unit) == labels


def test_an_axis_over_a_narrow_spend_repeats_no_label() -> None:
    """Spends of 10.2 to 10.8 tokens: whole-number labels would read 10, 10, 11, 11."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots()
    try:
        axes.plot([10.2, 10.8], [0.5, 0.6])
        spend_axis(axes, "tokens")
        figure.canvas.draw()
        shown = [label.get_text() for label in axes.get_xticklabels() if label.get_text()]
    finally:
        pyplot.close(figure)
    assert len(shown) >= 2 and len(set(shown)) == len(shown), shown
