"""A record that refuses what is not its own: spliced, copied, edited or inconsistent logs.

Each refusal is exit 2 and one line naming `file:line` and what is wrong, from `resume`,
`show`, `tail` and `reduce` alike, and never changes the log. The forgeries of issue 23 (a lane
outside its wave, negative or non-finite usage and cost, an edited bill, another reducer's
tail) are a table every store runs. Hypothesis edits every numeric field of real logs: an
edit of the bill is refused; a field that is no part of the bill is listed, with why, and its
edit leaves the bill as it was. Another mutates logs at random and checks that no traceback
(KeyError, pydantic ValidationError, ...) ever reaches the user.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_resume_stateful import CrashingLog, crashed

import lanefold
from lanefold.cli import main
from lanefold.primitives import Pricing, Usage, hash_config
from lanefold.primitives.internal import cost_of
from lanefold.stores.files import JsonlEventLog

CONFIG = """
[loop]
k = 6
seed = 3
min_quorum = 2

[backend]
kind = "simulated"
accuracy = 0.6

[pricing]
input_per_mtok = 1.0
output_per_mtok = 2.0
"""
# The same run as `a`, best-of-N: its sample wave is `a`'s lane for lane.
JUDGE_CONFIG = (
    CONFIG.replace("min_quorum = 2\n", 'min_quorum = 2\nreducer = "judge_argmax"\n')
    + """
[judge]
template = "Question: {question}\\nCandidate: {candidate}\\nScore (0-10):"
"""
)
# `r`: lanes that fail and retry, a crash with lanes in flight, an interrupt, two resumes.
RESUMED_CONFIG: dict[str, Any] = {
    "loop": {"k": 6, "seed": 3, "min_quorum": 1, "max_concurrency": 6},
    "backend": {"kind": "simulated", "accuracy": 0.6, "failure_rate": 0.3, "lanes_per_request": 1},
    "retry": {"max_attempts": 3, "initial_backoff_s": 0.0005, "max_backoff_s": 0.001},
    "pricing": {
        "input_per_mtok": 1.0,
        "cached_input_per_mtok": 0.25,
        "output_per_mtok": 2.0,
        "kv_per_mtok_s": 0.5,
    },
}
PRICED: dict[str, Any] = {
    "backend": {"kind": "simulated", "accuracy": 0.6},
    "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
}
THREE = json.dumps(
    {
        "subquestions": [
            {"id": "q1", "question": "What is 17 * 20?", "depends_on": []},
            {"id": "q2", "question": "What is 17 * 3?", "depends_on": []},
            {"id": "q3", "question": "What is the sum of the two products?", "depends_on": ["q1", "q2"]},
        ]
    }
)
# A run of each other built-in loop, 17 * 23? at seed 3: `ad` stops at max_lanes after four
# waves of two, `db` debates three rounds, `sr` votes over three refine attempts and `sl`
# answers with the last, `pv` plans three sub-questions, verifies them and synthesizes.
LOOP_CONFIGS: dict[str, dict[str, Any]] = {
    "ad": {**PRICED, "loop": {"coordinator": "adaptive_sample", "window": 2, "max_lanes": 8, "rule": "esc"}},
    "db": {**PRICED, "loop": {"coordinator": "debate", "agents": 3, "rounds": 2}},
    "sr": {**PRICED, "loop": {"coordinator": "sequential_refine", "steps": 3, "reduce": "majority_vote"}},
    "sl": {**PRICED, "loop": {"coordinator": "sequential_refine", "steps": 3}},
    "pv": {
        "loop": {"coordinator": "plan_verify_replan"},
        "sampling": {"max_tokens": 64},
        "backend": {
            "kind": "simulated",
            "accuracy": 1.0,
            "script": [
                {"purpose": "plan", "output": THREE},
                {
                    "purpose": "sample",
                    "output": "17 * 20 = 340.\nAnswer: 340",
                    "match": "^Question: What is 17 \\* 20",
                },
                {
                    "purpose": "sample",
                    "output": "17 * 3 = 51.\nAnswer: 51",
                    "match": "^Question: What is 17 \\* 3",
                },
                {"purpose": "sample", "output": "340 + 51 = 391.\nAnswer: 391"},
                {
                    "purpose": "verify",
                    "output": 'Verdict: {"status": "complete", "score": 0.9, "missing": []}',
                },
                {"purpose": "synthesize", "output": "So 17 * 23 = 391.\nAnswer: 391"},
            ],
        },
    },
}
COMMANDS = ("resume", "show", "tail")
RUNS = ("a", "b", "j", "r")  # the source runs: what a store's copy of them holds
LOOP_RUNS = tuple(LOOP_CONFIGS)  # the other loops' runs, which the forgeries also edit
Events = list[dict[str, Any]]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Finished runs in one runs dir: `a` and `b` (other questions), `j` (`a` best-of-N) and
    `r` (a run that failed lanes, crashed, was interrupted and resumed)."""
    root = tmp_path_factory.mktemp("refusal")
    for name, text in (("loop.toml", CONFIG), ("judge.toml", JUDGE_CONFIG)):
        (root / name).write_text(text)
    for run_id, question, config in (
        ("a", "17 * 23?", "loop.toml"),
        ("b", "What is 6 * 7?", "loop.toml"),
        ("j", "17 * 23?", "judge.toml"),
    ):
        assert (
            main(
                [
                    "run",
                    str(root / config),
                    "--question",
                    question,
                    "--runs-dir",
                    str(root / "runs"),
                    "--run-id",
                    run_id,
                    "--json",
                ]
            )
            == 0
        )
    resumed_run(root / "runs")
    for run_id, raw in LOOP_CONFIGS.items():
        config = lanefold.parse_config({**raw, "loop": {**raw["loop"], "seed": 3}})
        assert lanefold.run_sync(config, "17 * 23?", runs_dir=root / "runs", run_id=run_id).answer
    return root / "runs"


