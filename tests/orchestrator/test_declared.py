"""Plug-ins take part by what they declare: a loop's cost shape and fit (compared at an equal
budget like a built-in), a reducer's verifier need and summary (refused and shown like one), and
the defaults for a plug-in that declares nothing.

The plug-ins here are registered by the test module, as a user's would be by theirs; the facade
(orchestrator/) knows none of them by name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from pydantic import BaseModel, ConfigDict, Field

import lanefold
from lanefold.cli import main
from lanefold.config._loop_config import preflight
from lanefold.evaluate._compare import Comparison, run_compare
from lanefold.evaluate._equal_budget import fitted_keys, worst_case, worst_in
from lanefold.evaluate._eval import read_manifest
from lanefold.evaluate._item import Item
from lanefold.primitives import (
    LOOPS,
    REDUCERS,
    Allowance,
    ConfigError,
    CostShape,
    JudgeCall,
    Lane,
    LoopContext,
    Outcome,
    ReducerChoice,
    Reduction,
    loop_reducer,
    reducer_traits,
    register_loop,
    register_reducer,
)
from lanefold.primitives.internal import cost_shape, fit_params

PROMPT = 64  # the simulated backend's prompt tokens
MOST = 256  # [sampling] max_tokens by default
LANE = PROMPT + MOST  # one lane's worst case in tokens


class FanParams(BaseModel):
    """`[loop]` keys of the fan: `n` lanes of the one prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n: int = Field(6, ge=1)


