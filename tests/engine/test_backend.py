"""`EngineBackend` through anyio: per-lane usage, shared batching, cancellation, lazy torch."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from lanefold.backends.engine import EngineBackend, EngineConfig
from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._ticket import settled_text
from lanefold.primitives import (
    Backend,
    BackendError,
    ConfigError,
    ContextLengthError,
    LaneRequest,
    Sample,
    SampleRequest,
    SamplingParams,
    ServerError,
    StreamingBackend,
    TextDelta,
    sample_all,
)

PROMPT = "The quick brown fox jumps over the lazy dog. " * 2  # 90 byte tokens


def request(k: int, *, prompt: str = PROMPT, max_tokens: int = 12, share: bool = True) -> SampleRequest:
    return SampleRequest(
        prompt=prompt,
        params=SamplingParams(temperature=0.9, max_tokens=max_tokens, logprobs=True),
        lanes=tuple(LaneRequest(i, 1000 + i, max_tokens) for i in range(k)),
        share_prefix=share,
    )


def mixed(lengths: Sequence[int], *, prompt: str = PROMPT) -> SampleRequest:
    """One request whose lanes have different allotments (the tiny model has no EOS, so lane i
    decodes exactly `lengths[i]` tokens)."""
    return SampleRequest(
        prompt=prompt,
        params=SamplingParams(temperature=0.9, max_tokens=max(lengths), logprobs=True),
        lanes=tuple(LaneRequest(i, 1000 + i, n) for i, n in enumerate(lengths)),
    )


def test_the_package_imports_no_torch_and_exports_exactly_its_names() -> None:
    code = (
        "import sys, lanefold.backends.engine as e; assert 'torch' not in sys.modules, 'torch imported'; "
        "assert e.__all__ == ('EngineBackend', 'EngineConfig', 'resolve_model_path'); e.EngineConfig(); "
        "assert 'torch' not in sys.modules; e.EngineBackend; assert 'torch' in sys.modules"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def fail_once(engine: Engine) -> Callable[[object], object]:
    """A model runner that raises "device lost" once, then runs again."""
    run = engine.runner.run

    def broken(step: object) -> object:
        engine.runner.run = run  # type: ignore[method-assign]
        raise RuntimeError("device lost")

    return broken


@pytest.mark.anyio
async def test_sample_prefills_the_prompt_once_and_bills_each_lane(
    make_engine: Callable[..., Engine],
) -> None:
    backend = EngineBackend(EngineConfig(block_size=16), engine=make_engine())
    assert isinstance(backend, Backend)
    prompt_tokens = backend.count_prompt_tokens(request(8))
    assert prompt_tokens == 90
    samples = await sample_all(backend, request(8))
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
    assert all(isinstance(s, Sample) and s.logprobs is not None and len(s.logprobs) == 12 for s in samples)

    again = await sample_all(backend, request(2))  # the prompt's full blocks now come from the cache
    first = again[0]
    assert isinstance(first, Sample)
    assert (first.usage.input_tokens, first.usage.cached_input_tokens) == (90 - 80, 80)
    unshared = await sample_all(backend, request(3, share=False))
    assert sum(s.usage.input_tokens for s in unshared if isinstance(s, Sample)) == 3 * 10
    await backend.aclose()


@pytest.mark.anyio
async def test_concurrent_samples_share_decode_steps_and_match_running_alone(
    make_engine: Callable[..., Engine],
) -> None:
    alone_backend = EngineBackend(engine=make_engine())
    alone = [await sample_all(alone_backend, request(4, prompt=p)) for p in ("abc " * 9, "xyz " * 5)]
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    results: dict[int, list[Sample]] = {}

    async def run(i: int, prompt: str) -> None:
        results[i] = list(await sample_all(backend, request(4, prompt=prompt)))  # type: ignore[arg-type]

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
        await sample_all(backend, request(4, max_tokens=400))
    assert engine.metrics.steps < 400
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()  # at once
    done = await sample_all(backend, request(1, max_tokens=3))
    assert len(done) == 1
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()


@pytest.mark.anyio
async def test_a_request_too_big_for_the_pool_is_refused(
    make_engine: Callable[..., Engine],
) -> None:
    backend = EngineBackend(engine=make_engine(num_blocks=4))
    with pytest.raises(ContextLengthError, match="pool has 4"):
        await sample_all(backend, request(2, max_tokens=40))


@pytest.mark.anyio
async def test_a_failed_step_fails_the_requests_in_flight_and_forgets_the_cache(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    broken = fail_once(engine)

    engine.runner.run = broken  # type: ignore[method-assign]
    with pytest.raises(ServerError, match="device lost"):
        await sample_all(backend, request(2))
    samples = await sample_all(backend, request(2))  # works again, and trusts no uncomputed block
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
    stopped = await sample_all(backend, request(3, max_tokens=5))
    assert [(s.finish_reason, s.usage.output_tokens) for s in stopped if isinstance(s, Sample)] == [
        ("stop", 0)
    ] * 3
    through = SampleRequest(
        prompt=PROMPT,
        params=SamplingParams(temperature=0.9, max_tokens=5, ignore_eos=True),
        lanes=tuple(LaneRequest(i, 1000 + i, 5) for i in range(3)),
    )
    samples = await sample_all(backend, through)
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
    whole = await sample_all(EngineBackend(engine=make_engine()), request(4, max_tokens=20))
    backend = EngineBackend(engine=make_engine())
    assert isinstance(backend, StreamingBackend)
    deltas, samples = await collect(backend.stream(request(4, max_tokens=20)))

    def key(s: Sample | BackendError) -> object:
        assert isinstance(s, Sample)
        u = s.usage
        return (
            s.lane,
            s.text,
            s.finish_reason,
            s.logprobs,
            u.input_tokens,
            u.cached_input_tokens,
            u.output_tokens,
        )

    assert [key(s) for s in sorted(samples, key=lambda s: s.lane)] == [key(s) for s in whole]
    for sample in samples:
        assert "".join(deltas[sample.lane]) == sample.text
        assert len(deltas[sample.lane]) > 5  # step by step, not all at the end
        assert all(deltas[sample.lane])


@pytest.mark.anyio
async def test_stream_holds_back_what_a_stop_string_may_still_cut(
    make_engine: Callable[..., Engine],
) -> None:
    free = await sample_all(EngineBackend(engine=make_engine()), request(1, max_tokens=30))
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
    alone = await sample_all(EngineBackend(engine=make_engine()), request(2, prompt="xyz " * 5))
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    other: list[Sample | BackendError] = []

    async def sample_meanwhile() -> None:
        other.extend(await sample_all(backend, request(2, prompt="xyz " * 5)))

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
    await sample_all(backend, request(1, max_tokens=2))  # the next call drops the abandoned stream
    assert engine.metrics.steps < 400
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()


@pytest.mark.anyio
async def test_sample_yields_each_lane_as_it_stops_while_the_long_lanes_decode(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    landed: list[tuple[int, int]] = []
    running: list[tuple[int, int]] = []  # (lane, tokens so far) decoding when the first landed
    async with aclosing(backend.sample(mixed([40, 3, 40, 6]))) as outcomes:
        async for outcome in outcomes:
            assert isinstance(outcome, Sample)
            if not landed:
                running = sorted((s.lane, s.num_generated) for s in engine.scheduler.running)
            landed.append((outcome.lane, outcome.usage.output_tokens))
    assert landed[:2] == [(1, 3), (3, 6)]  # the short lanes first, in the order they stopped
    assert sorted(landed[2:]) == [(0, 40), (2, 40)]
    assert [lane for lane, _ in running] == [0, 2, 3]
    assert all(tokens <= 3 for _, tokens in running)  # the long lanes had barely begun
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()


@pytest.mark.anyio
async def test_lanes_landed_one_by_one_are_what_the_whole_request_gives(
    make_engine: Callable[..., Engine],
) -> None:
    req = mixed([25, 2, 9, 25, 1])
    whole = make_engine()
    assert whole.tokenizer is not None
    lanes = whole.generate(whole.tokenizer.encode(PROMPT), req.params, req.lanes).sequences
    samples = await sample_all(EngineBackend(engine=make_engine()), req)
    for seq, sample in zip(lanes, samples, strict=True):
        assert isinstance(sample, Sample)
        u = sample.usage
        assert (sample.lane, sample.text, sample.finish_reason, sample.logprobs) == (
            seq.lane,
            seq.text,
            "length",
            tuple(seq.logprobs),
        )
        assert (u.input_tokens, u.cached_input_tokens, u.output_tokens) == (
            seq.input_tokens,
            seq.cached_input_tokens,
            seq.num_generated,
        )
        assert sample.extra["prompt_tokens"] == 90


@pytest.mark.anyio
async def test_closing_sample_after_its_first_lane_aborts_the_rest(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    async with aclosing(backend.sample(mixed([2, 300, 300, 300]))) as outcomes:
        first = await anext(outcomes)
        assert engine.has_work()
    assert isinstance(first, Sample) and first.lane == 0
    assert not engine.has_work() and engine.pool.num_free == engine.pool.num_blocks
    assert engine.metrics.decode_steps < 10
    again = await sample_all(backend, mixed([2, 4]))  # and the engine serves the next call
    assert [s.usage.output_tokens for s in again if isinstance(s, Sample)] == [2, 4]


@pytest.mark.anyio
async def test_concurrent_samples_land_their_lanes_one_by_one_in_shared_steps(
    make_engine: Callable[..., Engine],
) -> None:
    prompts = {"a": "abc " * 9, "b": "xyz " * 5}
    lengths = {"a": [4, 30], "b": [30, 4]}
    alone = {
        c: await sample_all(EngineBackend(engine=make_engine()), mixed(lengths[c], prompt=p))
        for c, p in prompts.items()
    }
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    arrivals: list[tuple[str, int]] = []
    texts: dict[tuple[str, int], str] = {}

    async def run(call: str) -> None:
        async with aclosing(backend.sample(mixed(lengths[call], prompt=prompts[call]))) as outcomes:
            async for outcome in outcomes:
                assert isinstance(outcome, Sample)
                arrivals.append((call, outcome.lane))
                texts[call, outcome.lane] = outcome.text

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "a")
        tg.start_soon(run, "b")
    assert set(arrivals[:2]) == {("a", 0), ("b", 1)}  # both short lanes before either long one
    assert set(arrivals[2:]) == {("a", 1), ("b", 0)}
    for call, samples in alone.items():
        assert [texts[call, s.lane] for s in samples if isinstance(s, Sample)] == [
            s.text for s in samples if isinstance(s, Sample)
        ]
    assert engine.metrics.decode_steps < 2 * 29  # the two requests decoded in shared steps
    assert engine.pool.num_free == engine.pool.num_blocks


@pytest.mark.anyio
async def test_a_failed_step_raises_for_the_lanes_not_yet_landed(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    backend = EngineBackend(engine=engine)
    broken = fail_once(engine)

    landed: list[int] = []
    with pytest.raises(ServerError, match="device lost"):
        async with aclosing(backend.sample(mixed([2, 30, 30]))) as outcomes:
            async for outcome in outcomes:
                assert isinstance(outcome, Sample)
                landed.append(outcome.lane)
                engine.runner.run = broken  # type: ignore[method-assign]
    assert landed == [0]  # the lane that landed stands; the others are the error's
    assert engine.pool.num_free == engine.pool.num_blocks and not engine.has_work()


@pytest.mark.anyio
async def test_stream_sends_a_lane_sample_as_soon_as_the_lane_stops(
    make_engine: Callable[..., Engine],
) -> None:
    whole = await sample_all(EngineBackend(engine=make_engine()), mixed([3, 30]))
    items: list[TextDelta | Sample] = []
    async with aclosing(EngineBackend(engine=make_engine()).stream(mixed([3, 30]))) as stream:
        async for item in stream:
            items.append(item)
    first = next(i for i, item in enumerate(items) if isinstance(item, Sample))
    assert isinstance(items[first], Sample) and items[first].lane == 0
    assert sum(isinstance(item, TextDelta) and item.lane == 1 for item in items[first:]) > 5
    deltas, samples = await collect(_replay(items))
    assert [s.text for s in sorted(samples, key=lambda s: s.lane)] == [
        s.text for s in whole if isinstance(s, Sample)
    ]
    assert all("".join(deltas[s.lane]) == s.text for s in samples)


async def _replay(items: list[TextDelta | Sample]) -> AsyncIterator[TextDelta | Sample]:
    for item in items:
        yield item


@pytest.mark.anyio
async def test_load_builds_the_engine_once_before_any_sample(
    monkeypatch: pytest.MonkeyPatch,
    make_engine: Callable[..., Engine],
) -> None:
    built: list[EngineConfig] = []

    def from_config(config: EngineConfig, tokenizer: object = None) -> Engine:
        built.append(config)
        return make_engine()

    monkeypatch.setattr(Engine, "from_config", staticmethod(from_config))
    backend = EngineBackend(EngineConfig(model="tiny"))
    assert backend.engine is None
    async with anyio.create_task_group() as tg:
        tg.start_soon(backend.load)
        tg.start_soon(backend.load)
    assert backend.engine is not None and len(built) == 1
    await backend.load()
    samples = await sample_all(backend, request(2, max_tokens=3))
    assert all(isinstance(s, Sample) for s in samples) and len(built) == 1
    await backend.aclose()
    with pytest.raises(ConfigError, match="closed"):
        await backend.load()
