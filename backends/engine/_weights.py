"""Checkpoints: find the model file, read its architecture and load its tensors by HF names.

Two sources: a GGUF file (dequantised with the `gguf` package: Q4_0, Q4_1, Q8_0, F16, F32 and
whatever else it can read) and a Hugging Face folder (`config.json` + `*.safetensors`). Both end
as a `Checkpoint` whose tensors carry the Hugging Face Llama names, so the model has one loader.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lanefold.backends.engine import _config
from lanefold.primitives import ConfigError, get_logger

if TYPE_CHECKING:
    from gguf import GGUFReader

__all__ = (
    "Checkpoint",
    "ModelArgs",
    "gguf_args",
    "hf_args",
    "load_checkpoint",
    "open_gguf",
    "reading_model",
    "resolve_model_path",
)

_KEY = "backend.model: "


_GGUF_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_GGUF_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


@dataclass(frozen=True, slots=True)
class ModelArgs:
    """The architecture of a Llama-family decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position: int = 2048
    tie_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """An architecture and its tensors (fp32 or the file's float dtype), keyed by HF names."""

    args: ModelArgs
    tensors: dict[str, torch.Tensor]


@contextlib.contextmanager
def reading_model(path: Path) -> Iterator[None]:
    """Within the block, a model file that cannot be read as one (truncated, corrupt, not the
    format it claims, a field of the wrong type) is a ConfigError naming `backend.model`, the
    file and what is wrong with it, instead of whatever the parser raised. The parser's own
    traceback is logged at debug level (`-v`)."""
    try:
        yield
    except ConfigError as exc:
        message = str(exc)
        if message.startswith(_KEY):
            raise
        where = "" if message.startswith(str(path)) else f"{path}: "
        raise ConfigError(f"{_KEY}{where}{message}") from None
    except MemoryError:
        raise
    except Exception as exc:  # the gguf, safetensors and tokenizers readers raise many kinds
        get_logger("lanefold.engine", model=str(path)).debug("model file unreadable", exc_info=True)
        what = " ".join(str(exc).split())[:200] or "no detail"
        kind = "GGUF" if path.suffix == ".gguf" else "model"
        raise ConfigError(
            f"{_KEY}{path} is not a readable {kind} file ({type(exc).__name__}: {what})"
        ) from None


def resolve_model_path(model: str) -> Path:
    """Where `model` is on disk (`backends.engine.resolve_model_path`), refused as every
    refusal of the loader is: naming `backend.model`."""
    with reading_model(Path(model)):
        return _config.resolve_model_path(model)


def open_gguf(path: Path) -> GGUFReader:
    """Open a GGUF file (memory-mapped; tensors are read when dequantised)."""
    with reading_model(path):
        from gguf import GGUFReader

        return GGUFReader(path)


def gguf_field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """The value of one metadata field, or `default` where the file lacks it."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def load_checkpoint(path: Path, reader: GGUFReader | None = None) -> Checkpoint:
    """Load the architecture and tensors at `path` (a .gguf file or an HF folder)."""
    with reading_model(path):
        if path.is_dir():
            return _load_hf_folder(path)
        return _load_gguf(reader if reader is not None else open_gguf(path))


def _load_gguf(reader: GGUFReader) -> Checkpoint:
    from gguf.quants import dequantize

    args = gguf_args(reader)
    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _gguf_to_hf_name(tensor.name)
        # F32 tensors come back as read-only views of the memory map: require a writable copy
        array = np.require(dequantize(tensor.data, tensor.tensor_type), np.float32, ["C", "W"])
        if name.endswith("q_proj.weight"):
            array = _unpermute(array, args.num_heads)
        elif name.endswith("k_proj.weight"):
            array = _unpermute(array, args.num_kv_heads)
        tensors[name] = torch.from_numpy(array)
    return Checkpoint(args, tensors)


def gguf_args(reader: GGUFReader) -> ModelArgs:
    """The architecture a GGUF's header states (no tensor is read: the vocabulary is the
    embedding's row count, as its header gives its shape)."""
    arch = gguf_field(reader, "general.architecture")
    if arch != "llama":
        raise ConfigError(f"GGUF architecture {arch!r} is not supported (only 'llama')")
    heads = int(gguf_field(reader, "llama.attention.head_count"))
    kv_heads = int(gguf_field(reader, "llama.attention.head_count_kv", heads))
    hidden = int(gguf_field(reader, "llama.embedding_length"))
    shapes = {tensor.name: tensor.shape for tensor in reader.tensors}
    if "token_embd.weight" not in shapes:
        raise ConfigError("GGUF has no token_embd.weight: not a plain Llama decoder")
    eos = [gguf_field(reader, k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    return ModelArgs(
        vocab_size=int(shapes["token_embd.weight"][-1]),  # GGUF lists a matrix's sides inner first
        hidden_size=hidden,
        intermediate_size=int(gguf_field(reader, "llama.feed_forward_length")),
        num_layers=int(gguf_field(reader, "llama.block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(gguf_field(reader, "llama.rope.dimension_count", hidden // heads)),
        rope_theta=float(gguf_field(reader, "llama.rope.freq_base", 10000.0)),
        rms_norm_eps=float(gguf_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        max_position=int(gguf_field(reader, "llama.context_length", 2048)),
        tie_embeddings="output.weight" not in shapes,
        bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(dict.fromkeys(int(e) for e in eos if e is not None)),
    )


def _gguf_to_hf_name(name: str) -> str:
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _GGUF_LAYER:
        return f"model.layers.{parts[1]}.{_GGUF_LAYER[parts[2]]}"
    raise ConfigError(f"GGUF tensor {name!r} is not part of a plain Llama decoder")


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's row permutation of Q/K (interleaved RoPE pairs -> rotate-half halves)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def _load_hf_folder(folder: Path) -> Checkpoint:
    from safetensors.torch import load_file

    args = hf_args(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{folder}: no *.safetensors files")
    tensors = {k: v.float() for f in files for k, v in load_file(f).items()}
    return Checkpoint(args, tensors)


def hf_args(folder: Path) -> ModelArgs:
    """The architecture a Hugging Face folder's `config.json` states (a plain Llama only)."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ConfigError(f"{folder}: model_type {config.get('model_type')!r} is not 'llama'")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConfigError(f"{folder}: biased Llama variants are not supported")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ConfigError(f"{folder}: RoPE scaling {rope!r} is not supported")
    heads = int(config["num_attention_heads"])
    eos = config.get("eos_token_id")
    return ModelArgs(
        vocab_size=int(config["vocab_size"]),
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config["hidden_size"] // heads),
        rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position=int(config.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        bos_token_id=config.get("bos_token_id"),
        eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
    )
