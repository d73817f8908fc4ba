"""The claims `apply` checks, one by one: the lanes a wave was given (and what a log written
before waves recorded them is held to), the prices a fold reads from the record, the reducer
a config names, the bill lines a result names, and the writer refusing what a reader would.

The forgeries themselves, on every store, are in tests/test_record_refusal.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import lanefold
from lanefold.cli import main
from lanefold.coordinators import configured_reducer
from lanefold.coordinators._adaptive_sample import AdaptiveSampleParams
from lanefold.coordinators._parallel_sample import ParallelSampleParams
from lanefold.coordinators._plan_verify_replan import PlanVerifyReplanParams
from lanefold.coordinators._sequential_refine import SequentialRefineParams
from lanefold.primitives import (
    LaneOutcome,
    LogCorruptError,
    MemoryEventLog,
    Pricing,
    RunState,
    Sample,
    SampleRequest,
    Spend,
    Usage,
    fold,
    hash_config,
    parse_event,
)
from lanefold.primitives.events import (
    LaneDispatched,
    LaneDispatchedData,
    ReservationData,
    RunStarted,
    RunStartedData,
    UsageData,
    WaveStarted,
    WaveStartedData,
)
from lanefold.primitives.internal import Recorder, cost_of

PRICING = {"input_per_mtok": 1.0, "cached_input_per_mtok": 0.5, "output_per_mtok": 2.0}
Events = list[dict[str, Any]]


def finished(runs: Path, loop: dict[str, Any], run_id: str = "r") -> Path:
    config = lanefold.parse_config({"loop": loop, "backend": {"kind": "simulated"}, "pricing": PRICING})
    lanefold.run_sync(config, "17 * 23?", runs_dir=runs, run_id=run_id)
    return runs / run_id / "events.jsonl"


def read(path: Path) -> Events:
    return [json.loads(line) for line in path.read_text().splitlines()]


def write(path: Path, events: Events) -> None:
    for i, event in enumerate(events, 1):
        event["sequence"], event["id"] = i, f"{event['run_id']}:{i}"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))


def refusal(runs: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> str:
    assert main([*command, "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err


# -- lanes --------------------------------------------------------------------------------------


def test_a_loop_that_numbers_its_lanes_itself_records_them(tmp_path: Path) -> None:
    path = finished(
        tmp_path, {"coordinator": "adaptive_sample", "window": 3, "max_lanes": 9, "rule": "margin", "seed": 2}
    )
    waves = [e["data"]["lanes"] for e in read(path) if e["type"] == "wave.started"]
    assert waves[0] == [0, 1, 2] and all(w == list(range(3 * i, 3 * i + 3)) for i, w in enumerate(waves))


@pytest.mark.parametrize(
    "loop",
    [{"k": 5}, {"coordinator": "adaptive_sample", "window": 3, "max_lanes": 9, "rule": "margin", "seed": 2}],
)
def test_a_log_written_before_waves_recorded_their_lanes_still_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], loop: dict[str, Any]
) -> None:
    path = finished(tmp_path, loop)
    events = read(path)
    for event in events:
        if event["type"] == "wave.started":
            del event["data"]["lanes"]
    write(path, events)
    for command in ("show", "resume"):
        assert main([command, "r", "--runs-dir", str(tmp_path), "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("lane", "why"),
    [(5, "lane 5 of wave 1, which has 5 lanes"), (-1, "lane -1 of wave 1, which has 5 lanes")],
)
def test_a_log_that_did_not_record_its_lanes_holds_k_lanes_from_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lane: int, why: str
) -> None:
    path = finished(tmp_path, {"k": 5})
    events = read(path)
    for event in events:
        if event["type"] == "wave.started":
            del event["data"]["lanes"]
    landed = next(i for i, e in enumerate(events) if e["type"] == "lane.completed")
    extra = json.loads(json.dumps(events[landed - 1]))
    extra["lane"], extra["attempt"] = lane, 1
    write(path, [*events[:landed], extra, *events[landed:]])
    assert f"events.jsonl:{landed + 1}: corrupt event log line: lane.dispatched for {why}" in refusal(
        tmp_path, capsys, ["show", "r"]
    )


def started(recorder: Recorder) -> None:
    recorder.emit(
        RunStarted,
        RunStartedData(
            config={"pricing": PRICING},
            config_hash=hash_config({"pricing": PRICING}),
            question="q",
            coordinator="test",
            backend="scripted",
            library_version="test",
        ),
    )
    recorder.emit(
        WaveStarted,
        WaveStartedData(
            purpose="sample",
            k=2,
            k_requested=2,
            lane_max_tokens=8,
            prompt_tokens=4,
            share_prefix=False,
            reservation=ReservationData(),
            lanes=[3, 7],
        ),
        wave=1,
    )


def test_the_writer_refuses_a_lane_its_wave_was_not_given_and_writes_nothing() -> None:
    log = MemoryEventLog()
    recorder = Recorder(log, "w", RunState())
    started(recorder)
    hold = UsageData(input_tokens=4, output_tokens=8)
    cost = 1e-6 * (4 * 1.0 + 8 * 2.0)
    recorder.emit(
        LaneDispatched,
        LaneDispatchedData(
            seed=1, max_tokens=8, request=0, reserved=hold, reserved_cost_usd=cost, reserved_requests=1
        ),
        wave=1,
        lane=7,
        attempt=1,
    )
    with pytest.raises(
        LogCorruptError,
        match=r"<log>:4: .*lane 5 of wave 1, which was given "
        r"lanes \[3, 7\]",
    ):
        recorder.emit(
            LaneDispatched,
            LaneDispatchedData(
                seed=1, max_tokens=8, request=1, reserved=hold, reserved_cost_usd=cost, reserved_requests=1
            ),
            wave=1,
            lane=5,
            attempt=1,
        )
    assert log.last_sequence == 3


def test_the_writer_refuses_a_hold_not_priced_at_the_runs_prices() -> None:
    recorder = Recorder(MemoryEventLog(), "w", RunState())
    started(recorder)  # the run's prices come from its recorded config
    with pytest.raises(LogCorruptError, match=r"reserved_cost_usd 0\.0 is not the price"):
        recorder.emit(
            LaneDispatched,
            LaneDispatchedData(
                seed=1,
                max_tokens=8,
                request=0,
                reserved=UsageData(input_tokens=4, output_tokens=8),
                reserved_cost_usd=0.0,
                reserved_requests=1,
            ),
            wave=1,
            lane=3,
            attempt=1,
        )


def test_wave_started_holds_k_distinct_lanes_and_no_more_than_asked() -> None:
    base = {
        "purpose": "sample",
        "k": 2,
        "k_requested": 2,
        "lane_max_tokens": 8,
        "prompt_tokens": 4,
        "share_prefix": True,
        "reservation": {},
    }
    for wrong in ({"lanes": [0, 0]}, {"lanes": [0]}, {"k": 3, "k_requested": 2}):
        with pytest.raises(ValueError):
            WaveStartedData.model_validate({**base, **wrong})


# -- prices and the bill ------------------------------------------------------------------------


def test_a_fold_given_no_prices_reads_the_runs_own_from_its_record(tmp_path: Path) -> None:
    path = finished(tmp_path, {"k": 4})
    events = [parse_event(line) for line in path.read_text().splitlines()]
    state = fold(events)
    assert state.priced and state.pricing == Pricing(**PRICING)
    result = state.result
    assert result is not None and state.spend.cost_lines() == result["cost"]
    # Given other prices, the fold bills at them and checks no claim of cost against them.
    other = fold(events, Pricing(), run_id="r")
    assert not other.priced and other.spend.cost_usd == 0.0


def test_the_bill_lines_a_fold_checks_are_the_ones_a_result_names() -> None:
    spend = Spend()
    spend.add(Usage(10, 20, 30, 0.5), "sample", Pricing(**PRICING, kv_per_mtok_s=1.0), 1)
    spend.add(Usage(5, 0, 7), "verifier", Pricing(**PRICING), 1)
    assert spend.usage_lines() == lanefold.UsageBreakdown.of(spend).model_dump()
    assert spend.cost_lines() == lanefold.CostBreakdown.of(spend).model_dump()


PRICES = st.floats(0, 1000, allow_nan=False, allow_infinity=False)
TOKENS = st.integers(0, 2**40)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(
    usage=st.builds(Usage, TOKENS, TOKENS, TOKENS, st.floats(0, 1e9)),
    bill=st.sampled_from(["sample", "verifier"]),
    pricing=st.builds(
        Pricing,
        input_per_mtok=PRICES,
        cached_input_per_mtok=PRICES,
        output_per_mtok=PRICES,
        verifier_per_mtok=st.none() | PRICES,
        kv_per_mtok_s=PRICES,
    ),
)
def test_a_lanes_price_is_what_the_ledger_adds_bit_for_bit(usage: Usage, bill: str, pricing: Pricing) -> None:
    """The fold compares costs exactly: `cost_of` (what a lane's cost_usd and a hold's price
    are) must be the float the ledger's `Spend.add` makes of the same usage."""
    spend = Spend()
    spend.add(usage, bill, pricing)  # type: ignore[arg-type]
    assert cost_of(usage, bill, pricing).hex() == spend.cost_usd.hex()  # type: ignore[arg-type]


