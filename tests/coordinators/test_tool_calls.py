"""Runs whose lanes answer with tool calls, end to end on the simulated backend (issue 40).

The run's tools reach every sampled lane's request (with the schema a constraining backend
holds the lanes to), `run.started` records them, the lanes' calls are read into their
canonical form and voted, an invalid call is a lane without an answer that says why, each
reducer reads calls (field_vote, judge_argmax shown the calls, any_pass with schema_valid or a
verifier given the parsed call), a tool run resumes with its tools, and a log whose call was
edited is refused by every reader.
"""

from __future__ import annotations

import dataclasses
import html
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.cli import main
from lanefold.primitives import (
    ChatMessage,
    ConfigError,
    LaneOutcome,
    MessageToolCall,
    Sample,
    SampleRequest,
    ToolCall,
    tools_schema,
)

QUESTION = "What is the weather in Paris for two days, in celsius?"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "default": 1},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, TIME]
RIGHT = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "unit": "c"}}'
CANONICAL = '{"arguments":{"city":"Paris","days":2,"unit":"c"},"name":"get_weather"}'
WRONG = [
    '{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2, "unit": "c"}}',
    '{"name": "get_time", "arguments": {}}',
]


def config(
    reducer: str = "majority_vote", k: int = 5, judge: dict[str, Any] | None = None
) -> lanefold.LoopConfig:
    raw: dict[str, Any] = {
        "loop": {"coordinator": "parallel_sample", "k": k, "reducer": reducer, "seed": 5},
        "backend": {
            "kind": "simulated",
            "answer": RIGHT,
            "distractors": WRONG,
            "accuracy": 0.7,
            "vary_json": True,
        },
        "extract": {"method": "tool_call"},
    }
    if judge is not None:
        raw["judge"] = judge
    return lanefold.parse_config(raw)


class Seen(SimulatedBackend):
    """The simulated backend, keeping every request it is sent; `texts` replaces lanes' texts."""

    def __init__(self, cfg: lanefold.LoopConfig, texts: dict[int, str] | None = None) -> None:
        assert isinstance(cfg.backend, SimulatedConfig)
        super().__init__(cfg.backend)
        self.seen: list[SampleRequest] = []
        self.texts = texts or {}

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.seen.append(request)
        async for outcome in super().sample(request):
            if isinstance(outcome, Sample) and request.purpose == "sample" and outcome.lane in self.texts:
                outcome = dataclasses.replace(outcome, text=self.texts[outcome.lane])
            yield outcome


def read(path: str | None) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path or "").read_text().splitlines()]


def show(runs: Path, run_id: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["show", run_id, "--runs-dir", str(runs)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_tool_run_sends_its_tools_records_them_and_votes_over_canonical_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config()
    backend = Seen(cfg)
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="t", backend=backend, tools=TOOLS)
    sampled = [r for r in backend.seen if r.purpose == "sample"]
    assert sampled and all(r.tools and r.tools[0].name == "get_weather" for r in sampled)
    assert all(r.schema == tools_schema(r.tools) for r in sampled)
    events = read(result.events)
    started = events[0]["data"]
    assert started["tools"] == TOOLS and "tool_choice" not in started
    texts = [e["data"]["text"] for e in events if e["type"] == "lane.completed"]
    assert len(set(texts)) > len({e["data"]["answer"] for e in events if e["type"] == "lane.completed"})
    assert result.status == "answered" and result.answer == CANONICAL
    assert ToolCall.from_answer(result.answer) == ToolCall(
        "get_weather", {"city": "Paris", "days": 2, "unit": "c"}
    )
    code, out, err = show(tmp_path, "t", capsys)
    assert (code, err) == (0, "")
    assert 'get_weather(city="Paris", days=2, unit="c")' in out


def test_a_call_with_invalid_arguments_is_a_lane_without_answer_with_its_reason(tmp_path: Path) -> None:
    cfg = config()
    bad = '{"name": "get_weather", "arguments": {"city": "Paris", "days": "two"}}'
    backend = Seen(cfg, texts={0: bad, 1: "I would call get_weather."})
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="b", backend=backend, tools=TOOLS)
    lanes = {e["lane"]: e["data"] for e in read(result.events) if e["type"] == "lane.completed"}
    assert (
        lanes[0]["answer"] is None
        and lanes[0]["answer_error"] == "arguments.days: 'two' is not of type 'integer'"
    )
    assert lanes[1]["answer"] is None and lanes[1]["answer_error"] == "no JSON object in the text"
    assert "answer_error" not in lanes[2]
    assert result.status == "answered" and result.lanes_answered == 3
    # the result says why too, as the log does (and the record checks it against the fold)
    by_lane = {lane.lane: lane for lane in result.lanes}
    assert by_lane[0].answer_error == "arguments.days: 'two' is not of type 'integer'"
    assert by_lane[2].answer_error is None and "answer_error" not in by_lane[2].model_dump()


