"""Registration of loops and reducers: decorator, entry point, `module:Class`, names checked."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel

import lanefold
from lanefold.coordinators import vote
from lanefold.primitives import LOOPS, REDUCERS, ConfigError, Lane, resolve_reducer
from lanefold.primitives import _registry as registry
from lanefold.primitives.internal import resolve_loop

ENTRY_POINTS = """\
[lanefold.loops]
ep_plain = eploops:Plain

[lanefold.reducers]
ep_first = eploops:First
"""

MODULE = """\
from pydantic import BaseModel
from lanefold.primitives import Outcome, Reduction


class Plain:  # no decorator: the entry point alone registers it
    name = "plain_ep"

    class Params(BaseModel):
        pass

    def __init__(self, params):
        self.params = params

    async def run(self, ctx, question):
        (lane,) = await ctx.wave([ctx.prompt(question)])
        return Outcome(answer=lane.answer, winner_lane=lane.lane)


class First:
    name = "first_ep"
    needs_judge = False

    def __init__(self, options=None):
        self.options = options

    async def reduce(self, ctx, lanes):
        lane = lanes[0]
        return Reduction(reducer=self.name, winner=lane.answer, winner_lane=lane.lane)
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A plug-in 'installed' as a distribution on sys.path, with entry points only."""
    info = tmp_path / "eploops-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: eploops\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    (tmp_path / "eploops.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = [(kind, kind.snapshot()) for kind in (LOOPS, REDUCERS)]
    for kind, (table, _) in saved:
        kind.restore((table, False))  # as if no entry point had been loaded yet
    yield tmp_path
    for kind, state in saved:
        kind.restore(state)
    sys.modules.pop("eploops", None)


def test_an_entry_point_alone_registers_a_loop_and_a_reducer(installed: Path) -> None:
    loop = resolve_loop("plain_ep")
    assert loop.__name__ == "Plain"
    assert resolve_loop("ep_plain") is loop  # by the entry point's name too
    assert resolve_reducer("first_ep").__name__ == "First"
    assert "plain_ep" in registry.loop_names()


def test_a_loop_from_an_entry_point_runs(installed: Path, tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {
            "loop": {"coordinator": "plain_ep", "seed": 1},
            "backend": {"kind": "simulated", "answer": "42", "accuracy": 1.0},
        }
    )
    result = lanefold.run_sync(config, "q", runs_dir=tmp_path / "runs")
    assert (result.answer, result.reducer) == ("42", "plain_ep")


def test_loop_names_must_name_events() -> None:
    class Shouting:
        name: ClassVar[str] = "Draft-Revise"
        Params: ClassVar[type[BaseModel]] = BaseModel

        async def run(self, ctx: object, question: str) -> None: ...

    with pytest.raises(ConfigError, match="lower case"):
        lanefold.register_loop(Shouting)


def test_a_record_noun_must_name_an_event(tmp_path: Path) -> None:
    class Noisy:
        name: ClassVar[str] = "noisy_test"

        class Params(BaseModel):
            pass

        def __init__(self, params: BaseModel) -> None:
            pass

        async def run(self, ctx: lanefold.LoopContext, question: str) -> lanefold.Outcome:
            ctx.record("Round", {})
            return lanefold.Outcome(answer="x")

    lanefold.register_loop(Noisy)
    config = lanefold.parse_config({"loop": {"coordinator": "noisy_test"}, "backend": {"kind": "simulated"}})
    with pytest.raises(ConfigError, match=r"ctx\.record"):
        lanefold.run_sync(config, "q", runs_dir=tmp_path)


def test_a_vote_over_lanes_of_two_waves_counts_every_lane() -> None:
    lanes = [
        Lane(1, 0, "completed", "a", "7"),
        Lane(1, 1, "completed", "b", "8"),
        Lane(2, 0, "completed", "c", "8"),
        Lane(2, 1, "failed"),
    ]
    result = vote(lanes, tie_break="first_lane", seed=0)
    assert result.votes == {"7": 1.0, "8": 2.0}
    assert result.abstentions == 1


def test_an_entry_point_that_exits_at_import_is_a_config_error_naming_the_key(installed: Path) -> None:
    # A plug-in package's module that calls sys.exit() used to end the process (exit 0 and
    # nothing said, from `orchestrator run`), not refuse the config.
    (installed / "eploops.py").write_text("import sys\nsys.exit(0)\n")
    with pytest.raises(
        ConfigError,
        match=r"^loop\.coordinator: entry point 'ep_plain' in "
        r"lanefold\.loops: cannot load 'eploops:Plain': SystemExit: 0$",
    ):
        resolve_loop("plain_ep")


def test_an_entry_point_taking_a_registered_name_for_another_class_is_refused(installed: Path) -> None:
    # A name is one plug-in: an entry point naming another class under a taken name is a
    # ConfigError naming both, where on main it was ignored without a word (and a package
    # whose entry points repeated the built-ins registered each of them twice).
    (installed / "eploops-0.1.dist-info" / "entry_points.txt").write_text(
        ENTRY_POINTS.replace("ep_first = eploops:First", "majority_vote = eploops:First")
    )
    with pytest.raises(ConfigError) as caught:
        resolve_reducer("first_ep")
    assert str(caught.value) == (
        "loop.reducer: entry point 'majority_vote' in lanefold.reducers: reducer 'majority_vote' is "
        "registered twice: lanefold.coordinators._reducers:MajorityVote and eploops:First"
    )
    assert resolve_reducer("majority_vote").__module__ == "lanefold.coordinators._reducers"


def test_an_entry_point_naming_what_its_module_registers_is_the_same_plug_in(installed: Path) -> None:
    (installed / "eploops.py").write_text(
        MODULE.replace(
            "class Plain:", "from lanefold.primitives import register_loop\n\n\n@register_loop\nclass Plain:"
        )
    )
    loop = resolve_loop("ep_plain")  # loads the module (registering it), then its entry point
    assert resolve_loop("plain_ep") is loop


def test_a_record_nested_past_what_a_reader_parses_is_refused_before_it_is_written(tmp_path: Path) -> None:
    class Deep:
        name: ClassVar[str] = "deep_record_test"

        class Params(BaseModel):
            pass

        def __init__(self, params: BaseModel) -> None:
            pass

        async def run(self, ctx: lanefold.LoopContext, question: str) -> lanefold.Outcome:
            nested: list[object] = []
            for _ in range(300):  # pydantic's JSON parser refuses a line past about 200 levels
                nested = [nested]
            ctx.record("round", {"deep": nested})
            return lanefold.Outcome(answer="x")

    lanefold.register_loop(Deep)
    config = lanefold.parse_config(
        {"loop": {"coordinator": "deep_record_test"}, "backend": {"kind": "simulated"}}
    )
    with pytest.raises(ConfigError, match=r"ctx\.record: data nests deeper than 64 levels"):
        lanefold.run_sync(config, "q", runs_dir=tmp_path)


def test_verdicts_by_lane_number_refuse_two_lanes_numbered_alike(tmp_path: Path) -> None:
    """ctx.verify answers by lane number: lanes of two waves may go together where their
    numbers differ (adaptive_sample numbers its lanes on), never where two share one."""

    class TwoRounds:
        name: ClassVar[str] = "two_rounds_test"

        class Params(BaseModel):
            pass

        def __init__(self, params: BaseModel) -> None:
            pass

        async def run(self, ctx: lanefold.LoopContext, question: str) -> lanefold.Outcome:
            first = await ctx.wave([ctx.prompt()] * 2)
            second = await ctx.wave([ctx.prompt()] * 2)
            await ctx.verify([*first, *second])
            return lanefold.Outcome(answer="x")

    lanefold.register_loop(TwoRounds)
    config = lanefold.parse_config(
        {
            "loop": {"coordinator": "two_rounds_test"},
            "backend": {"kind": "simulated"},
            "judge": {"verifier": "tests.coordinators.test_registry:_always"},
        }
    )
    with pytest.raises(ConfigError, match=r"ctx\.verify: two lanes share a lane number"):
        lanefold.run_sync(config, "q", runs_dir=tmp_path)


def _always(question: str, text: str, answer: str | None) -> bool:
    return True