def resumed_run(runs: Path) -> None:
    """`r`: crashed with five lanes in flight, resumed and interrupted, resumed to the end."""
    config = lanefold.parse_config(RESUMED_CONFIG)
    path = runs / "r" / "events.jsonl"
    try:
        anyio.run(
            lambda: lanefold.run(
                config, "17 * 23?", runs_dir=runs, run_id="r", log=CrashingLog(JsonlEventLog.create(path), 9)
            )
        )
    except BaseException as exc:  # the crash, as a killed process's
        assert crashed(exc), exc

    async def interrupted() -> None:
        with anyio.CancelScope() as scope:
            dispatched = []

            def observe(event: object) -> None:
                if getattr(event, "type", None) == "lane.dispatched":
                    dispatched.append(event)
                    if len(dispatched) == 2:  # an interrupt with lanes in flight
                        scope.cancel()

            await lanefold.resume("r", runs_dir=runs, observer=observe)

    anyio.run(interrupted)
    lanefold.resume_sync("r", runs_dir=runs)
    kinds = {json.loads(line)["type"] for line in path.read_text().splitlines()}
    assert {"run.resumed", "lane.failed", "lane.interrupted", "run.completed"} <= kinds


@pytest.fixture
def runs(source: Path, tmp_path: Path) -> Path:
    shutil.copytree(source, tmp_path / "runs")
    return tmp_path / "runs"


def read(runs: Path, run_id: str) -> Events:
    return [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]


def write(runs: Path, run_id: str, events: Events) -> Path:
    path = runs / run_id / "events.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def renumber(events: Events) -> Events:
    """Sequences 1..n and ids to match, as an editor who knew the format would leave them."""
    for i, event in enumerate(events, 1):
        event["sequence"], event["id"] = i, f"{event['run_id']}:{i}"
    return events


def readers(run_id: str) -> list[list[str]]:
    """The commands that read a run's record: each must refuse a forged one."""
    return [*([command, run_id] for command in COMMANDS), ["reduce", run_id, "--reducer", "majority_vote"]]


def refused(runs: Path, run_id: str, capsys: pytest.CaptureFixture[str], line: int, why: str) -> None:
    """Every reader refuses the log with exit 2 and one line naming `line`; nothing changes."""
    path = runs / run_id / "events.jsonl"
    before = path.read_bytes()
    for command in readers(run_id):
        code = main([*command, "--runs-dir", str(runs), "--json"])
        out, err = capsys.readouterr()
        assert code == 2, (command, out, err)
        assert out == "", command
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert re.search(rf"events\.jsonl:{line}: .*{why}", err), (command, err)
    assert path.read_bytes() == before