class Fan:
    """n lanes, a majority vote; declares its cost shape, its fit and its reducer."""

    name: ClassVar[str] = "fan_plugin"
    Params: ClassVar[type[BaseModel]] = FanParams

    def __init__(self, params: FanParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        lanes = await ctx.wave([ctx.prompt(question)] * self.params.n)
        reduction = await ctx.reduce(lanes, "majority_vote")
        return Outcome(
            answer=reduction.winner,
            winner_lane=reduction.winner_lane,
            reduction=reduction,
            detail={"n": self.params.n},
        )

    @staticmethod
    def cost_shape(params: FanParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        return CostShape(params.n, params.n * prompt_tokens, params.n)

    @staticmethod
    def fit(params: FanParams, budget: Allowance) -> FanParams:
        """The most lanes whose worst case the budget holds, in any unit (at least one)."""
        n = params.n
        while n > 1 and (budget.price(params.model_copy(update={"n": n})) or 0) > budget.amount:
            n -= 1
        return params.model_copy(update={"n": n})

    @staticmethod
    def reducer(params: FanParams) -> ReducerChoice:
        return ReducerChoice("majority_vote")


class Bare:
    """A loop that declares nothing beyond the protocol's minimum."""

    name: ClassVar[str] = "bare_plugin"
    Params: ClassVar[type[BaseModel]] = FanParams

    def __init__(self, params: FanParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        lanes = await ctx.wave([ctx.prompt(question)] * self.params.n)
        reduction = await ctx.reduce(lanes, "majority_vote")
        return Outcome(answer=reduction.winner, winner_lane=reduction.winner_lane, reduction=reduction)


class Passed:
    """The first lane a verifier passes wins; declares that it needs a verifier and how its
    result reads."""

    name: ClassVar[str] = "passed_plugin"
    needs_judge: ClassVar[bool] = True
    needs_verifier: ClassVar[bool] = True
    uses_model: ClassVar[bool] = False
    judge_keys: ClassVar[frozenset[str]] = frozenset({"verifier", "verifier_command", "verifier_timeout_s"})

    def __init__(self, options: Any = None) -> None:
        self.options = options

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        verdicts = await ctx.verify(lanes)
        scores = {lane: verdict.score for lane, verdict in verdicts.items()}
        winner = next(
            (lane for lane in lanes if verdicts.get(lane.lane) is not None and verdicts[lane.lane].passed),
            None,
        )
        return Reduction(
            reducer=self.name,
            winner=winner.answer if winner else None,
            winner_lane=winner.lane if winner else None,
            scores=scores,
            reason=None if winner else "no lane passed",
        )

    @staticmethod
    def summary(reduction: Reduction) -> str:
        passed = sum(score == 1.0 for score in reduction.scores.values())
        return f"checked: {passed} of {len(reduction.scores)} lanes passed"


@pytest.fixture(autouse=True)
def plug_ins() -> Iterator[None]:
    """The plug-ins registered for a test, the registries restored after."""
    loops, reducers = LOOPS.snapshot(), REDUCERS.snapshot()
    register_loop(Fan)
    register_loop(Bare)
    register_reducer(Passed)
    yield
    LOOPS.restore(loops)
    REDUCERS.restore(reducers)


def config(**sections: Any) -> lanefold.LoopConfig:
    loop = {"seed": 3, **sections.pop("loop", {})}
    return lanefold.parse_config(
        {
            "loop": loop,
            "backend": {"kind": "simulated", "accuracy": 0.6},
            "log": {"fsync": "never"},
            **sections,
        }
    )


def items(n: int) -> list[Item]:
    return [Item(i, f"Question number {i}?", "391", source=f"<test>:{i + 1}") for i in range(n)]


# -- a loop's cost shape and fit ------------------------------------------------------------------


def test_a_plug_in_loop_declares_its_worst_case_and_fits_a_budget() -> None:
    fan = config(loop={"coordinator": "fan_plugin", "n": 6})
    case = worst_case(fan, PROMPT)
    assert case is not None and (case.lanes, case.tokens) == (6, 6 * LANE)
    assert worst_in(fan, "tokens", PROMPT) == 6 * LANE

    def worst(params: BaseModel) -> float | None:  # a price: here each lane's worst case
        return worst_in(fan, "tokens", PROMPT, params)

    assert fitted_keys(fan, "tokens", 3 * LANE + 10, "fan.toml", price=worst) == {"n": 3}
    assert fitted_keys(fan, "lanes", 2, "fan.toml") == {"n": 2}
    assert loop_reducer(Fan, fan.loop_params) == ReducerChoice("majority_vote")


def test_a_loop_that_declares_nothing_gets_the_defaults() -> None:
    bare = config(loop={"coordinator": "bare_plugin", "n": 2})
    params = bare.loop_params
    assert cost_shape(Bare, params, prompt_tokens=PROMPT, max_tokens=MOST) is None
    assert worst_case(bare, PROMPT) is None
    assert fit_params(Bare, params, Allowance("tokens", 500)) is params  # the limit binds
    with pytest.raises(ConfigError, match=r"cannot cap the lanes of 'bare_plugin' .*no fit"):
        fit_params(Bare, params, Allowance("lanes", 1))
    assert loop_reducer(Bare, params) is None  # it picks its reducers itself
    assert worst_in(bare, "tokens", PROMPT) is None
    assert fitted_keys(bare, "tokens", 900, "bare.toml") == {}


def test_run_compare_fits_a_plug_in_loop_to_the_equal_budget(tmp_path: Path) -> None:
    configs = {"greedy": config(loop={"k": 1}), "fan": config(loop={"coordinator": "fan_plugin", "n": 6})}
    # The fan pays the shared prefix once and 48 tokens a lane; its fit keeps to its
    # configured n at most, so 3 lanes' spend plus a little funds three of its six lanes.
    budget = PROMPT + 3 * 48 + 10

    async def go() -> Comparison:
        return await run_compare(
            configs,
            items(6),
            compare_id="fit",
            runs_dir=tmp_path,
            equal_budget="tokens",
            budget=budget,
            plot=False,
        )

    comparison = anyio.run(go)
    assert comparison.equal_budget is not None
    assert comparison.equal_budget.pilot == {"greedy": PROMPT + 48, "fan": PROMPT + 6 * 48}
    lines = {line.name: line for line in comparison.configs}
    assert lines["fan"].fitted == {"n": 3} and lines["greedy"].fitted == {"k": 3, "min_quorum": 1}
    assert lines["fan"].loop == "fan_plugin" and lines["fan"].mean_lanes == 3.0
    manifest = read_manifest(tmp_path, "fit-fan").config
    assert manifest["loop"]["n"] == 3  # type: ignore[index]
    assert manifest["budget"]["max_tokens"] == 3 * LANE  # its worst case: the waves run whole
    assert 0.8 * budget <= lines["fan"].paid_mean <= 1.05 * budget


def test_the_compare_command_fits_a_plug_in_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    tail = '[backend]\nkind = "simulated"\naccuracy = 0.6\n[log]\nfsync = "never"\n'
    (tmp_path / "greedy.toml").write_text(f"[loop]\nk = 1\nseed = 3\n{tail}")
    (tmp_path / "fan.toml").write_text(f'[loop]\ncoordinator = "fan_plugin"\nn = 6\n{tail}')
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"question": f"Question number {i}?", "answer": "391"}) + "\n" for i in range(4))
    )
    assert (
        main(
            [
                "compare",
                "greedy.toml",
                "fan.toml",
                "--dataset",
                "q.jsonl",
                "--compare-id",
                "cli",
                "--equal-budget",
                "tokens",
                "--budget",
                str(PROMPT + 2 * 48),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    fan = next(line for line in out["configs"] if line["name"] == "fan")
    assert fan["fitted"] == {"n": 2} and fan["mean_lanes"] == 2.0
    assert out["equal_budget"]["pilot"]["fan"] == PROMPT + 6 * 48
    assert fan["paid_mean"] == fan["budget"] == PROMPT + 2 * 48


# -- a reducer's declarations -----------------------------------------------------------------------


def test_a_plug_in_reducer_declares_its_needs() -> None:
    traits = reducer_traits(Passed)
    assert (traits.needs_verifier, traits.uses_model, traits.needs_judge) == (True, False, True)
    assert traits.judge_keys == Passed.judge_keys
    call = JudgeCall(
        candidates=3, prompt_tokens=PROMPT, answer_tokens=MOST + 64, max_tokens=64, verifier=True
    )
    assert traits.judge_tokens(call) == (0, 0)  # it calls no model
    with pytest.raises(ConfigError, match="reducer passed_plugin needs a verifier"):
        preflight(config(loop={"k": 3, "reducer": "passed_plugin"}))


def test_show_prints_a_plug_in_reducers_own_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = [sys.executable, "-c", "import sys; sys.exit(0 if sys.stdin.read() else 1)"]
    cfg = config(loop={"k": 4, "reducer": "passed_plugin"}, judge={"verifier_command": check})
    result = lanefold.run_sync(cfg, "What is 17 * 23?", runs_dir=tmp_path)
    assert result.reducer == "passed_plugin" and result.winner_lane == 0
    capsys.readouterr()
    assert main(["show", result.run_id, "--runs-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert "checked: 4 of 4 lanes passed" in shown
    assert "votes:" not in shown and "scores:" not in shown


def test_the_loop_context_declares_record_verdict() -> None:
    """A reducer that scores lanes itself (an LLM judge) records each verdict through the
    protocol, not by looking for the method on whatever context it was given."""
    from lanefold.primitives.internal import RunContext

    assert "record_verdict" in LoopContext.__dict__
    assert callable(RunContext.record_verdict)
