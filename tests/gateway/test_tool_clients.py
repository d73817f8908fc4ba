"""Tools and structured answers through the loop gateway (issue 40), driven by the clients agent
code uses: the OpenAI SDK (`tools`, `beta.chat.completions.parse`), LangChain (`bind_tools`,
`with_structured_output`), LangGraph's `create_react_agent` and DSPy's JSON adapter, over
loopback against `serve --loops`'s app on the simulated backend, taught by its settings to
answer with calls (and, once tools' results are in the history, in prose)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from loopback import Loopback
from pydantic import BaseModel

from lanefold.execution import Session, Store, open_store, read_state
from lanefold.primitives import canonical_json
from lanefold.serve import loop_configs
from lanefold.serve._gateway import create_gateway

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
# Five lanes, four of which call get_weather for Paris, each spelled its own way (vary_json);
# after one tool result every lane calls get_time, after two it answers in prose.
AGENT_LOOP = f"""
[loop]
k = 5
seed = 2
[prompt]
template = "{{question}}"
[sampling]
max_tokens = 64
[backend]
kind = "simulated"
latency_ms = [1, 3]
answer = '{WEATHER}'
distractors = ['{{"name": "get_weather", "arguments": {{"city": "Lyon", "days": 2}}}}']
accuracy = 0.7
vary_json = true
after_tool_results = [
  '{{"name": "get_time", "arguments": {{"city": "Paris"}}}}',
  "Sunny in Paris, 10:00 there.",
]
"""
# Answers a request held to a schema with a JSON value, spelled per lane.
VALUE_LOOP = """
[loop]
k = 4
seed = 5
[prompt]
template = "{question}"
[sampling]
max_tokens = 64
[backend]
kind = "simulated"
latency_ms = [1, 3]
answer = '{"city": "Paris", "days": 2}'
distractors = ['{"city": "Paris", "days": 3}']
accuracy = 0.75
vary_json = true
"""
# Calls the one tool LangChain's `with_structured_output(method="function_calling")` binds.
FORM_LOOP = VALUE_LOOP.replace(
    """answer = '{"city": "Paris", "days": 2}'""",
    """answer = '{"name": "Weather", "arguments": {"city": "Paris", "days": 2}}'""",
).replace(
    """distractors = ['{"city": "Paris", "days": 3}']""",
    """distractors = ['{"name": "Weather", "arguments": {"city": "Paris", "days": "two"}}']""",
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
ASK = [{"role": "user", "content": "Weather in Paris for two days, and the time there?"}]


class Weather(BaseModel):
    city: str
    days: int


class Served:
    """A gateway on loopback over `agent` and `value`, and the store its runs land in."""

    def __init__(self, base_url: str, store: Store) -> None:
        self.base_url, self.store = base_url, store
        self.client = openai.OpenAI(base_url=base_url, api_key="sk-none", max_retries=0, timeout=30)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    folder = tmp_path / "loops"
    folder.mkdir()
    (folder / "agent.toml").write_text(AGENT_LOOP)
    (folder / "value.toml").write_text(VALUE_LOOP)
    (folder / "form.toml").write_text(FORM_LOOP)
    # a loop served under a model name LiteLLM's catalog knows takes a JSON schema, as DSPy asks
    (folder / "gpt-4o-mini.toml").write_text(VALUE_LOOP)
    store = open_store(None, tmp_path / "runs")
    session = Session(store=store)
    try:
        with Loopback(create_gateway(session, loop_configs(folder))) as server:
            s = Served(server.base_url, store)
            try:
                yield s
            finally:
                s.client.close()
    finally:
        anyio.run(session.aclose)


def _run_id(reply: Any) -> str:
    return str(reply.id).removeprefix("chatcmpl-")


# --- the OpenAI SDK -----------------------------------------------------------------------------


def test_openai_tools_the_winning_call_comes_back_as_tool_calls(served: Served) -> None:
    reply = served.client.chat.completions.create(
        model="agent",
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
    )
    (choice,) = reply.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 2}  # type: ignore[union-attr]
    # the votes are keyed by the canonical call: the lanes' spellings voted as one
    extra: dict[str, Any] = reply.model_extra or {}
    votes = extra["lanefold"]["votes"]
    assert votes[canonical_json(json.loads(WEATHER))] == 4 and sum(votes.values()) == 5
    started = read_state(served.store, _run_id(reply)).started
    assert started is not None and [t["function"]["name"] for t in started.tools or []] == [
        "get_weather",
        "get_time",
    ]
    assert started.tool_choice == "required" and started.config["extract"]["method"] == "tool_call"

    # n: the top distinct calls, the winner first
    two = served.client.chat.completions.create(
        model="agent",
        messages=ASK,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        n=2,
    )
    cities = [json.loads(c.message.tool_calls[0].function.arguments)["city"] for c in two.choices]  # type: ignore[index, union-attr]
    assert cities == ["Paris", "Lyon"] and {c.finish_reason for c in two.choices} == {"tool_calls"}


def test_openai_tools_streamed_as_the_sdk_assembles_them(served: Served) -> None:
    kwargs: dict[str, Any] = {"model": "agent", "messages": ASK, "tools": TOOLS, "tool_choice": "required"}
    whole = served.client.chat.completions.create(**kwargs)
    with served.client.beta.chat.completions.stream(**kwargs) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    (call,) = final.choices[0].message.tool_calls or []
    (expected,) = whole.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == (
        expected.function.name,
        expected.function.arguments,
    )  # type: ignore[union-attr]


def test_openai_parse_with_a_pydantic_model(served: Served) -> None:
    reply = served.client.beta.chat.completions.parse(
        model="value",
        messages=[{"role": "user", "content": "The forecast's city and days, as JSON."}],
        response_format=Weather,
    )
    parsed = reply.choices[0].message.parsed
    assert parsed == Weather(city="Paris", days=2)
    assert reply.choices[0].message.content == '{"city":"Paris","days":2}'  # the canonical value
    started = read_state(served.store, _run_id(reply)).started
    assert started is not None and started.config["extract"]["method"] == "json"
    assert set(json.loads(started.config["extract"]["schema"])["properties"]) == {"city", "days"}
    assert json.loads(started.config["extract"]["schema"])["required"] == ["city", "days"]


def test_a_history_of_calls_and_results_reaches_the_lanes_and_the_record(served: Served) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    reply = served.client.chat.completions.create(model="agent", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"  # type: ignore[union-attr]
    started = read_state(served.store, _run_id(reply)).started
    assert started is not None and started.question == ASK[0]["content"]
    assert started.conversation == [] and started.turns_after is not None
    made, result = started.turns_after
    assert not isinstance(made, tuple) and made.tool_calls is not None
    assert (made.role, made.tool_calls[0].name, made.tool_calls[0].arguments) == (
        "assistant",
        "get_weather",
        '{"city":"Paris"}',
    )
    assert not isinstance(result, tuple) and (result.role, result.tool_call_id, result.content) == (
        "tool",
        "c1",
        "sunny",
    )


# --- LangChain and LangGraph ------------------------------------------------------------------------


def test_langchain_bind_tools_and_with_structured_output(served: Served) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str, days: int = 1) -> str:
        """The weather in a city."""
        return "sunny"

    chat = langchain_openai.ChatOpenAI(
        base_url=served.base_url, api_key="sk-none", model="agent", max_retries=0
    )
    reply = chat.bind_tools([get_weather], tool_choice="get_weather").invoke(ASK[0]["content"])
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]

    value = langchain_openai.ChatOpenAI(
        base_url=served.base_url, api_key="sk-none", model="value", max_retries=0
    )
    for method in ("json_schema", "json_mode"):  # response_format: the lanes' JSON values voted
        got = value.with_structured_output(Weather, method=method).invoke("The forecast, as JSON.")
        assert isinstance(got, Weather) and got == Weather(city="Paris", days=2)
    # a call of the one tool bound, its arguments validated; a lane's "two" days is no answer
    form = langchain_openai.ChatOpenAI(
        base_url=served.base_url, api_key="sk-none", model="form", max_retries=0
    )
    got = form.with_structured_output(Weather, method="function_calling").invoke("Paris for two days?")
    assert isinstance(got, Weather) and got == Weather(city="Paris", days=2)


# The issue names LangGraph's prebuilt ReAct agent; LangGraph 1.x warns that it moved to the
# `langchain` package (not a dependency here), and it still is what agent code runs.
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_langgraph_react_agent_completes_a_two_tool_task(served: Served) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    prebuilt = pytest.importorskip("langgraph.prebuilt")
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool

    called: list[tuple[str, dict[str, Any]]] = []

    @tool
    def get_weather(city: str, days: int = 1) -> str:
        """The weather in a city."""
        called.append(("get_weather", {"city": city, "days": days}))
        return f"sunny in {city} for {days} days"

    @tool
    def get_time(city: str) -> str:
        """The time in a city."""
        called.append(("get_time", {"city": city}))
        return "10:00"

    chat = langchain_openai.ChatOpenAI(
        base_url=served.base_url, api_key="sk-none", model="agent", max_retries=0
    )
    agent = prebuilt.create_react_agent(chat, [get_weather, get_time])
    state = agent.invoke({"messages": [("user", ASK[0]["content"])]})
    assert called == [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"city": "Paris"})]
    messages = state["messages"]
    assert [type(m).__name__ for m in messages] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert isinstance(messages[2], ToolMessage) and messages[2].content == "sunny in Paris for 2 days"
    final = messages[-1]
    assert (
        isinstance(final, AIMessage)
        and final.content == "Sunny in Paris, 10:00 there."
        and not final.tool_calls
    )
    # three runs, each a loop of five lanes; the last one's history holds both calls and results
    runs = served.store.list_runs()
    assert len(runs) == 3 and all(r.lanes == 5 for r in runs)
    last = read_state(served.store, final.response_metadata["id"].removeprefix("chatcmpl-")).started
    assert last is not None and [t.role for t in last.turns_after or [] if not isinstance(t, tuple)] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]


# --- DSPy ---------------------------------------------------------------------------------------------


def test_dspy_typed_signature_through_its_json_adapter(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    dspy = pytest.importorskip("dspy")

    class Forecast(dspy.Signature):  # type: ignore[misc]
        """The forecast asked for."""

        question: str = dspy.InputField()
        city: str = dspy.OutputField()
        days: int = dspy.OutputField()

    lm = dspy.LM(
        "openai/gpt-4o-mini", api_base=served.base_url, api_key="sk-none", cache=False, num_retries=0
    )
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        prediction = dspy.Predict(Forecast)(question="Paris for two days?")
    assert (prediction.city, prediction.days) == ("Paris", 2)
    (summary,) = served.store.list_runs()
    started = read_state(served.store, summary.run_id).started
    assert started is not None and started.config["extract"]["method"] == "json"
    assert set(json.loads(started.config["extract"]["schema"])["properties"]) == {"city", "days"}