def test_a_log_spliced_from_two_runs_is_refused_at_the_first_foreign_line(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = read(runs, "a"), read(runs, "b")
    write(runs, "a", a[:8] + b[8:])  # a crashed run "continued" with another run's lines
    refused(runs, "a", capsys, 9, "run_id 'b' is not this run's")


def test_a_copied_run_folder_does_not_pass_for_another_run(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(runs / "a", runs / "copy")
    refused(runs, "copy", capsys, 1, "run_id 'a' is not this run's \\('copy'\\)")


def test_an_edited_config_no_longer_matches_its_hash(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = read(runs, "a")
    events[0]["data"]["config"]["loop"]["k"] = 3
    write(runs, "a", events)
    refused(runs, "a", capsys, 1, "config_hash")


# (event type, field, forged value, what the refusal says): a field of an outcome edited
EDITED_FIELDS = [
    ("lane.completed", "answer", "999", "is not what the extractor finds"),
    ("reduce.completed", "winner", "999", "does not follow from the lanes' answers"),
    ("run.completed", "answer", "999", "run.completed says answer"),
]


def edit_first(events: Events, kind: str, change: Callable[[dict[str, Any]], None]) -> int:
    event = next(e for e in events if e["type"] == kind)
    change(event)
    return int(event["sequence"])


@pytest.mark.parametrize(("kind", "field", "value", "why"), EDITED_FIELDS)
def test_edited_answers_votes_and_results_are_named(
    runs: Path, capsys: pytest.CaptureFixture[str], kind: str, field: str, value: str, why: str
) -> None:
    events = read(runs, "a")
    target = "result" if kind == "run.completed" else None

    def change(event: dict[str, Any]) -> None:
        (event["data"][target] if target else event["data"])[field] = value

    line = edit_first(events, kind, change)
    write(runs, "a", events)
    refused(runs, "a", capsys, line, why)


def test_events_that_do_not_follow_from_the_state_are_refused(
    source: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = read(source, "a")
    line = edit_first(events, "lane.completed", lambda e: e.update(wave=7))
    write(runs, "a", events)
    refused(runs, "a", capsys, line, "wave 7, which was never started")

    events = read(source, "a")
    first = next(i for i, e in enumerate(events) if e["type"] == "lane.dispatched")
    lane = events[first]["lane"]
    del events[first]  # a completion without a dispatch
    write(runs, "a", renumber(events))
    landed = next(e for e in events if e["type"] == "lane.completed" and e["lane"] == lane)
    refused(runs, "a", capsys, landed["sequence"], "without a dispatch")

    events = read(source, "a")
    at = next(i for i, e in enumerate(events) if e["type"] == "lane.completed")
    events.insert(at + 1, json.loads(json.dumps(events[at])))  # the same lane completes twice
    write(runs, "a", renumber(events))
    refused(runs, "a", capsys, at + 2, "without a dispatch \\(the lane is completed\\)")


def test_a_recorded_config_this_version_cannot_validate_names_field_and_version(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = read(runs, "a")
    started = events[0]["data"]
    started["config"]["loop"]["k"] = 0
    started["config_hash"] = hash_config(started["config"])  # a consistent log, from elsewhere
    started["library_version"] = "0.0.9"
    write(runs, "a", events)
    for command in ("resume", "show"):
        assert main([command, "a", "--runs-dir", str(runs)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1
        assert "loop.k" in err and "0.0.9" in err, err


# -- the forgeries of issue 23 --------------------------------------------------------------------

Forgery = tuple[str, Events, int, str]  # the run written, its events, the line named, why


def first(events: Events, kind: str, **where: Any) -> dict[str, Any]:
    return next(e for e in events if e["type"] == kind and all(e.get(k) == v for k, v in where.items()))


def a_lane_outside_its_wave(lane: int) -> Callable[[Path], Forgery]:
    """A crashed run's log (wave 1 dispatched, nothing landed) given one more dispatch, of a
    lane its 6-lane wave never had: resume would bill its hold as cut-off spend."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, "a")
        landed = events.index(first(events, "lane.completed"))
        extra = json.loads(json.dumps(events[landed - 1]))
        extra["lane"], extra["attempt"] = lane, 1
        events = renumber([*events[:landed], extra])
        return "a", events, len(events), f"lane {lane} of wave 1, which was given lanes 0\\.\\.5"

    return forge


def edited(
    run_id: str, kind: str, path: str, value: Any, why: str, *, index: int = 0
) -> Callable[[Path], Forgery]:
    """The `index`-th `kind` event of `run_id` with the field at `path` (dots) set to `value`
    (or to what `value` makes of the old one, if it is callable)."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, run_id)
        event = [e for e in events if e["type"] == kind][index]
        node, (*parents, leaf) = event, [key.replace("\x00", ".") for key in path.split(".")]
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[leaf] = value(node[leaf]) if callable(value) else value
        return run_id, events, event["sequence"], why

    return forge


TOKENS = "data.usage.gen_ai\x00usage\x00output_tokens"  # a key with dots: \x00 stands for them


def usage_and_cost_edited_together(runs: Path) -> Forgery:
    """A lane's usage and its price edited alike: the lane is consistent, the bill is not."""
    events = read(runs, "a")
    lane = first(events, "lane.completed")
    usage = lane["data"]["usage"]
    usage["gen_ai.usage.output_tokens"] += 100
    lane["data"]["cost_usd"] = cost_of(
        Usage(
            usage["gen_ai.usage.input_tokens"],
            usage["gen_ai.usage.cache_read.input_tokens"],
            usage["gen_ai.usage.output_tokens"],
        ),
        "sample",
        Pricing(input_per_mtok=1.0, output_per_mtok=2.0),
    )
    return (
        "a",
        events,
        first(events, "run.completed")["sequence"],
        "run.completed says usage.decode_tokens = 288, the fold of the log gives 388",
    )


def a_judge_run_with_a_majority_votes_tail(runs: Path) -> Forgery:
    """`j` (config: judge_argmax) up to its sample wave's barrier, then `a`'s majority-vote
    reduce and result, run ids rewritten: the same lanes, a judge that never ran."""
    head, tail = read(runs, "j"), read(runs, "a")
    cut = tail.index(first(tail, "reduce.completed"))
    assert head[:cut][-1]["type"] == "wave.barrier"
    for event in tail[cut:]:  # stamped after `j`'s lines, as a careful forger would
        event["time"] = head[cut - 1]["time"]
    events = json.loads(
        json.dumps(head[:cut] + tail[cut:])
        .replace('"a"', '"j"')
        .replace("lanefold:run/a", "lanefold:run/j")
        .replace("/a/", "/j/")
    )
    return (
        "j",
        renumber(events),
        cut + 1,
        "reduce.completed by majority_vote, the config's reducer is judge_argmax",
    )


def another_lanes_text(runs: Path) -> Forgery:
    """The result's winner_text replaced by the text of a lane that gave another answer: a
    real text of the run, not the winner's."""
    events = read(runs, "a")
    result = first(events, "run.completed")["data"]["result"]
    other = next(
        e for e in events if e["type"] == "lane.completed" and e["data"]["answer"] != result["answer"]
    )
    result["winner_text"] = other["data"]["text"]
    return "a", events, events[-1]["sequence"], "run.completed says winner_text"


def a_barrier_dropped(run_id: str, why: str) -> Callable[[Path], Forgery]:
    """`run_id` with its first wave's barrier deleted, the lines after it renumbered: refused
    at the first line that depends on the wave being joined."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, run_id)
        events.remove(first(events, "wave.barrier", wave=1))
        events = renumber(events)
        kinds = ("judge.completed", "reduce.completed") if run_id == "j" else ("reduce.completed",)
        named = next(e for e in events if e["type"] in kinds)
        return run_id, events, named["sequence"], why

    return forge


def a_time_moved(kind: str, index: int, back: timedelta, why: str) -> Callable[[Path], Forgery]:
    """Run `a`'s `index`-th `kind` event stamped `back` before run.started."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, "a")
        event = [e for e in events if e["type"] == kind][index]
        start = datetime.fromisoformat(events[0]["time"])
        event["time"] = (start - back).isoformat().replace("+00:00", "Z")
        return "a", events, event["sequence"], why

    return forge


def a_time_an_hour_back(runs: Path) -> Forgery:
    """The result stamped an hour before the line before it (and after run.started)."""
    events = read(runs, "a")
    events[0]["time"] = (datetime.fromisoformat(events[0]["time"]) - timedelta(hours=3)).isoformat()
    before = datetime.fromisoformat(events[-2]["time"])
    events[-1]["time"] = (before - timedelta(hours=1)).isoformat()
    line = events[-1]["sequence"]
    return "a", events, line, f"run.completed at .*: 3600 s before line {line - 1}'s time"


def a_lane_left_out(runs: Path) -> Forgery:
    """Run `a` with lane 5's dispatch and completion cut out and its barrier listing lanes 0-4:
    a barrier consistent with the lanes that landed, joining a wave that was given six."""
    events = [e for e in read(runs, "a") if e.get("lane") != 5 or e["type"] == "judge.completed"]
    barrier = first(events, "wave.barrier")
    barrier["data"]["completed"].remove(5)
    events = renumber(events)
    return "a", events, barrier["sequence"], "wave.barrier for wave 1 while its lane 5 is pending"


def another_winner(run_id: str) -> Callable[[Path], Forgery]:
    """`run_id`'s reduce and result rewritten alike to crown a candidate with another answer
    (its votes swapped with the winner's, agreement and margin to match): a record that agrees
    with itself and names lanes that ran, and that its lanes' answers do not give."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, run_id)
        reduced = first(events, "reduce.completed")
        reduce, result = reduced["data"], events[-1]["data"]["result"]
        waves = reduce.get("candidate_waves") or [reduced["wave"]]
        other = next(
            e
            for e in events
            if e["type"] == "lane.completed"
            and e["wave"] in waves
            and e["data"]["answer"] not in (None, reduce["winner"])
        )
        votes, answer = reduce["votes"], other["data"]["answer"]
        votes[answer], votes[reduce["winner"]] = votes[reduce["winner"]], votes[answer]
        ours = votes[answer]
        agreement, margin = ours / sum(votes.values()), ours - max(v for a, v in votes.items() if a != answer)
        reduce.update(winner=answer, winner_lane=other["lane"], agreement=agreement, margin=float(margin))
        if "winner_wave" in reduce:
            reduce["winner_wave"] = other["wave"]
        result.update(
            answer=answer,
            winner_lane=other["lane"],
            winner_wave=other["wave"],
            winner_text=other["data"]["text"],
            votes=votes,
            agreement=agreement,
            margin=float(margin),
        )
        return run_id, events, reduced["sequence"], "reduce.completed does not follow from the lanes' answers"

    return forge


def loop_record(
    run_id: str, noun: str, index: int, change: dict[str, Any], outcome: dict[str, Any], why: str
) -> Callable[[Path], Forgery]:
    """`run_id`'s `index`-th `loop.<loop>.<noun>` record with `change` made to its data, and
    the result's `outcome` detail with `outcome` made to it: the loop's own record of what it
    decided, edited where the loop's answer repeats it."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, run_id)
        record = [e for e in events if e["type"].startswith("loop.") and e["type"].endswith(f".{noun}")][
            index
        ]
        record["data"].update(change)
        events[-1]["data"]["result"]["outcome"].update(outcome)
        return run_id, events, record["sequence"], why

    return forge


def answered_by(
    run_id: str, wave: int, lane: int, outcome: dict[str, Any], why: str
) -> Callable[[Path], Forgery]:
    """`run_id`'s result (a loop that answers without a reducer) naming lane `lane` of wave
    `wave`, a lane that ran and answered, as its winner: its answer, wave, lane and text."""

    def forge(runs: Path) -> Forgery:
        events = read(runs, run_id)
        landed = first(events, "lane.completed", wave=wave, lane=lane)["data"]
        result = events[-1]["data"]["result"]
        result.update(answer=landed["answer"], winner_lane=lane, winner_wave=wave, winner_text=landed["text"])
        result["outcome"].update(outcome)
        return run_id, events, events[-1]["sequence"], why

    return forge


def a_verdict_and_its_reduce_edited(runs: Path) -> Forgery:
    """`j` (an LLM judge) with a losing candidate's judge.completed score lowered and the
    reduce and result's scores to match: a record that agrees with itself, and not with what
    the judge wrote."""
    events = read(runs, "j")
    reduce, result = first(events, "reduce.completed")["data"], events[-1]["data"]["result"]
    scored = sorted((s, lane) for lane, s in reduce["scores"].items() if s is not None)
    score, lane = scored[0]  # the lowest: lowering it changes no winner, margin or agreement
    assert int(lane) != reduce["winner_lane"] and len(scored) > 2
    verdict = first(events, "judge.completed", lane=int(lane))
    verdict["data"]["score"] = reduce["scores"][lane] = result["scores"][lane] = score - 1
    next(x for x in result["lanes"] if x["lane"] == int(lane))["score"] = score - 1
    return (
        "j",
        events,
        verdict["sequence"],
        f"judge.completed on lane {lane} of wave 1 says score {score - 1:g}",
    )


FORGERIES: dict[str, Callable[[Path], Forgery]] = {
    "lane 99 dispatched in a 6-lane wave": a_lane_outside_its_wave(99),
    "lane -1 dispatched in a 6-lane wave": a_lane_outside_its_wave(-1),
    "negative decode tokens": edited("a", "lane.completed", TOKENS, -99580, "greater than or equal to 0"),
    "NaN cost": edited("a", "lane.completed", "data.cost_usd", math.nan, "finite number"),
    "infinite hold": edited("a", "lane.dispatched", "data.reserved_cost_usd", math.inf, "finite number"),
    "1e30 USD": edited("a", "lane.completed", "data.cost_usd", 1e30, "less than or equal to"),
    "1e30 tokens": edited("a", "lane.completed", TOKENS, 10**30, "less than or equal to"),
    "negative time": edited(
        "r", "run.resumed", "data.active_seconds_before", -60.0, "greater than or equal to 0"
    ),
    "a hold that reserves nothing": edited(
        "a",
        "lane.dispatched",
        "data.reserved.gen_ai\x00usage\x00output_tokens",
        0,
        "reserves 0 output tokens",
    ),
    "an interrupted lane billed less than its hold": edited(
        "r", "lane.interrupted", "data.billed.gen_ai\x00usage\x00output_tokens", 1, "not its hold"
    ),
    "a resume that forgets time ran": edited(
        "r", "run.resumed", "data.active_seconds_before", 0.0, "the log gives", index=1
    ),
    "a lane's usage edited": edited(
        "a", "lane.completed", TOKENS, lambda v: v + 100, "not the price of its usage"
    ),
    "a lane's cost_usd edited": edited(
        "a", "lane.completed", "data.cost_usd", lambda v: v / 10, "not the price of its usage"
    ),
    "a lane's usage and cost edited together": usage_and_cost_edited_together,
    "the run's usage edited": edited(
        "a",
        "run.completed",
        "data.result.usage.decode_tokens",
        lambda v: v - 100,
        "run.completed says usage.decode_tokens = 188, the fold of the log gives 288",
    ),
    "the run's cost edited": edited(
        "a", "run.completed", "data.result.cost.total", lambda v: v / 2, "run.completed says cost.total"
    ),
    "a lane's tokens in the result edited": edited(
        "a", "run.completed", "data.result.lanes.0.tokens", 1, "lanes are not the lanes of the log"
    ),
    "the run's reducer edited": edited(
        "a",
        "run.completed",
        "data.result.reducer",
        "judge_argmax",
        "names reducer 'judge_argmax', the log's reduce is by majority_vote",
    ),
    "a judge run with a majority vote's tail": a_judge_run_with_a_majority_votes_tail,
    # issue 38: every field of the record derived or checked
    "the winner's text edited": edited(
        "a", "run.completed", "data.result.winner_text", "Answer: 999", "run.completed says winner_text"
    ),
    "the winner's text another lane's": another_lanes_text,
    "the lanes that answered counted again": edited(
        "a", "run.completed", "data.result.lanes_answered", 7, "run.completed says lanes_answered = 7"
    ),
    "a wave's barrier dropped": a_barrier_dropped("a", "reduce.completed before wave 1's wave.barrier"),
    "a judged wave's barrier dropped": a_barrier_dropped(
        "j", "judge.completed on lane \\d+ of wave 1 before its wave.barrier"
    ),
    "a lane completed before the run started": a_time_moved(
        "lane.completed", 2, timedelta(days=1), "lane.completed at .* before run.started"
    ),
    "a barrier a second before the run started": a_time_moved(
        "wave.barrier", 0, timedelta(seconds=1), "wave.barrier at .* before run.started"
    ),
    "a time an hour back": a_time_an_hour_back,
    "the winner's wave edited": edited(
        "j", "run.completed", "data.result.winner_wave", 2, "winner_wave = 2, the log's reduce gives 1"
    ),
    "the winner named without its lane": edited(
        "a", "run.completed", "data.result.winner_lane", None, "says winner_lane = None"
    ),
    "a reduce whose winner never ran": edited(
        "a", "reduce.completed", "data.winner_lane", 99, "winner is lane 99 of waves \\[1\\], which never ran"
    ),
    "a lane's score edited": edited(
        "j", "run.completed", "data.result.lanes.0.score", 10.5, "lane scores are not the reduce's"
    ),
    "the agreement edited": edited(
        "a", "run.completed", "data.result.agreement", 1.0, "agreement = 1.0, the log's reduce gives 0.33"
    ),
    "an error in a completed run": edited(
        "a",
        "run.completed",
        "data.result.error",
        {"type": "X", "exit_code": 1, "message": "m"},
        "run.completed says error = ",
    ),
    "a wave joined with a lane left out": a_lane_left_out,
    # issue 38 (follow-up): every loop's reduction and answer follow from its lanes
    "an adaptive run's reduce and result for another answer": another_winner("ad"),
    "a debate's reduce and result for another answer": another_winner("db"),
    "a refine chain's vote and result for another answer": another_winner("sr"),
    "a judge's verdict and the reduce edited alike": a_verdict_and_its_reduce_edited,
    "an adaptive run's reduce over its first two waves": edited(
        "ad",
        "reduce.completed",
        "data.candidate_waves",
        [1, 2],
        "reduce.completed reads waves \\[1, 2\\], the loop reduces waves \\[1, 2, 3, 4\\]",
    ),
    "an adaptive run's stopping rule edited": loop_record(
        "ad",
        "checked",
        -1,
        {"stopped_by": "esc"},
        {"stopped_by": "esc"},
        "loop.adaptive_sample.checked says stopped_by = 'esc', the lanes give 'max_lanes'",
    ),
    "an adaptive run's tally edited": loop_record(
        "ad", "checked", 1, {"counts": {"401": 2}}, {}, "loop.adaptive_sample.checked says counts = "
    ),
    "a debate round's answers edited": loop_record(
        "db", "round", 0, {"answers": ["381", "381", "381"]}, {}, "loop.debate.round says answers = "
    ),
    "a debate that says its agents agreed": loop_record(
        "db", "round", -1, {"stop": "agreed"}, {"stop": "agreed"}, "loop.debate.round says stop = 'agreed'"
    ),
    "a refine chain answered by an earlier attempt": answered_by(
        "sl", 1, 0, {}, "the last attempt that gave an answer is lane 2 of wave 3"
    ),
    "a refine chain that says an attempt passed": loop_record(
        "sl",
        "stopped",
        0,
        {"reason": "passed"},
        {"stopped": "passed"},
        "loop.sequential_refine.stopped says reason = 'passed'",
    ),
    "a plan run answered by a sub-question while its synthesis answered": answered_by(
        "pv", 2, 0, {"answered_by": "fallback", "winner_wave": 2}, "the synthesis answered"
    ),
    "an adaptive run's outcome edited": edited(
        "ad",
        "run.completed",
        "data.result.outcome.lanes_used",
        99,
        "run.completed's outcome says lanes_used = 99, the log gives 8",
    ),
    **{
        f"{name} that says its budget stopped it": edited(
            run_id,
            "run.completed",
            "data.result.outcome.budget_stop",
            True,
            "run.completed's outcome says budget_stop = True, the log gives no stop for the budget",
        )
        for name, run_id in (
            ("an adaptive run", "ad"),
            ("a debate", "db"),
            ("a refine chain", "sl"),
            ("a plan run", "pv"),
        )
    },
    # the quorum (merged with item 4's: a vote counts the lanes that gave an answer)
    "a vote's quorum edited": edited(
        "a",
        "reduce.completed",
        "data.detail.quorum",
        5,
        "reduce.completed's quorum 5 is not the loop's \\(2\\)",
    ),
    "a vote's quorum a string": edited(
        "a", "reduce.completed", "data.detail.quorum", "2", "reduce.completed's quorum '2' is not the loop's"
    ),
    "a plan run's verdict edited": loop_record(
        "pv",
        "verified",
        0,
        {"verdicts": {"q1": {"status": "failed", "score": 0.1, "missing": [], "parsed": True}}},
        {},
        "loop.plan_verify_replan.verified says",
    ),
}


@pytest.mark.parametrize("name", FORGERIES)
def test_forgeries_are_refused_at_their_line(
    runs: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    run_id, events, line, why = FORGERIES[name](runs)
    write(runs, run_id, events)
    refused(runs, run_id, capsys, line, why)


def test_list_shows_a_runs_last_line_unchecked_and_show_refuses_it(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`list` (and the view's runs list) read a run's first and last lines, not its fold, so a
    forged answer shows there as its last line claims it (docs/cli.md); `show`, `resume`,
    `tail`, `reduce` (and the view's run page and the gateway) read the checked fold, and
    refuse it: an answer to act on is read there."""
    run_id, events, line, why = FORGERIES["an adaptive run's reduce and result for another answer"](runs)
    write(runs, run_id, events)
    assert main(["list", "--runs-dir", str(runs), "--json"]) == 0
    rows = {row["run_id"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    assert rows[run_id]["answer"] == events[-1]["data"]["result"]["answer"] != "391"
    refused(runs, run_id, capsys, line, why)


def test_a_log_cut_before_its_barrier_still_resumes(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A crash between the last lane and the barrier is no forgery: resume joins the wave."""
    events = read(runs, "a")
    cut = events.index(first(events, "wave.barrier"))
    write(runs, "a", events[:cut])
    assert main(["resume", "a", "--runs-dir", str(runs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == events[-1]["data"]["result"]["answer"]
    kinds = [e["type"] for e in read(runs, "a")[cut:]]
    assert kinds == ["run.resumed", "wave.barrier", "reduce.completed", "run.completed"]


@pytest.mark.parametrize("run_id", ["a", "j", "r"])
def test_a_result_written_before_it_named_the_winner_s_wave_still_reads(
    runs: Path, capsys: pytest.CaptureFixture[str], run_id: str
) -> None:
    """Results recorded before `winner_wave` read as before (the winner's text is then the
    text of a lane of that number among the reduce's waves); an edited text is still refused."""
    events = read(runs, run_id)
    result = events[-1]["data"]["result"]
    assert result["winner_wave"] == 1
    del result["winner_wave"]
    write(runs, run_id, events)
    for command in COMMANDS:
        assert main([command, run_id, "--runs-dir", str(runs), "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    result["winner_text"] = "Answer: 999"
    write(runs, run_id, events)
    refused(runs, run_id, capsys, len(events), "run.completed says winner_text = 'Answer: 999'")


@pytest.mark.parametrize(("run_id", "max_tokens"), [("ad", 600), ("db", 400), ("sl", 400), ("pv", 1000)])
def test_a_loop_its_budget_stopped_says_so_and_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_id: str, max_tokens: int
) -> None:
    """A loop cut by its `[budget]` says `budget_stop: true` in its outcome and reads back; a
    result written before it said so (none) reads too; any other value is refused."""
    raw = LOOP_CONFIGS[run_id]
    config = lanefold.parse_config(
        {**raw, "loop": {**raw["loop"], "seed": 3}, "budget": {"max_tokens": max_tokens}}
    )
    runs = tmp_path / "runs"
    result = lanefold.run_sync(config, "17 * 23?", runs_dir=runs, run_id=run_id)
    assert result.outcome["budget_stop"] is True
    events = read(runs, run_id)
    told = events[-1]["data"]["result"]["outcome"]
    for value in (True, None):
        if value is None:
            del told["budget_stop"]
        write(runs, run_id, events)
        code = main(["show", run_id, "--runs-dir", str(runs), "--json"])
        assert code in (0, 4), capsys.readouterr().err
        capsys.readouterr()
    told["budget_stop"] = "yes"
    write(runs, run_id, events)
    refused(runs, run_id, capsys, len(events), "outcome says budget_stop = 'yes', it is true or absent")


def test_a_vote_written_before_its_quorum_was_recorded_still_reads(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reduce.completed without `detail.quorum` (every vote before a quorum counted answers)
    is run again with a quorum of one: `a`'s six answers give the same winner, so it reads."""
    events = read(runs, "a")
    reduced = first(events, "reduce.completed")
    assert reduced["data"]["detail"].pop("quorum") == 2
    write(runs, "a", events)
    for command in COMMANDS:
        assert main([command, "a", "--runs-dir", str(runs), "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()


@pytest.mark.parametrize("back", [timedelta(seconds=1), timedelta(seconds=299)])
def test_a_clock_stepped_back_less_than_five_minutes_still_reads(
    runs: Path, capsys: pytest.CaptureFixture[str], back: timedelta
) -> None:
    """Clocks step (and a resume may run on another machine): a line up to five minutes before
    the latest time so far reads, so long as it is not before run.started."""
    events = read(runs, "a")
    events[0]["time"] = (datetime.fromisoformat(events[0]["time"]) - timedelta(hours=1)).isoformat()
    events[-1]["time"] = (datetime.fromisoformat(events[-2]["time"]) - back).isoformat()
    write(runs, "a", events)
    for command in COMMANDS:
        assert main([command, "a", "--runs-dir", str(runs), "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()


def test_a_re_reduction_by_another_reducer_than_it_opened_is_refused(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reduce", "a", "--reducer", "majority_vote", "--runs-dir", str(runs)]) == 0
    capsys.readouterr()
    events = read(runs, "a")
    reduced = [e for e in events if e["type"] == "reduce.completed"][-1]
    assert reduced["data"]["reduction"] == 2
    reduced["data"]["reducer"] = "weighted_vote"
    write(runs, "a", events)
    refused(
        runs, "a", capsys, reduced["sequence"], "by weighted_vote, reduction 2 was opened for majority_vote"
    )


def test_a_re_reductions_vote_edited_is_refused(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A re-reduction (answers read again with another extractor) is re-run over the waves its
    reduce.started names, with that extractor: its winner and votes swapped for the runner-up's
    are refused at its line, on every store."""
    argv = [
        "reduce",
        "a",
        "--reducer",
        "majority_vote",
        "--extract-regex",
        r"(\d)\d\d",
        "--runs-dir",
        str(runs),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    events = read(runs, "a")
    reduced = [e for e in events if e["type"] == "reduce.completed"][-1]
    data = reduced["data"]
    assert data["reduction"] == 2 and len(data["votes"]) == 2, data
    votes, winner = data["votes"], data["winner"]
    other = next(answer for answer in votes if answer != winner)
    votes[other], votes[winner] = votes[winner], votes[other]
    data["winner"] = other
    write(runs, "a", events)
    refused(
        runs, "a", capsys, reduced["sequence"], "reduce.completed does not follow from the lanes' answers"
    )


# -- every numeric field, edited ---------------------------------------------------------------

# Numbers that are no line of the bill, and why an edit of one changes no charge. Any other
# number in a log is part of the bill or of what it is derived from, and an edit is refused.
# (event type, path pattern) -> why
HARMLESS: dict[tuple[str, str], str] = {
    (
        "wave.started",
        r"data\.reservation\..*",
    ): "the wave's total set aside at dispatch: each lane's hold is in its lane.dispatched",
    (
        "wave.started",
        r"data\.prompt_tokens",
    ): "the first request's prompt size, a report: each hold carries its own prompt",
    (
        "wave.started",
        r"data\.k_requested",
    ): "what the loop asked for: k and the lanes given are what ran (below k it is refused)",
    (
        "lane.dispatched",
        r"data\.(request|seed)",
    ): "which request carried the lane and its sampling seed: no line of the bill",
    ("run.resumed", r"data\.torn_tail_(bytes|line)"): "what the resume cut off a torn tail, a report",
    (
        "run.interrupted",
        r"data\.in_flight\..*",
    ): "which lanes the interrupt cut off, a report: each is its own lane.interrupted",
    (
        "run.completed",
        r"data\.result\.elapsed_s",
    ): "the writer's monotonic clock, not in the log: bounded below by the time before the "
    "last resume, and no charge depends on it",
    ("budget.wave_shrunk", r"data\..*"): "a report of the limit that bound",
    ("budget.exhausted", r"data\..*"): "a report of the limit that bound",
    ("budget.overrun", r"data\..*"): "a report: the lane's usage, which the bill reads, is checked",
}
ENVELOPE = frozenset({"sequence", "wave", "lane", "attempt"})  # where an event falls: checked


def numbers(node: Any, path: tuple[str | int, ...] = ()) -> list[tuple[tuple[str | int, ...], int | float]]:
    """Every number in a JSON value, with its path (booleans are no numbers)."""
    if isinstance(node, dict):
        return [
            found
            for key, value in node.items()
            if not (path == () and key in ENVELOPE)
            for found in numbers(value, (*path, key))
        ]
    if isinstance(node, list):
        return [found for i, value in enumerate(node) for found in numbers(value, (*path, i))]
    if isinstance(node, int | float) and not isinstance(node, bool):
        return [(path, node)]
    return []


def harmless(kind: str, path: tuple[str | int, ...]) -> str | None:
    dotted = ".".join(map(str, path))
    return next(
        (
            why
            for (event, pattern), why in HARMLESS.items()
            if event == kind and re.fullmatch(pattern, dotted)
        ),
        None,
    )


@st.composite
def numeric_edits(draw: st.DrawFn, logs: dict[str, Events]) -> tuple[str, int, tuple[Any, ...], int | float]:
    """A run, one of its events, a number in it, and another value for that number: off by
    one, negative, not a number, infinite, past 2**53, a fraction, anything."""
    run_id = draw(st.sampled_from(sorted(logs)))
    fields = [(i, path, value) for i, event in enumerate(logs[run_id]) for path, value in numbers(event)]
    at, path, old = draw(st.sampled_from(fields))
    new = draw(
        st.one_of(
            st.sampled_from(
                [
                    old + 1,
                    old - 1,
                    -old - 1,
                    old * 2,
                    old + 1e-9,
                    0,
                    0.5,
                    2**53 + 1,
                    10**30,
                    1e30,
                    math.nan,
                    math.inf,
                    -math.inf,
                ]
            ),
            st.integers(),
            st.floats(),
        ).filter(lambda v: not v == old)
    )
    return run_id, at, path, new


def with_number(events: Events, at: int, path: tuple[Any, ...], value: int | float) -> Events:
    edited_events = json.loads(json.dumps(events))
    node = edited_events[at]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return edited_events


def test_the_edited_logs_hold_every_kind_of_event_that_carries_numbers(source: Path) -> None:
    """The logs the edits draw from hold every kind of event they are meant to (a new number
    in an event model lands in one list or the other here)."""
    kinds = {e["type"] for run_id in RUNS for e in read(source, run_id)}
    assert {
        "run.started",
        "wave.started",
        "lane.dispatched",
        "lane.completed",
        "lane.failed",
        "lane.interrupted",
        "run.interrupted",
        "run.resumed",
        "wave.barrier",
        "judge.completed",
        "reduce.completed",
        "run.completed",
    } <= kinds


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_an_edited_number_is_refused_unless_it_is_no_part_of_the_bill(
    source: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    data: st.DataObject,
) -> None:
    logs = {run_id: read(source, run_id) for run_id in RUNS}
    run_id, at, path, value = data.draw(numeric_edits(logs))
    events = logs[run_id]
    runs = tmp_path_factory.mktemp("numbers") / "runs"
    write(runs, run_id, with_number(events, at, path, value))
    original = events[-1]["data"]["result"]
    why = harmless(events[at]["type"], path)
    for command in ("show", "resume"):
        code = main([command, run_id, "--runs-dir", str(runs), "--json"])
        out, err = capsys.readouterr()
        assert len(err.splitlines()) == (code != 0) and "Traceback" not in err, err
        if why is None:  # the bill, or what it is derived from: refused at the line or after
            assert code == 2, (events[at]["type"], path, value, out)
            named = re.search(r":(\d+): (corrupt event log line|written by a newer lanefold): ", err)
            assert named and int(named[1]) >= at + 1, err
        else:  # no part of the bill: refused where the model refuses it, else the same bill
            assert code in (0, 2), err
            if code == 0:
                shown = json.loads(out)
                assert (shown["usage"], shown["cost"]) == (original["usage"], original["cost"])


MUTATIONS = ("delete", "duplicate", "swap", "field")
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 30),
    st.text(max_size=5),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mutation=st.sampled_from(MUTATIONS),
    at=st.integers(0, 40),
    other=st.integers(0, 40),
    path=st.lists(
        st.sampled_from(
            [
                "data",
                "wave",
                "lane",
                "attempt",
                "type",
                "answer",
                "text",
                "usage",
                "seed",
                "k",
                "config",
                "result",
                "in_flight",
                "votes",
                "completed",
            ]
        ),
        min_size=1,
        max_size=3,
    ),
    value=VALUES,
    cut=st.booleans(),
)
def test_no_mutation_of_a_log_ever_shows_a_traceback(
    source: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    mutation: str,
    at: int,
    other: int,
    path: list[str],
    value: object,
    cut: bool,
) -> None:
    runs = tmp_path_factory.mktemp("fuzz") / "runs"
    shutil.copytree(source, runs)
    events = read(runs, "a")
    if cut:
        events = events[: len(events) // 2]  # an unfinished run: resume has work to do
    at, other = at % len(events), other % len(events)
    if mutation == "delete":
        del events[at]
    elif mutation == "duplicate":
        events.insert(at, json.loads(json.dumps(events[at])))
    elif mutation == "swap":
        events[at], events[other] = events[other], events[at]
    else:
        node: Any = events[at]
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[path[-1]] = value
    write(runs, "a", events)
    for command in COMMANDS:
        # Any exception other than the library's own escapes main() and fails the test.
        code = main([command, "a", "--runs-dir", str(runs), "--json"])
        _, err = capsys.readouterr()
        assert code in (0, 1, 2, 3, 4), (command, code)
        assert "Traceback" not in err and len(err.splitlines()) <= 1, (command, err)
