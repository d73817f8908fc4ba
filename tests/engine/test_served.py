"""The engine served over HTTP: `orchestrator serve`'s app in front of the engine, driven by the
`openai` backend, gives what the engine gives in-process, with the prompt prefilled once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loopback import Loopback

import lanefold
from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.serve._app import create_app

pytestmark = pytest.mark.slow


def config(
    backend: dict[str, Any], *, k: int, temperature: float, template: str, max_tokens: int
) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "seed": 11, "max_concurrency": k},
            # A few-shot completion both ways: raw text in process, /v1/completions when served.
            "prompt": {"template": template, "form": "raw"},
            "sampling": {"temperature": temperature, "max_tokens": max_tokens, "stop": ["\n"]},
            "extract": {"method": "last_number"},
            "backend": backend,
        }
    )


def lane_texts(result: lanefold.RunResult) -> dict[int, str]:
    assert result.events is not None
    events = [json.loads(line) for line in Path(result.events).read_text().splitlines()]
    return {e["lane"]: e["data"]["text"] for e in events if e["type"] == "lane.completed"}


def compare(
    tmp_path: Path,
    in_process: Engine,
    served: Engine,
    *,
    n: str,
    temperature: float,
    template: str,
    model: str,
    k: int = 8,
    max_tokens: int = 8,
) -> tuple[lanefold.RunResult, lanefold.RunResult]:
    local = lanefold.run_sync(
        config({"kind": "engine"}, k=k, temperature=temperature, template=template, max_tokens=max_tokens),
        "What is 7 + 8?",
        runs_dir=tmp_path,
        backend=EngineBackend(engine=in_process),
    )
    with Loopback(create_app(EngineBackend(engine=served), model_name=model)) as server:
        remote = lanefold.run_sync(
            config(
                {"kind": "openai", "base_url": server.base_url, "model": model, "api": "completions", "n": n},
                k=k,
                temperature=temperature,
                template=template,
                max_tokens=max_tokens,
            ),
            "What is 7 + 8?",
            runs_dir=tmp_path,
        )
    return local, remote


TEMPLATE = "Question: What is 2 + 3?\nAnswer: 5\n\nQuestion: {question}\nAnswer:"


@pytest.mark.parametrize(("n", "temperature"), [("auto", 0.0), ("never", 0.9)])
def test_served_tiny_engine_matches_in_process(
    tmp_path: Path, make_engine: Callable[..., Engine], n: str, temperature: float
) -> None:
    local, remote = compare(
        tmp_path, make_engine(), make_engine(), n=n, temperature=temperature, template=TEMPLATE, model="tiny"
    )
    assert lane_texts(remote) == lane_texts(local)
    assert (remote.answer, remote.votes) == (local.answer, local.votes)
    prompt = local.usage.prefill_tokens
    if n == "auto":  # one request of n = 8: the server prefilled the prompt once
        assert remote.usage.requests == 1
        assert remote.usage.prefill_tokens + remote.usage.cached_prefill_tokens == prompt
    else:  # one request per lane, each seeded with its own lane seed
        assert remote.usage.requests == 8


def test_served_smollm2_matches_in_process(tmp_path: Path, smollm2: Engine) -> None:
    template = (
        "Question: What is 2 + 3?\nAnswer: 5\n\nQuestion: What is 6 + 4?\nAnswer: 10\n\n"
        "Question: {question}\nAnswer:"
    )
    local, remote = compare(
        tmp_path,
        smollm2,
        smollm2,
        n="auto",
        temperature=0.0,
        template=template,
        model="smollm2",
        k=4,
        max_tokens=6,
    )
    assert lane_texts(remote) == lane_texts(local)
    assert remote.answer == local.answer == "15"
    assert remote.usage.requests == 1
    # Same engine twice: the second run's prompt blocks come from the prefix cache, and the
    # bill says so; either way the prompt is counted once for the four lanes.
    assert remote.usage.prefill_tokens + remote.usage.cached_prefill_tokens == local.usage.prefill_tokens


def test_served_engine_honours_ignore_eos(make_engine: Callable[..., Engine]) -> None:
    import httpx

    engine = make_engine()
    engine.eos_ids = frozenset(range(engine.model.args.vocab_size))  # every token ends a lane
    with Loopback(create_app(EngineBackend(engine=engine), model_name="tiny")) as server:
        body = {"prompt": "What is 7 + 8?", "n": 4, "max_tokens": 6, "temperature": 0.9}
        short = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
        body["ignore_eos"] = True
        full = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
    assert short["usage"]["completion_tokens"] == 0
    assert [c["finish_reason"] for c in full["choices"]] == ["length"] * 4
    assert full["usage"]["completion_tokens"] == 4 * 6


def sse_chunks(response: Any) -> list[dict[str, Any]]:
    """The JSON chunks of a server-sent-events answer, read as they arrive; ends with [DONE]."""
    chunks: list[dict[str, Any]] = []
    done = False
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: ") and not done
        if line == "data: [DONE]":
            done = True
        else:
            chunks.append(json.loads(line.removeprefix("data: ")))
    assert done
    return chunks


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_served_engine_streams_what_it_would_answer_whole(
    request: pytest.FixtureRequest, make_engine: Callable[..., Engine], which: str
) -> None:
    import httpx

    engine = make_engine() if which == "tiny" else request.getfixturevalue("smollm2")
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Name three colours."}],
        "n": 3,
        "max_tokens": 24,
        "temperature": 0.8,
        "seed": 7,
        "stop": ["\n\n"],
    }
    with Loopback(create_app(EngineBackend(engine=engine), model_name=which)) as server:
        url = f"{server.base_url}/chat/completions"
        # Both answers from the same cache state: a prompt read back from the prefix cache
        # prefills only its tail, whose logits round differently from a cold prefill's (within
        # the exactness tolerance, but enough to move a sampled token on some CPUs' kernels).
        httpx.post(url, json=body | {"max_tokens": 1}, timeout=120).raise_for_status()
        whole = httpx.post(url, json=body, timeout=120).json()
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url, json=body, timeout=120) as response:
            assert response.status_code == 200
            chunks = sse_chunks(response)
    texts: dict[int, str] = {}
    pieces: dict[int, int] = {}
    finish: dict[int, str] = {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            i = choice["index"]
            content = choice["delta"].get("content") or ""
            texts[i] = texts.get(i, "") + content
            pieces[i] = pieces.get(i, 0) + bool(content)
            if choice["finish_reason"]:
                finish[i] = choice["finish_reason"]
    expected = {c["index"]: c["message"]["content"] for c in whole["choices"]}
    assert texts == expected
    assert finish == {c["index"]: c["finish_reason"] for c in whole["choices"]}
    assert all(pieces[i] > 1 for i, text in expected.items() if len(text) > 8)  # step by step
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert usage["prompt_tokens"] == whole["usage"]["prompt_tokens"]


def test_a_client_hanging_up_mid_stream_aborts_the_request(make_engine: Callable[..., Engine]) -> None:
    import time

    import httpx

    engine = make_engine()
    body = {"prompt": "abc", "n": 2, "max_tokens": 500, "ignore_eos": True, "stream": True}
    with Loopback(create_app(EngineBackend(engine=engine), model_name="tiny")) as server:
        with httpx.stream("POST", f"{server.base_url}/completions", json=body, timeout=60) as response:
            for i, _ in enumerate(response.iter_lines()):
                if i == 10:
                    break  # closing the response drops the connection
        # Nobody drives the engine once the stream is gone (its abort is applied at the next
        # step anyone takes), so the step count stops well short of 500.
        time.sleep(0.5)
        steps = engine.metrics.decode_steps
        time.sleep(0.5)
        assert engine.metrics.decode_steps == steps < 100
        # The next request drops the abandoned one and runs alone.
        done = httpx.post(
            f"{server.base_url}/completions",
            timeout=60,
            json={"prompt": "abc", "max_tokens": 3, "ignore_eos": True},
        ).json()
    assert done["usage"]["completion_tokens"] == 3
    assert engine.pool.num_free == engine.pool.num_blocks


def test_served_engine_refuses_max_tokens_beyond_the_context(make_engine: Callable[..., Engine]) -> None:
    import httpx

    from lanefold.primitives import LaneRequest, SampleRequest, SamplingParams

    backend = EngineBackend(engine=make_engine())
    probe = SampleRequest("abc", SamplingParams(), (LaneRequest(0, 0, 1),))
    left = backend.context_left(probe)
    assert left is not None and left < 512
    with Loopback(create_app(backend, model_name="tiny")) as server:
        body = {"prompt": "abc", "max_tokens": left + 1, "ignore_eos": True}
        refused = httpx.post(f"{server.base_url}/completions", json=body, timeout=60)
        body["max_tokens"] = left  # exactly the context: decoded to the end
        whole = httpx.post(f"{server.base_url}/completions", json=body, timeout=120)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "context_length_exceeded"
    assert refused.json()["error"]["param"] == "max_tokens"
    assert whole.json()["usage"]["completion_tokens"] == left


def test_a_client_leaving_a_whole_request_stops_its_lanes(make_engine: Callable[..., Engine]) -> None:
    import time

    import httpx

    engine = make_engine()
    body = {"prompt": "abc", "n": 2, "max_tokens": 480, "ignore_eos": True}
    with Loopback(create_app(EngineBackend(engine=engine), model_name="tiny")) as server:
        with pytest.raises(httpx.ReadTimeout):  # not streamed: nothing comes until the end
            httpx.post(f"{server.base_url}/completions", json=body, timeout=httpx.Timeout(10, read=0.3))
        deadline = time.monotonic() + 10
        while engine.has_work() and time.monotonic() < deadline:
            time.sleep(0.05)
        steps = engine.metrics.decode_steps
        time.sleep(0.5)
        assert engine.metrics.decode_steps == steps < 480  # the lanes stopped, not finished
    assert engine.pool.num_free == engine.pool.num_blocks


TINY_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_chat_messages_reach_the_engine_through_its_chat_template(make_engine: Callable[..., Engine]) -> None:
    import httpx

    engine = make_engine()
    engine.tokenizer.chat_template = TINY_TEMPLATE
    turns = [("system", "Be terse."), ("user", "2+2?")]
    templated = engine.tokenizer.encode_chat(turns)
    assert len(templated) == len("<system>Be terse.\n<user>2+2?\n<assistant>")
    with Loopback(create_app(EngineBackend(engine=engine), model_name="tiny")) as server:
        chat = httpx.post(
            f"{server.base_url}/chat/completions",
            timeout=60,
            json={
                "messages": [{"role": r, "content": c} for r, c in turns],
                "max_tokens": 4,
                "ignore_eos": True,
                "logprobs": True,
            },
        ).json()
        raw = httpx.post(
            f"{server.base_url}/completions",
            timeout=60,
            json={"prompt": "2+2?", "max_tokens": 4, "ignore_eos": True},
        ).json()
    assert chat["usage"]["prompt_tokens"] == len(templated)
    assert raw["usage"]["prompt_tokens"] == len(engine.tokenizer.encode("2+2?"))  # as it is
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    assert all(set(c) == {"token", "logprob", "bytes", "top_logprobs"} for c in content)


def test_the_shipped_example_answers_a_chat_question(smollm2: Engine) -> None:
    import httpx

    from lanefold.backends.engine import EngineConfig
    from lanefold.config._loop_config import load_backend_config

    example = Path(__file__).resolve().parents[2] / "examples" / "serve" / "engine.toml"
    config = load_backend_config(example)
    assert isinstance(config, EngineConfig) and not config.chat_template
    backend = EngineBackend(config, engine=smollm2)
    with Loopback(create_app(backend, model_name="smollm2")) as server:
        r = httpx.post(
            f"{server.base_url}/chat/completions",
            timeout=120,
            json={
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is the capital of France?"},
                ],
                "max_tokens": 24,
                "temperature": 0,
                "logprobs": True,
            },
        )
    choice = r.json()["choices"][0]
    assert "Paris" in choice["message"]["content"]
    tokens = [c["token"] for c in choice["logprobs"]["content"]]
    assert "".join(tokens).strip() == choice["message"]["content"].strip()


CTRL_C_SCRIPT = """
import dataclasses, sys
sys.path[:0] = [{root!r}, {here!r}]
import torch
from tiny import TINY, byte_tokenizer, tiny_checkpoint
from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._model import build_model
from lanefold.serve._run import serve