def test_every_lane_without_a_valid_call_is_no_answer_with_the_reason(tmp_path: Path) -> None:
    cfg = config(k=2)
    backend = Seen(cfg, texts={0: '{"name": "get_wether", "arguments": {}}', 1: "no"})
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="n", backend=backend, tools=TOOLS)
    assert result.status == "no_answer" and result.answer is None
    assert result.reason is not None and "2 of 2 completed lanes gave no answer" in result.reason
    assert "'get_wether', which is not a tool here" in result.reason


def test_a_run_that_reads_calls_needs_tools_before_anything_is_recorded(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r'extract\.method: "tool_call" reads calls of the run\'s tools'):
        lanefold.run_sync(config(), QUESTION, runs_dir=tmp_path, run_id="x")
    with pytest.raises(ConfigError, match=r"tool_choice: 'get_date' is none of"):
        lanefold.run_sync(
            config(), QUESTION, runs_dir=tmp_path, run_id="x", tools=TOOLS, tool_choice="get_date"
        )
    assert not (tmp_path / "x").exists()


def test_a_named_tool_choice_holds_the_lanes_to_that_tool(tmp_path: Path) -> None:
    cfg = config()
    backend = Seen(cfg)
    result = lanefold.run_sync(
        cfg, QUESTION, runs_dir=tmp_path, run_id="c", backend=backend, tools=TOOLS, tool_choice="get_weather"
    )
    request = next(r for r in backend.seen if r.purpose == "sample")
    assert request.tool_choice == "get_weather"
    assert json.loads(request.schema or "")["properties"]["name"] == {"const": "get_weather"}
    answers = [e["data"] for e in read(result.events) if e["type"] == "lane.completed"]
    assert all(a["answer"] is None for a in answers if '"get_time"' in a["text"])
    assert read(result.events)[0]["data"]["tool_choice"] == "get_weather"


SPLIT = {
    0: '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "unit": "c"}}',
    1: '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "f"}}',
    2: '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "unit": "f"}}',
    3: '{"name": "get_weather", "arguments": {"city": "Lyon", "days": 3, "unit": "c"}}',
    4: '{"name": "get_time", "arguments": {}}',
}


def test_field_vote_votes_each_argument_among_the_lanes_calling_the_winning_tool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config("field_vote")
    result = lanefold.run_sync(
        cfg, QUESTION, runs_dir=tmp_path, run_id="f", backend=Seen(cfg, SPLIT), tools=TOOLS
    )
    # Every whole call differs; field by field get_weather(Paris, unit tied c/f, days tied 2/3)
    assert result.answer == '{"arguments":{"city":"Paris","days":2,"unit":"c"},"name":"get_weather"}'
    assert result.winner_lane == 0
    reduce = next(e for e in read(result.events) if e["type"] == "reduce.completed")["data"]
    fields = reduce["detail"]["fields"]
    assert fields["name"]["votes"] == {'"get_weather"': 4, '"get_time"': 1}
    assert fields["arguments.city"] == {
        "votes": {'"Paris"': 3, '"Lyon"': 1},
        "missing": 0,
        "winner": '"Paris"',
    }
    assert fields["arguments.unit"]["tied"] == ['"c"', '"f"']
    assert reduce["tied"] == ["arguments.days", "arguments.unit"] and reduce["tie_break"] == "first_lane"
    assert show(tmp_path, "f", capsys)[:1] == (0,)


