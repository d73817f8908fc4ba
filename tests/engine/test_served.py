"""The engine served over HTTP: `orchestrator serve`'s app in front of the engine, driven by the
`openai` backend, gives what the engine gives in-process, with the prompt prefilled once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from loopback import Loopback

import orchestrator
from backends.engine import EngineBackend
from backends.engine._engine import Engine
from orchestrator._serve import create_app

pytestmark = pytest.mark.slow


def config(backend: dict[str, Any], *, k: int, temperature: float, template: str,
           max_tokens: int) -> orchestrator.LoopConfig:
    return orchestrator.parse_config({
        "loop": {"k": k, "seed": 11, "max_concurrency": k},
        "prompt": {"template": template},
        "sampling": {"temperature": temperature, "max_tokens": max_tokens, "stop": ["\n"]},
        "extract": {"method": "last_number"},
        "backend": backend,
    })


def lane_texts(result: orchestrator.RunResult) -> dict[int, str]:
    assert result.events is not None
    events = [json.loads(line) for line in Path(result.events).read_text().splitlines()]
    return {e["lane"]: e["data"]["text"] for e in events if e["type"] == "lane.completed"}


def compare(tmp_path: Path, in_process: Engine, served: Engine, *, n: str, temperature: float,
            template: str, model: str, k: int = 8, max_tokens: int = 8) -> tuple[
                orchestrator.RunResult, orchestrator.RunResult]:
    local = orchestrator.run_sync(
        config({"kind": "engine"}, k=k, temperature=temperature, template=template,
               max_tokens=max_tokens),
        "What is 7 + 8?", runs_dir=tmp_path, backend=EngineBackend(engine=in_process))
    with Loopback(create_app(EngineBackend(engine=served), model_name=model)) as server:
        remote = orchestrator.run_sync(
            config({"kind": "openai", "base_url": server.base_url, "model": model,
                    "api": "completions", "n": n}, k=k, temperature=temperature,
                   template=template, max_tokens=max_tokens),
            "What is 7 + 8?", runs_dir=tmp_path)
    return local, remote


TEMPLATE = "Question: What is 2 + 3?\nAnswer: 5\n\nQuestion: {question}\nAnswer:"


@pytest.mark.parametrize(("n", "temperature"), [("auto", 0.0), ("never", 0.9)])
def test_served_tiny_engine_matches_in_process(
        tmp_path: Path, make_engine: Callable[..., Engine], n: str, temperature: float) -> None:
    local, remote = compare(tmp_path, make_engine(), make_engine(), n=n, temperature=temperature,
                            template=TEMPLATE, model="tiny")
    assert lane_texts(remote) == lane_texts(local)
    assert (remote.answer, remote.votes) == (local.answer, local.votes)
    prompt = local.usage.prefill_tokens
    if n == "auto":  # one request of n = 8: the server prefilled the prompt once
        assert remote.usage.requests == 1
        assert remote.usage.prefill_tokens + remote.usage.cached_prefill_tokens == prompt
    else:  # one request per lane, each seeded with its own lane seed
        assert remote.usage.requests == 8


def test_served_smollm2_matches_in_process(tmp_path: Path, smollm2: Engine) -> None:
    template = ("Question: What is 2 + 3?\nAnswer: 5\n\nQuestion: What is 6 + 4?\nAnswer: 10\n\n"
                "Question: {question}\nAnswer:")
    local, remote = compare(tmp_path, smollm2, smollm2, n="auto", temperature=0.0,
                            template=template, model="smollm2", k=4, max_tokens=6)
    assert lane_texts(remote) == lane_texts(local)
    assert remote.answer == local.answer == "15"
    assert remote.usage.requests == 1
    # Same engine twice: the second run's prompt blocks come from the prefix cache, and the
    # bill says so; either way the prompt is counted once for the four lanes.
    assert (remote.usage.prefill_tokens + remote.usage.cached_prefill_tokens
            == local.usage.prefill_tokens)


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
