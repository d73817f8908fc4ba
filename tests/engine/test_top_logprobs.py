"""The engine's alternatives: the most likely tokens at each output position, from the
distribution the sampled token's logprob comes from, carried on Sample and served in OpenAI's
shapes; asking for them changes no draw, and a request that does not ask gets none."""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio
import pytest
from loopback import Loopback

from lanefold.backends.engine import EngineBackend, EngineConfig
from lanefold.backends.engine._engine import Engine
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams, sample_all
from lanefold.serve._app import create_app

pytestmark = pytest.mark.anyio

PROMPT = "The quick brown fox jumps over the lazy dog. "


def request(temperature: float, top: int, *, k: int = 3, logprobs: bool = True) -> SampleRequest:
    params = SamplingParams(temperature=temperature, max_tokens=10, logprobs=logprobs, top_logprobs=top)
    return SampleRequest(PROMPT, params, tuple(LaneRequest(i, 500 + i, 10) for i in range(k)))


async def samples_of(backend: EngineBackend, req: SampleRequest) -> list[Sample]:
    out = await sample_all(backend, req)
    assert all(isinstance(s, Sample) for s in out)
    return [s for s in out if isinstance(s, Sample)]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
async def test_alternatives_beside_each_token_change_no_draw(
    make_engine: Callable[..., Engine], temperature: float
) -> None:
    backend = EngineBackend(EngineConfig(block_size=16), engine=make_engine())
    plain = await samples_of(backend, request(temperature, 0))
    with_top = await samples_of(backend, request(temperature, 4))
    await backend.aclose()
    assert all(s.top_logprobs is None for s in plain)
    for p, s in zip(plain, with_top, strict=True):
        assert (s.text, s.tokens) == (p.text, p.tokens)
        assert s.logprobs == pytest.approx(p.logprobs, abs=1e-5)  # (the prompt now cached)
        assert s.top_logprobs is not None and s.logprobs is not None and s.tokens is not None
        assert len(s.top_logprobs) == len(s.logprobs) == 10
        for token, value, step in zip(s.tokens, s.logprobs, s.top_logprobs, strict=True):
            assert len(step) == 4
            values = [lp for _, lp in step]
            assert values == sorted(values, reverse=True)
            assert sum(math.exp(lp) for lp in values) <= 1 + 1e-5
            assert value <= values[0] + 1e-6  # nothing is likelier than the likeliest
            if temperature == 0.0:
                assert step[0] == (token, pytest.approx(value, abs=1e-6))


async def test_lanes_of_one_batch_asking_for_different_numbers_get_theirs(
    make_engine: Callable[..., Engine],
) -> None:
    backend = EngineBackend(EngineConfig(block_size=16), engine=make_engine())
    async with anyio.create_task_group() as group:
        results: dict[int, list[Sample]] = {}

        async def run(top: int) -> None:
            results[top] = await samples_of(backend, request(0.9, top, k=2))

        for top in (0, 1, 5):
            group.start_soon(run, top)
    await backend.aclose()
    assert all(s.top_logprobs is None for s in results[0])
    for top in (1, 5):
        assert all(
            s.top_logprobs is not None and {len(step) for step in s.top_logprobs} == {top}
            for s in results[top]
        )
    # the same lanes alone: one row's alternatives do not depend on its batch
    alone = EngineBackend(EngineConfig(block_size=16), engine=make_engine())
    by_itself = await samples_of(alone, request(0.9, 5, k=2))
    await alone.aclose()
    for a, b in zip(results[5], by_itself, strict=True):
        assert a.text == b.text
        assert a.top_logprobs is not None and b.top_logprobs is not None
        for x, y in zip(a.top_logprobs, b.top_logprobs, strict=True):
            assert [t for t, _ in x] == [t for t, _ in y]
            assert [v for _, v in x] == pytest.approx([v for _, v in y], abs=1e-5)


async def test_alternatives_need_logprobs(make_engine: Callable[..., Engine]) -> None:
    backend = EngineBackend(EngineConfig(block_size=16), engine=make_engine())
    (sample, *_) = await samples_of(backend, request(0.9, 3, logprobs=False))
    await backend.aclose()
    assert (sample.logprobs, sample.tokens, sample.top_logprobs) == (None, None, None)


@pytest.mark.slow
def test_the_served_engine_answers_alternatives_in_openais_shapes(make_engine: Callable[..., Engine]) -> None:
    import httpx

    engine = make_engine()
    with Loopback(create_app(EngineBackend(engine=engine), model_name="tiny")) as server:
        completion = httpx.post(
            f"{server.base_url}/completions",
            timeout=60,
            json={"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "seed": 3, "logprobs": 5},
        ).json()
        chat = httpx.post(
            f"{server.base_url}/chat/completions",
            timeout=60,
            json={
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": 6,
                "seed": 3,
                "temperature": 0.8,
                "logprobs": True,
                "top_logprobs": 20,
            },
        ).json()
    lp = completion["choices"][0]["logprobs"]
    assert len(lp["top_logprobs"]) == len(lp["tokens"]) == 6
    for token, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        # The 5 likeliest, and the sampled token where it is not one of them; fewer where two
        # ids decode to one text (bytes of a character cut in two), the likelier kept.
        assert 1 <= len(top) <= 6
        assert top[token] >= value - 1e-6
        likeliest = list(top.values())[:-1]
        assert likeliest == sorted(likeliest, reverse=True)
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        assert len(entry["top_logprobs"]) == 20
        assert all(set(alt) == {"token", "logprob", "bytes"} for alt in entry["top_logprobs"])
        assert all(alt["bytes"] == list(alt["token"].encode()) for alt in entry["top_logprobs"])
        values = [alt["logprob"] for alt in entry["top_logprobs"]]
        assert values == sorted(values, reverse=True) and entry["logprob"] <= values[0] + 1e-6