def test_field_vote_assembles_a_call_no_lane_made_and_names_the_nearest_lane(tmp_path: Path) -> None:
    texts = {
        0: '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "unit": "f"}}',
        1: '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "c"}}',
        2: '{"name": "get_weather", "arguments": {"city": "Lyon", "days": 2, "unit": "c"}}',
    }
    cfg = config("field_vote", k=3)
    result = lanefold.run_sync(
        cfg, QUESTION, runs_dir=tmp_path, run_id="g", backend=Seen(cfg, texts), tools=TOOLS
    )
    assert result.answer == CANONICAL  # Paris 2-1, days 2 2-1, unit c 2-1: a call no lane made
    assert result.agreement == 0.0 and result.winner_lane == 0  # lane 0 agrees on city and days


def test_field_vote_refuses_text_answers_before_the_run(tmp_path: Path) -> None:
    raw = {"loop": {"coordinator": "parallel_sample", "reducer": "field_vote"}}
    with pytest.raises(
        ConfigError, match=r"extract\.method: reducer field_vote reads answers extracted as json or"
    ):
        lanefold.run_sync(lanefold.parse_config(raw), "q", runs_dir=tmp_path)


def test_judge_argmax_shows_the_judge_the_valid_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    judge = {"template": "Question: {question}\nCandidate call: {candidate}\nScore: N/10"}
    cfg = config("judge_argmax", judge=judge)
    backend = Seen(cfg, texts={2: "not a call"})
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="j", backend=backend, tools=TOOLS)
    judged = [r for r in backend.seen if r.purpose == "judge"]
    assert all(not r.tools and r.schema is None for r in judged)  # a judge is sent no tools
    prompts = [r.prompt for r in judged]
    assert len(prompts) == 4  # the lane without a valid call is not a candidate
    assert all(re.search(r"Candidate call: get_(weather|time)\(", p) for p in prompts)
    assert result.status == "answered" and result.answer == CANONICAL
    assert show(tmp_path, "j", capsys)[:1] == (0,)


def test_any_pass_with_schema_valid_takes_the_first_valid_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config("any_pass", judge={"verifier": "schema_valid"})
    backend = Seen(cfg, texts={0: '{"name": "get_weather"}', 1: '{"name": "get_time", "arguments": {}}'})
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="s", backend=backend, tools=TOOLS)
    verdicts = {e["lane"]: e["data"] for e in read(result.events) if e["type"] == "judge.completed"}
    assert verdicts[0]["passed"] is False and verdicts[1]["passed"] is True
    assert result.winner_lane == 1 and result.answer == '{"arguments":{},"name":"get_time"}'
    assert show(tmp_path, "s", capsys)[:1] == (0,)


def test_any_pass_gives_a_verifier_the_parsed_call(tmp_path: Path) -> None:
    given: list[object] = []

    def paris_in_celsius(question: str, text: str, answer: str | None, *, call: ToolCall | None) -> bool:
        given.append(call)
        return call is not None and call.arguments.get("unit") == "c" and call.arguments["city"] == "Paris"

    cfg = config("any_pass", k=4)
    result = lanefold.run_sync(
        cfg,
        QUESTION,
        runs_dir=tmp_path,
        run_id="v",
        backend=Seen(cfg, SPLIT),
        tools=TOOLS,
        verifier=paris_in_celsius,
    )
    assert ToolCall("get_weather", {"city": "Paris", "days": 3, "unit": "f"}) in given
    assert result.winner_lane == 0


def test_schema_valid_refuses_text_answers_before_the_run(tmp_path: Path) -> None:
    raw = {
        "loop": {"coordinator": "parallel_sample", "reducer": "any_pass"},
        "judge": {"verifier": "schema_valid"},
    }
    with pytest.raises(
        ConfigError, match=r"verifier schema_valid reads answers extracted as json or tool_call"
    ):
        lanefold.run_sync(lanefold.parse_config(raw), "q", runs_dir=tmp_path)


def test_a_tool_run_cut_off_resumes_with_its_recorded_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config(k=6)
    whole = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="w", tools=TOOLS)
    path = Path(whole.events or "")
    lines = path.read_text().splitlines(keepends=True)
    landed = [i for i, line in enumerate(lines) if '"lane.completed"' in line]
    path.write_text("".join(lines[: landed[2]]))  # a crash after two lanes landed
    backend = Seen(cfg)
    resumed = lanefold.resume_sync("w", runs_dir=tmp_path, backend=backend)
    assert backend.seen and all(r.tools and r.schema for r in backend.seen)
    assert (resumed.answer, resumed.votes) == (whole.answer, whole.votes)
    assert show(tmp_path, "w", capsys)[:1] == (0,)


