"""The loop gateway over HTTP on loopback: a request is a governed run; keys, budgets,
idempotency and hang-ups hold as the contract says (issue 26)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.config import LoopConfig, load_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import LaneOutcome, SampleRequest
from lanefold.serve._gateway import create_gateway
from lanefold.serve._gateway_wire import gateway_run_id
from lanefold.serve._keys import KeyPools, load_keys
from tests.loopback import Loopback

pytest.importorskip("starlette")

VOTE = """
[loop]
k = 8
max_concurrency = 8
seed = 7
min_quorum = 3
[prompt]
template = "Question: {question}\\nEnd with 'Answer: <number>'.\\n"
[sampling]
temperature = 0.8
max_tokens = 96
%(from_request)s
[extract]
method = "regex"
regex = 'Answer:\\s*([-0-9.,]+)'
[backend]
kind = "simulated"
accuracy = 0.55
latency_ms = [%(low)s, %(high)s]
prompt_tokens = 40
output_tokens = 60
[budget]
max_tokens = 20000
[pricing]
input_per_mtok = 0.15
cached_input_per_mtok = 0.075
output_per_mtok = 0.60
"""
ALICE, BOB = "alice-key-0123456789", "bob-key-9876543210"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def loop_file(
    folder: Path, name: str = "vote", *, low: float = 1, high: float = 5, from_request: str = ""
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    line = f"from_request = {from_request}" if from_request else ""
    path.write_text(VOTE % {"low": low, "high": high, "from_request": line})
    return path


def keys_file(folder: Path, *tables: str) -> Path:
    path = folder / "keys.toml"
    path.write_text("\n".join(tables))
    return path


def key_table(name: str, key: str, extra: str = "") -> str:
    return f'[[keys]]\nname = "{name}"\nsha256 = "{_sha(key)}"\n{extra}\n'


class Capturing(SimulatedBackend):
    """The simulated backend, keeping every request it was sent."""

    def __init__(self, config: SimulatedConfig) -> None:
        super().__init__(config)
        self.seen: list[SampleRequest] = []

    def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.seen.append(request)
        return super().sample(request)


@contextmanager
def gateway(
    tmp_path: Path,
    loops: dict[str, LoopConfig],
    *,
    keys: Path | None = None,
    backend: Any = None,
    runs: Path | None = None,
) -> Iterator[tuple[httpx.Client, Path]]:
    """The gateway app on loopback; a client for it and the runs folder."""
    runs = runs or tmp_path / "runs"
    store = open_store(None, runs)
    session = Session(store=store, backend=backend)
    parsed = load_keys(keys, loops) if keys is not None else None
    pools = KeyPools(parsed, store) if parsed is not None else None
    if pools is not None:
        pools.prepare()
    app = create_gateway(session, loops, keys=parsed, pools=pools, heartbeat_s=0.05)
    with Loopback(app) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client, runs


def chat(question: str = "What is 17 * 23?", **fields: Any) -> dict[str, Any]:
    return {"model": "vote", "messages": [{"role": "user", "content": question}], **fields}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_chat_request_is_a_run_whose_winner_and_bill_it_returns(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    backend = Capturing(SimulatedConfig(accuracy=0.55, latency_ms=(1, 5), prompt_tokens=40, output_tokens=60))
    body = {
        "model": "vote",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "What is 17 * 23?"},
        ],
    }
    with gateway(tmp_path, loops, backend=backend) as (client, runs):
        response = client.post("/chat/completions", json=body)
        assert response.status_code == 200, response.text
        got = response.json()
        run_id = response.headers["x-lanefold-run-id"]
        record = client.get(f"/runs/{run_id}").json()
        models = client.get("/models").json()
    assert [m["id"] for m in models["data"]] == ["vote"]
    assert got["lanefold"]["run_id"] == run_id == record["run_id"]
    assert got["choices"][0]["message"]["content"] == record["winner_text"]
    assert got["lanefold"]["answer"] == record["answer"]
    assert got["lanefold"]["votes"] == record["votes"]
    usage, bill = got["usage"], record["usage"]
    assert usage["prompt_tokens"] == bill["prefill_tokens"] + bill["cached_prefill_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == bill["cached_prefill_tokens"] > 0
    assert usage["completion_tokens"] == bill["decode_tokens"]
    # The run records the question, the turns before it and no key; every lane sent them all.
    state = read_state(open_store(None, runs), run_id)
    assert state.started is not None
    assert state.started.question == "What is 17 * 23?"
    assert state.started.conversation == [
        ("system", "You are terse."),
        ("user", "Hello"),
        ("assistant", "Hi."),
    ]
    assert backend.seen
    for request in backend.seen:
        assert request.messages is not None
        assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
        assert request.messages[-1].content == request.prompt
        assert "What is 17 * 23?" in request.prompt


def test_a_completion_and_n_distinct_answers(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    with gateway(tmp_path, loops) as (client, _):
        response = client.post("/completions", json={"model": "vote", "prompt": "What is 17 * 23?", "n": 3})
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["object"] == "text_completion"
    answers = [c["text"].rsplit("Answer:", 1)[-1].strip() for c in got["choices"]]
    assert answers[0] == got["lanefold"]["answer"]
    assert len(set(answers)) == len(answers) == min(3, len(got["lanefold"]["votes"]))
    votes = got["lanefold"]["votes"]
    assert [votes[a] for a in answers] == sorted((votes[a] for a in answers), reverse=True)


def test_max_tokens_caps_the_loop_and_temperature_passes_only_where_allowed(tmp_path: Path) -> None:
    loops = {
        "vote": load_config(loop_file(tmp_path / "a")),
        "free": load_config(loop_file(tmp_path / "b", "free", from_request='["temperature"]')),
    }
    with gateway(tmp_path, loops) as (client, runs):
        capped = client.post("/chat/completions", json=chat(max_tokens=20, temperature=0.1))
        free = client.post("/chat/completions", json={**chat(temperature=0.1), "model": "free"})
        over = client.post("/chat/completions", json=chat(max_completion_tokens=500))
    store = open_store(None, runs)

    def sampling(response: httpx.Response) -> dict[str, Any]:
        state = read_state(store, response.headers["x-lanefold-run-id"])
        assert state.started is not None
        return dict(state.started.config["sampling"])

    assert sampling(capped)["max_tokens"] == 20
    assert sampling(capped)["temperature"] == 0.8  # the loop's: the request's is ignored
    assert sampling(free)["temperature"] == 0.1
    assert sampling(over)["max_tokens"] == 96  # a cap never raises the loop's ceiling


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": [{"type": "function", "function": {"name": "f f"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "g"}, "tool_choice"),
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "grammar"}}, "response_format.type"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
        ({"n": 0}, "n"),
        ({"max_tokens": "many"}, "max_tokens"),
    ],
)
def test_an_unsupported_or_bad_field_is_a_400_naming_it(
    tmp_path: Path, fields: dict[str, Any], param: str
) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    with gateway(tmp_path, loops) as (client, runs):
        response = client.post("/chat/completions", json=chat(**fields))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param
    assert error["message"].startswith(param)
    assert not runs.exists() or not any(runs.iterdir())  # nothing recorded for a refused request


def test_an_unknown_model_is_404_and_the_last_turn_must_be_the_users(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    with gateway(tmp_path, loops) as (client, _):
        unknown = client.post("/chat/completions", json={**chat(), "model": "nope"})
        ending = client.post(
            "/chat/completions",
            json={
                "model": "vote",
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            },
        )
        missing = client.get("/runs/no-such-run")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert ending.status_code == 400 and ending.json()["error"]["param"] == "messages"
    assert missing.status_code == 404


def test_keys_401_404_and_a_key_sees_only_its_own_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loops = {
        "vote": load_config(loop_file(tmp_path / "a")),
        "other": load_config(loop_file(tmp_path / "b", "other")),
    }
    keys = keys_file(tmp_path, key_table("alice", ALICE), key_table("bob", BOB, 'loops = ["other"]'))
    with gateway(tmp_path, loops, keys=keys) as (client, runs):
        none = client.post("/chat/completions", json=chat())
        wrong = client.post("/chat/completions", json=chat(), headers=bearer("not-a-key"))
        mine = client.post("/chat/completions", json=chat(), headers=bearer(ALICE))
        not_bobs = client.post("/chat/completions", json=chat(), headers=bearer(BOB))
        run_id = mine.headers["x-lanefold-run-id"]
        own = client.get(f"/runs/{run_id}", headers=bearer(ALICE))
        others = client.get(f"/runs/{run_id}", headers=bearer(BOB))
        bobs_models = client.get("/models", headers=bearer(BOB)).json()
    assert none.status_code == wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"
    assert mine.status_code == 200
    assert not_bobs.status_code == 404  # bob may call "other" only
    assert own.status_code == 200 and own.json()["run_id"] == run_id
    assert others.status_code == 404
    assert [m["id"] for m in bobs_models["data"]] == ["other"]
    state = read_state(open_store(None, runs), run_id)
    assert state.started is not None and state.started.caller == "alice"
    # The key itself is nowhere: not in the record, not in a response, not in a log line.
    for path in runs.rglob("*"):
        if path.is_file():
            assert ALICE.encode() not in path.read_bytes()
    assert ALICE not in mine.text and ALICE not in caplog.text


def test_a_keys_budget_is_never_overspent_and_a_restart_does_not_reset_it(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    keys = keys_file(tmp_path, key_table("alice", ALICE, "budget = {max_tokens = 1800}"))
    statuses = []
    with gateway(tmp_path, loops, keys=keys) as (client, runs):
        for _ in range(6):
            response = client.post("/chat/completions", json=chat(), headers=bearer(ALICE))
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert response.json()["error"]["code"] == "insufficient_quota"
                assert response.json()["error"]["type"] == "insufficient_quota"
    assert statuses[:3] == [200, 200, 200] and 429 in statuses
    store = open_store(None, runs)
    spent = sum(read_state(store, s.run_id).spend.tokens for s in store.list_runs())
    assert spent <= 1800
    # A fresh gateway on the same store folds what the key spent: still out of budget.
    with gateway(tmp_path, loops, keys=keys, runs=runs) as (client, _):
        again = client.post("/chat/completions", json=chat(), headers=bearer(ALICE))
    assert again.status_code == 429
    assert sum(read_state(store, s.run_id).spend.tokens for s in store.list_runs()) == spent


def test_a_key_past_its_concurrency_gets_429(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops", low=300, high=400))}
    keys = keys_file(tmp_path, key_table("alice", ALICE, "max_concurrency = 1"))
    with gateway(tmp_path, loops, keys=keys) as (client, _):
        first: list[httpx.Response] = []
        slow = threading.Thread(
            target=lambda: first.append(client.post("/chat/completions", json=chat(), headers=bearer(ALICE)))
        )
        slow.start()
        time.sleep(0.15)
        second = client.post("/chat/completions", json=chat(), headers=bearer(ALICE))
        slow.join()
        third = client.post("/chat/completions", json=chat(), headers=bearer(ALICE))
    assert first[0].status_code == 200
    assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
    assert third.status_code == 200  # the slot came back


def test_an_idempotent_retry_returns_the_record_without_sampling(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    backend = Capturing(SimulatedConfig(accuracy=0.55, latency_ms=(1, 5)))
    keys = keys_file(tmp_path, key_table("alice", ALICE))
    headers = {**bearer(ALICE), "Idempotency-Key": "order-42"}
    with gateway(tmp_path, loops, keys=keys, backend=backend) as (client, _):
        first = client.post("/chat/completions", json=chat(), headers=headers)
        calls = len(backend.seen)
        again = client.post("/chat/completions", json=chat(), headers=headers)
        streamed = client.post("/chat/completions", json=chat(stream=True), headers=headers)
        other = client.post("/chat/completions", json=chat("What is 2 + 2?"), headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.headers["x-lanefold-run-id"] == gateway_run_id(_sha(ALICE), "order-42")
    assert again.json()["choices"] == first.json()["choices"]
    assert again.json()["usage"] == first.json()["usage"]
    assert len(backend.seen) == calls  # nothing sampled again
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"


def test_a_retry_while_the_run_is_live_gets_409(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops", low=300, high=400))}
    headers = {"Idempotency-Key": "live"}
    with gateway(tmp_path, loops) as (client, _):
        first: list[httpx.Response] = []
        slow = threading.Thread(
            target=lambda: first.append(client.post("/chat/completions", json=chat(), headers=headers))
        )
        slow.start()
        time.sleep(0.15)
        live = client.post("/chat/completions", json=chat(), headers=headers)
        slow.join()
    assert first[0].status_code == 200
    assert live.status_code == 409 and live.json()["error"]["code"] == "idempotency_key_in_use"


def test_a_client_that_hangs_up_interrupts_its_run_and_a_retry_resumes_it(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops", low=50, high=1500))}
    backend = Capturing(SimulatedConfig(accuracy=0.55, latency_ms=(50, 1500)))
    headers = {"Idempotency-Key": "hang-up"}
    with gateway(tmp_path, loops, backend=backend) as (client, runs):
        landed = 0
        with client.stream("POST", "/chat/completions", json=chat(stream=True), headers=headers) as response:
            run_id = response.headers["x-lanefold-run-id"]
            for line in response.iter_lines():
                landed += line.startswith(": lane")
                if landed == 2:
                    break  # hang up with lanes still running
        store = open_store(None, runs)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not read_state(store, run_id).interrupted:
            time.sleep(0.02)
        state = read_state(store, run_id)
        assert state.interrupted and state.result is None
        done_before = {
            lane for wave in state.waves.values() for lane, s in wave.lanes.items() if s.status == "completed"
        }
        assert len(done_before) >= 2
        calls = len(backend.seen)
        retry = client.post("/chat/completions", json=chat(), headers=headers)
        # The interruption is recorded before the run lets go of its log: a retry that comes
        # in between is told 409 with Retry-After, and retries as told.
        while retry.status_code == 409 and time.monotonic() < deadline:
            time.sleep(0.05)
            retry = client.post("/chat/completions", json=chat(), headers=headers)
    assert retry.status_code == 200, retry.text
    assert retry.json()["lanefold"]["run_id"] == run_id and retry.json()["lanefold"]["resumes"] == 1
    resent = {lane.lane for request in backend.seen[calls:] for lane in request.lanes}
    assert resent.isdisjoint(done_before)  # no completed lane dispatched twice
    final = read_state(open_store(None, runs), run_id)
    assert final.result is not None


def test_the_stream_sends_the_role_at_once_a_comment_per_lane_then_the_answer(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    with gateway(tmp_path, loops) as (client, _):
        with client.stream("POST", "/chat/completions", json=chat(stream=True)) as response:
            lines = [line for line in response.iter_lines() if line]
        whole = client.post("/chat/completions", json=chat()).json()
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert data[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(line.startswith(": lane") for line in lines) == 8
    first_comment = next(i for i, line in enumerate(lines) if line.startswith(":"))
    first_content = next(
        i for i, line in enumerate(lines) if '"content": "' in line and '"content": ""' not in line
    )
    assert first_comment < first_content
    text = "".join(d["choices"][0]["delta"].get("content", "") for d in data if d["choices"])
    assert text.endswith(whole["lanefold"]["answer"])
    assert data[-1]["choices"] == [] and data[-1]["usage"]["total_tokens"] > 0
    assert lines[-1] == "data: [DONE]"


def test_a_chat_of_one_turn_goes_through_the_chat_template_and_a_completion_does_not(tmp_path: Path) -> None:
    loops = {"vote": load_config(loop_file(tmp_path / "loops"))}
    backend = Capturing(SimulatedConfig(latency_ms=(0, 1)))
    with gateway(tmp_path, loops, backend=backend) as (client, runs):
        client.post("/chat/completions", json=chat())
        chats = list(backend.seen)
        client.post("/completions", json={"model": "vote", "prompt": "What is 17 * 23?"})
        completions = backend.seen[len(chats) :]
    assert chats and all(r.messages is not None and [m.role for m in r.messages] == ["user"] for r in chats)
    assert completions and all(r.messages is None for r in completions)
    states = [read_state(open_store(None, runs), s.run_id) for s in open_store(None, runs).list_runs()]
    assert sorted(repr(s.started.conversation) for s in states if s.started) == ["None", "[]"]
    # The completion's run records the form it sent (OpenAI's raw text), so a resume sends it too.
    forms = {repr(s.started.conversation): s.started.config["prompt"]["form"] for s in states if s.started}
    assert forms == {"None": "raw", "[]": "auto"}