def test_an_elapsed_time_below_zero_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = finished(tmp_path, {"k": 3})
    events = read(path)
    events[-1]["data"]["result"]["elapsed_s"] = -1.0
    write(path, events)
    assert f"events.jsonl:{len(events)}: corrupt event log line: run.completed says elapsed_s" in refusal(
        tmp_path, capsys, ["show", "r"]
    )


def test_tail_follow_reads_the_runs_prices_from_its_record_and_refuses_an_edited_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = finished(tmp_path, {"k": 3})
    events = read(path)
    lane = next(e for e in events if e["type"] == "lane.completed")
    lane["data"]["cost_usd"] *= 3
    write(path, events)
    err = refusal(tmp_path, capsys, ["tail", "r", "--follow", "--wait", "1"])
    assert f"events.jsonl:{lane['sequence']}: corrupt event log line: lane.completed's cost_usd" in err


# -- reducers -----------------------------------------------------------------------------------


class PluginParams(BaseModel):
    reducer: str = "majority_vote"  # a plug-in's own key: it picks reducers itself


@pytest.mark.parametrize(
    ("params", "reducer"),
    [
        (ParallelSampleParams(reducer="judge_argmax"), "judge_argmax"),
        (AdaptiveSampleParams(), "majority_vote"),
        (SequentialRefineParams(), ""),
        (SequentialRefineParams(reduce="majority_vote"), "majority_vote"),
        (PlanVerifyReplanParams(), ""),
        (PluginParams(), None),
    ],
)
def test_the_reducer_a_config_names(params: BaseModel, reducer: str | None) -> None:
    assert configured_reducer(params) == reducer


