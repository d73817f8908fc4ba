"""`EngineBackend` through anyio: per-lane usage, shared batching, cancellation, lazy torch."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from backends.engine import EngineBackend, EngineConfig
from backends.engine._backend import settled_text
from backends.engine._engine import Engine
from primitives import (
    Backend,
    BackendError,
    ContextLengthError,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    StreamingBackend,
    TextDelta,
)

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2  # 90 byte tokens


def request(
    k: int, *, prompt: str = PROMPT, max_tokens: int = 12, share: bool = True
) -> SampleRequest:
    return SampleRequest(
        prompt=prompt,
        params=SamplingParams(temperature=0.9, max_tokens=max_tokens, logprobs=True),
        lanes=tuple(LaneRequest(i, 1000 + i, max_tokens) for i in range(k)),
        share_prefix=share,
    )


def test_the_package_imports_no_torch_and_exports_exactly_its_names() -> None:
    code = (
        "import sys, backends.engine as e; assert 'torch' not in sys.modules, 'torch imported'; "
        "assert e.__all__ == ('EngineBackend', 'EngineConfig'); e.EngineConfig(); "
        "assert 'torch' not in sys.modules; e.EngineBackend; assert 'torch' in sys.modules"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


@pytest.mark.anyio
async def test_sample_prefills_the_prompt_once_and_bills_each_lane(
    make_engine: Callable[..., Engine],
) -> None:
    backend = EngineBackend(EngineConfig(block_size=16), engine=make_engine())
    assert isinstance(backend, Backend)
    prompt_tokens = backend.count_prompt_tokens(PROMPT)
    assert prompt_tokens == 90
    samples = await backend.sample(request(8))
    assert all(isinstance(s, Sample) for s in samples)
    assert [s.lane for s in samples if isinstance(s, Sample)] == list(range(8))
    usages = [s.usage for s in samples if isinstance(s, Sample)]
    assert (usages[0].input_tokens, usages[0].cached_input_tokens) == (90, 0)
    assert all((u.input_tokens, u.cached_input_tokens) == (0, 90) for u in usages[1:])
    total = sum(usages[1:], usages[0])
    assert total.input_tokens == prompt_tokens  # prefilled once
    assert total.output_tokens == 8 * 12
    assert all(u.kv_token_seconds > 0 for u in usages)
    extra = samples[0].extra if isinstance(samples[0], Sample) else {}
    assert extra["cow_block_copies"] == 7 and extra["prompt_tokens_cached"] == 0
    # 6 prompt blocks (the 6th partial), 7 copies of it, then each lane crosses into one more
    assert extra["peak_kv_blocks"] == 6 + 7 + 8
    assert all(
        isinstance(s, Sample) and s.logprobs is not None and len(s.logprobs) == 12 for s in samples
    )

    again = await backend.sample(request(2))  # the prompt's full blocks now come from the cache
    first = again[0]
    assert isinstance(first, Sample)
    assert (first.usage.input_tokens, first.usage.cached_input_tokens) == (90 - 80, 80)
    unshared = await backend.sample(request(3, share=False))
    assert sum(s.usage.input_tokens for s in unshared if isinstance(s, Sample)) == 3 * 10
    await backend.aclose()


@pytest.mark.anyio
async def test_concurrent_samples_share_decode_steps_and_match_running_alone(
    make_engine: Callable[..., Engine],
) -> None:
    alone_backend = EngineBackend(engine=make_engine())
    alone = [await alone_backend.sample(request(4, prompt=p)) for p in ("abc " * 9, "xyz " * 5)]
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    results: dict[int, list[Sample]] = {}

    async def run(i: int, prompt: str) -> None:
        results[i] = list(await backend.sample(request(4, prompt=prompt)))  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, 0, "abc " * 9)
        tg.start_soon(run, 1, "xyz " * 5)
    assert [s.text for s in results[0]] == [s.text for s in alone[0]]  # type: ignore[union-attr]
    assert [s.text for s in results[1]] == [s.text for s in alone[1]]  # type: ignore[union-attr]
    assert engine.metrics.decode_steps < 2 * 11  # the two requests decoded in shared steps
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.anyio
async def test_a_cancelled_sample_gives_its_blocks_back(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    with anyio.move_on_after(0.05):
        await backend.sample(request(4, max_tokens=400))
    assert engine.metrics.steps < 400
    done = await backend.sample(request(1, max_tokens=3))  # the next call drops the abandoned one
    assert len(done) == 1
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()


@pytest.mark.anyio
async def test_a_request_too_big_for_the_pool_is_refused(
    make_engine: Callable[..., Engine],
) -> None:
    backend = EngineBackend(engine=make_engine(num_blocks=4))
    with pytest.raises(ContextLengthError, match="pool has 4"):
        await backend.sample(request(2, max_tokens=40))


@pytest.mark.anyio
async def test_a_failed_step_fails_the_requests_in_flight_and_forgets_the_cache(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    run = engine.runner.run

    def broken(step: object) -> object:
        engine.runner.run = run  # type: ignore[method-assign]
        raise RuntimeError("device lost")

    engine.runner.run = broken  # type: ignore[method-assign]
    with pytest.raises(ServerError, match="device lost"):
        await backend.sample(request(2))
    samples = await backend.sample(request(2))  # works again, and trusts no uncomputed block
    first = samples[0]
    assert isinstance(first, Sample) and first.usage.cached_input_tokens == 0
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.anyio
async def test_ignore_eos_decodes_to_max_tokens_where_eos_would_stop_a_lane(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    engine.eos_ids = frozenset(range(engine.model.args.vocab_size))  # every token ends a lane
    backend = EngineBackend(EngineConfig(block_size=16), engine=engine)
    stopped = await backend.sample(request(3, max_tokens=5))
    assert [(s.finish_reason, s.usage.output_tokens) for s in stopped if isinstance(s, Sample)] == [
        ("stop", 0)
    ] * 3
    through = SampleRequest(
        prompt=PROMPT,
        params=SamplingParams(temperature=0.9, max_tokens=5, ignore_eos=True),
        lanes=tuple(LaneRequest(i, 1000 + i, 5) for i in range(3)),
    )
    samples = await backend.sample(through)
    assert [(s.finish_reason, s.usage.output_tokens) for s in samples if isinstance(s, Sample)] == [
        ("length", 5)
    ] * 3


async def collect(stream: AsyncIterator[TextDelta | Sample]) -> tuple[dict[int, list[str]], list[Sample]]:
    deltas: dict[int, list[str]] = {}
    samples: list[Sample] = []
    async for item in stream:
        if isinstance(item, TextDelta):
            assert item.lane not in {s.lane for s in samples}, "a delta after its lane's Sample"
            deltas.setdefault(item.lane, []).append(item.text)
        else:
            samples.append(item)
    return deltas, samples


@pytest.mark.anyio
async def test_stream_yields_text_as_it_is_made_and_ends_as_sample_does(
    make_engine: Callable[..., Engine],
) -> None:
    whole = await EngineBackend(engine=make_engine()).sample(request(4, max_tokens=20))
    backend = EngineBackend(engine=make_engine())
    assert isinstance(backend, StreamingBackend)
    deltas, samples = await collect(backend.stream(request(4, max_tokens=20)))
    def key(s: Sample | BackendError) -> object:
        assert isinstance(s, Sample)
        u = s.usage
        return s.lane, s.text, s.finish_reason, s.logprobs, u.input_tokens, u.cached_input_tokens, \
            u.output_tokens

    assert [key(s) for s in samples] == [key(s) for s in whole]  # what `sample` gives
    for sample in samples:
        assert "".join(deltas[sample.lane]) == sample.text
        assert len(deltas[sample.lane]) > 5  # step by step, not all at the end
        assert all(deltas[sample.lane])


@pytest.mark.anyio
async def test_stream_holds_back_what_a_stop_string_may_still_cut(
    make_engine: Callable[..., Engine],
) -> None:
    free = await EngineBackend(engine=make_engine()).sample(request(1, max_tokens=30))
    text = free[0].text if isinstance(free[0], Sample) else ""
    stop = text[10:13]  # a stop string the lane is known to reach at character 10
    assert len(stop) == 3 and text.find(stop) == 10
    stopped = SampleRequest(
        prompt=PROMPT,
        params=SamplingParams(temperature=0.9, max_tokens=30, logprobs=True, stop=(stop,)),
        lanes=(LaneRequest(0, 1000, 30),),
    )
    deltas, samples = await collect(EngineBackend(engine=make_engine()).stream(stopped))
    assert samples[0].text == text[:10] and samples[0].finish_reason == "stop"
    assert "".join(deltas[0]) == text[:10]  # no piece of the stop string ever went out


def test_settled_text() -> None:
    assert settled_text("an answer: 4", ()) == "an answer: 4"
    assert settled_text("an answer: 4\nQ", ("\nQuestion",)) == "an answer: 4"
    assert settled_text("an answer: 4\nQ", ("\n\n", "\nQu")) == "an answer: 4"
    assert settled_text("an answer: 4\nX", ("\nQuestion",)) == "an answer: 4\nX"
    assert settled_text("price: 5 \ufffd", ()) == "price: 5 "  # half a character so far
    assert settled_text("\ufffd\ufffd", ("ab",)) == ""
    assert settled_text("xa", ("ab", "b")) == "x"


@pytest.mark.anyio
async def test_a_stream_closed_early_aborts_its_request_and_others_go_on(
    make_engine: Callable[..., Engine],
) -> None:
    alone = await EngineBackend(engine=make_engine()).sample(request(2, prompt="xyz " * 5))
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    other: list[Sample | BackendError] = []

    async def sample_meanwhile() -> None:
        other.extend(await backend.sample(request(2, prompt="xyz " * 5)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sample_meanwhile)
        stream = backend.stream(request(4, max_tokens=400))
        seen = 0
        async for item in stream:
            seen += isinstance(item, TextDelta)
            if seen >= 8:
                break
        await stream.aclose()  # type: ignore[attr-defined]
    assert [s.text for s in other] == [s.text for s in alone]  # type: ignore[union-attr]
    await backend.sample(request(1, max_tokens=2))  # the next call drops the abandoned stream
    assert engine.metrics.steps < 400
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()
