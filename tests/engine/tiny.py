"""A tiny random-weight Llama and a byte-level tokenizer for the engine's exactness tests.

A plain module (not conftest) so test files import it by a name no other folder uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lanefold.backends.engine._model import CausalLM
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.backends.engine._trials import Trial
from lanefold.backends.engine._weights import Checkpoint, ModelArgs

__all__ = ("SMOLLM2_TEMPLATE", "TINY", "Told", "byte_tokenizer", "tiny_checkpoint")

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

# SmolLM2-135M-Instruct's chat template, as its GGUF file holds it: ChatML, with a default
# system turn, and no tool role (it reads no `tools`).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


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


@dataclass
class Told:
    """The load-time trials answering as a test tells them (`_decode_paths.Measure`), counting
    how often each was asked: a choice made with them is neither read from nor kept in the cache."""

    torch_faster: bool = False
    tiles_faster: bool = False
    asked: int = 0

    def products(self, threads: int, dtype: torch.dtype, width: int) -> Trial:
        self.asked += 1
        return Trial(self.torch_faster, {"loops": 1.0, "torch": 0.5 if self.torch_faster else 2.0})

    def tiles(self, threads: int, width: int) -> Trial:
        self.asked += 1
        return Trial(self.tiles_faster, {"onednn": 1.0, "tiles": 0.5 if self.tiles_faster else 2.0})