torch.set_num_threads(1)
args = dataclasses.replace(TINY, max_position=8192, hidden_size=256, intermediate_size=384,
                           num_layers=4, head_dim=64)
model = build_model(tiny_checkpoint(0, args), torch.device("cpu"), torch.float32)
engine = Engine(model, num_blocks=2200, block_size=16, max_batch_lanes=8,
                tokenizer=byte_tokenizer())
serve(EngineBackend(engine=engine), model_name="tiny", port={port}, log_level="warning")
print("steps", engine.metrics.decode_steps, "free", engine.pool.num_free,
      engine.pool.num_blocks, flush=True)
"""


def test_ctrl_c_stops_the_engine_mid_request() -> None:
    """A real engine decoding 4 x 8000 tokens: Ctrl-C stops its lanes at once (they do not
    decode on), frees their KV blocks, answers the client 503 and exits 0 without a traceback."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import threading
    import time

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    code = CTRL_C_SCRIPT.format(root=os.path.dirname(os.path.dirname(here)), here=here, port=port)
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}/v1"
    answer: list[Any] = []

    def ask() -> None:
        body = {"prompt": "abc", "n": 4, "max_tokens": 8000, "ignore_eos": True}
        try:
            r = httpx.post(f"{url}/completions", json=body, timeout=120)
        except httpx.TransportError as exc:
            answer.append(repr(exc))
        else:
            answer.append((r.status_code, r.json()))

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/models", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.1)
        asker = threading.Thread(target=ask)
        asker.start()
        time.sleep(1.5)
        assert not answer  # still decoding
        proc.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - stopped
        asker.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert took < 10, took
    status, body = answer[0]
    assert (status, body["error"]["code"]) == (503, "server_shutting_down")
    _, steps, _, free, total = out.split()
    assert int(steps) < 8000  # its lanes stopped where they were
    assert free == total  # and gave their KV blocks back
