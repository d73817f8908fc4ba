"""A Llama decoder whose attention reads keys and values through block tables.

RMSNorm, rotate-half RoPE, SwiGLU MLP, grouped-query attention, tied embeddings where the
checkpoint ties them; parameter names are Hugging Face's, so a state dict loads as it is.
Every layer first writes the step's new K/V into the paged cache, then gathers each sequence's
context from it: so a sequence may attend to blocks another sequence of the same step wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from backends.engine._attention import AttentionBatch, causal_attention, paged_attention
from backends.engine._weights import Checkpoint, ModelArgs

__all__ = ("AttentionBatch", "CausalLM", "KVCache", "build_model", "rope_inv_freq")

_HEAD_SLICE = 2048  # rows of the LM head a CPU matrix product takes at once


@dataclass(slots=True)
class KVCache:
    """Keys and values of every layer, one row per token slot.

    Shape `[layers, blocks * block_size, kv_heads, head_dim]`; slot = block * block_size + offset.
    """

    k: Tensor
    v: Tensor

    @classmethod
    def empty(
        cls, args: ModelArgs, slots: int, dtype: torch.dtype, device: torch.device
    ) -> KVCache:
        """Zeroed storage for `slots` tokens of every layer.

        Zeroed, not empty: padded and masked slots still enter attention with weight 0, and
        0 * NaN from uninitialised memory would poison the output.
        """
        shape = (args.num_layers, slots, args.num_kv_heads, args.head_dim)
        return cls(_zeros(shape, dtype, device), _zeros(shape, dtype, device))


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Zeros; on CPU from calloc (numpy), whose pages the OS zeroes when first touched, so a
    pool of hundreds of MiB costs nothing until it is used (torch.zeros writes it all: 0.4 s
    of CPU for the default 512 MiB, a third of a warm load)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    import numpy as np

    width = torch.empty((), dtype=dtype).element_size()
    raw = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    return torch.from_numpy(np.zeros(shape, dtype=raw)).view(dtype)


class _Linear(nn.Linear):
    """`nn.Linear` whose weights always come from a checkpoint: never randomly initialised.

    Random init of a meta tensor imports `torch._dynamo` (2 s of CPU, most of a warm load).
    """

    def reset_parameters(self) -> None:
        pass


class _Embedding(nn.Embedding):
    """`nn.Embedding` whose weights always come from a checkpoint: never randomly initialised."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 as the reference does."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == torch.float32:  # one fused kernel, same arithmetic as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention over the paged KV cache."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        self.q_proj = _Linear(args.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = _Linear(args.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = _Linear(args.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = _Linear(self.heads * self.head_dim, args.hidden_size, bias=False)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        cache: tuple[Tensor, Tensor],
        batch: AttentionBatch,
        layer: int,
    ) -> Tensor:
        n = x.shape[0]
        q = _rotate(self.q_proj(x).view(n, self.heads, self.head_dim), rope)
        k = _rotate(self.k_proj(x).view(n, self.kv_heads, self.head_dim), rope)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        k_cache, v_cache = cache
        k_cache.index_copy_(0, batch.write_slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, batch.write_slots, v.to(v_cache.dtype))
        if batch.spans is not None:
            attended = causal_attention(q, k, v, batch.spans)
        else:
            attended = paged_attention(q, k_cache, v_cache, batch, layer)
        out: Tensor = self.o_proj(attended)
        return out


class MLP(nn.Module):
    """SwiGLU feed-forward."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = _Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = _Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = _Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    """Pre-norm attention then pre-norm MLP, each with a residual."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        cache: tuple[Tensor, Tensor],
        batch: AttentionBatch,
        layer: int,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, batch, layer)
        out: Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class Decoder(nn.Module):
    """Embeddings, the layer stack and the final norm (HF's `model.` prefix)."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = _Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class CausalLM(nn.Module):
    """The decoder plus its LM head; `forward` returns the hidden states of the new tokens."""

    inv_freq: Tensor

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = Decoder(args)
        self.lm_head = _Linear(args.hidden_size, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, cache: KVCache, batch: AttentionBatch) -> Tensor:
        x = self.model.embed_tokens(input_ids)
        freqs = batch.positions.float()[:, None] * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [N, 1, head_dim]
        rope = (angles.cos(), angles.sin())
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, (cache.k[i], cache.v[i]), batch, i)
        out: Tensor = self.model.norm(x)
        return out

    @torch.inference_mode()
    def logits(self, hidden: Tensor) -> Tensor:
        """fp32 logits of the given hidden states.

        On CPU the head goes in slices of rows: MKL multiplies a few hidden states by a
        49152-row head about 1.2x (8 rows) to 1.5x (16 rows) faster a slice at a time.
        """
        weight = self.lm_head.weight
        if weight.device.type == "cpu" and weight.shape[0] > 2 * _HEAD_SLICE:
            parts = [F.linear(hidden, w) for w in torch.split(weight, _HEAD_SLICE)]
            return torch.cat(parts, dim=-1).float()
        out: Tensor = self.lm_head(hidden)
        return out.float()


def _rotate(x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
    cos, sin = rope
    x32 = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def build_model(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """Instantiate the decoder on `device` in `dtype` with the checkpoint's weights."""
    with torch.device("meta"):
        model = CausalLM(checkpoint.args)
    tensors = dict(checkpoint.tensors)
    if checkpoint.args.tie_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    state = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
    model.load_state_dict(state, strict=True, assign=True)
    if checkpoint.args.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(checkpoint.args).to(device)  # buffers are not in the state dict
    return model.eval()


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """RoPE inverse frequencies, computed in fp32 exactly as the reference implementation does."""
    # on the CPU even while a model is laid out on "meta": arithmetic on meta tensors imports
    # torch._dynamo, 2 s of a warm load's CPU time
    exponents = (
        torch.arange(0, args.head_dim, 2, dtype=torch.int64, device="cpu").float() / args.head_dim
    )
    return 1.0 / (args.rope_theta**exponents)