def test_an_edited_call_is_refused_by_every_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config()
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="e", tools=TOOLS)
    path = Path(result.events or "")
    events = read(path)
    lane = next(e for e in events if e["type"] == "lane.completed" and e["data"]["answer"] == CANONICAL)
    lane["data"]["answer"] = CANONICAL.replace("Paris", "Lyon")  # the call, edited
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, _, err = show(tmp_path, "e", capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"events.jsonl:{lane['sequence']}:" in err and "is not what the extractor finds" in err


def test_edited_tools_are_refused_where_a_call_no_longer_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config()
    backend = Seen(cfg, texts={1: WRONG[1]})  # lane 1 calls get_time
    result = lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="d", backend=backend, tools=TOOLS)
    path = Path(result.events or "")
    events = read(path)
    events[0]["data"]["tools"] = [WEATHER]  # get_time taken away: its calls no longer read
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    code, _, err = show(tmp_path, "d", capsys)
    assert code == 2 and "is not what the extractor finds" in err, err


def test_the_view_and_tail_show_calls_readably(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from starlette.testclient import TestClient

    from lanefold.execution import open_store
    from lanefold.view._app import create_app

    cfg = config()
    backend = Seen(cfg, texts={4: '{"name": "get_weather", "arguments": {"city": 7}}'})
    lanefold.run_sync(cfg, QUESTION, runs_dir=tmp_path, run_id="p", backend=backend, tools=TOOLS)
    page = html.unescape(TestClient(create_app(open_store(None, tmp_path))).get("/runs/p").text)
    assert 'get_weather(city="Paris", days=2, unit="c") (lane' in page  # the winner
    assert "no answer: arguments.city: 7 is not of type 'string'" in page  # lane 4
    assert main(["tail", "p", "--runs-dir", str(tmp_path)]) == 0
    tail = capsys.readouterr().out
    assert 'winner=get_weather(city="Paris", days=2, unit="c")' in tail
    assert "no answer: arguments.city: 7 is not of type 'string'" in tail


def test_a_history_of_calls_goes_after_the_question_and_resumes_as_recorded(tmp_path: Path) -> None:
    """A chat whose question was followed by the agent's call and its result: every sampled
    lane is sent the turns before the question, the question, then the call and the result;
    `run.started` records them (the call as an object) and a resume sends the same."""
    cfg = config(k=6)
    before = (ChatMessage("system", "Use the tools."),)
    after = (
        ChatMessage("assistant", "", (MessageToolCall("c1", "get_time", "{}"),)),
        ChatMessage("tool", "10:00", tool_call_id="c1", name="get_time"),
    )

    async def go(backend: Seen, resume: bool) -> lanefold.RunResult:
        async with lanefold.Session(cfg, backend=backend, runs_dir=tmp_path) as session:
            return await session.run(
                QUESTION, run_id="h", conversation=before, turns_after=after, tools=TOOLS, resume=resume
            )

    first = Seen(cfg)
    whole = anyio.run(go, first, False)
    (sent,) = {r.messages for r in first.seen}
    assert sent is not None and sent[:1] == before and sent[2:] == after
    assert sent[1].role == "user" and QUESTION in sent[1].content
    started = read(Path(whole.events or ""))[0]["data"]
    assert started["conversation"] == [["system", "Use the tools."]]
    assert started["turns_after"] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "name": "get_time", "arguments": "{}"}],
        },
        {"role": "tool", "content": "10:00", "tool_call_id": "c1", "name": "get_time"},
    ]
    path = Path(whole.events or "")
    lines = path.read_text().splitlines(keepends=True)
    landed = [i for i, line in enumerate(lines) if '"lane.completed"' in line]
    path.write_text("".join(lines[: landed[2]]))  # a crash after two lanes landed
    again = Seen(cfg)
    resumed = anyio.run(go, again, True)
    assert again.seen and {r.messages for r in again.seen} == {sent}
    assert (resumed.answer, resumed.votes) == (whole.answer, whole.votes)