def test_a_reduce_by_a_loop_that_reduces_nothing_is_refused(tmp_path: Path) -> None:
    path = finished(tmp_path, {"k": 3})
    events = [parse_event(line) for line in path.read_text().splitlines()]
    line = next(e.sequence for e in events if e.type == "reduce.completed")
    with pytest.raises(
        LogCorruptError, match=f":{line}: .*by majority_vote, the config's loop reduces nothing"
    ):
        fold(events, reducer="")
    assert fold(events, reducer="majority_vote").result is not None


# -- what a backend reports ------------------------------------------------------------------------


class NegativeOnce:
    """A plug-in backend that reports a negative usage on each lane's first attempt."""

    name = "negative-once"
    shares_prefix = False
    max_lanes_per_request = None

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 4

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        for lane in request.lanes:
            tokens = -5 if lane.attempt == 1 else 4
            yield Sample(lane.lane, "Answer: 7", "stop", Usage(tokens, 0, 3))

    async def aclose(self) -> None:
        return None


def test_a_usage_the_log_cannot_hold_is_a_bad_answer_retried_not_a_crash(tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {
            "loop": {"k": 2},
            "backend": {"kind": "simulated"},
            "retry": {"max_attempts": 2, "initial_backoff_s": 0.0005, "max_backoff_s": 0.001},
        }
    )
    result = lanefold.run_sync(config, "q", runs_dir=tmp_path, backend=NegativeOnce(), run_id="r")
    assert result.answer == "7" and [lane.attempts for lane in result.lanes] == [2, 2]
    failed = [e for e in read(tmp_path / "r" / "events.jsonl") if e["type"] == "lane.failed"]
    assert [e["data"]["error"] for e in failed] == ["BadResponseError"] * 2
    assert "greater than or equal to 0" in failed[0]["data"]["message"]
