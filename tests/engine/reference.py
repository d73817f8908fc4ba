"""A plain full-recompute Llama forward (no cache, no blocks): the engine's yardstick."""

from __future__ import annotations

import torch
from torch import Tensor

from lanefold.backends.engine._weights import Checkpoint


def reference_logits(checkpoint: Checkpoint, tokens: list[int]) -> Tensor:
    """fp32 logits `[len(tokens), vocab]` of a causal Llama over the whole sequence."""
    a, w = checkpoint.args, checkpoint.tensors
    n = len(tokens)
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    inv = 1.0 / a.rope_theta ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim)
    angles = torch.arange(n).float()[:, None] * inv[None, :]
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()

    def norm(h: Tensor, weight: Tensor) -> Tensor:
        return weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + a.rms_norm_eps)

    def rope(t: Tensor) -> Tensor:  # [heads, n, d]
        half = a.head_dim // 2
        return t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin

    causal = torch.ones(n, n).tril().bool()
    for i in range(a.num_layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(n, a.num_heads, a.head_dim).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(n, a.num_kv_heads, a.head_dim).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, a.num_kv_heads, a.head_dim).transpose(0, 1)
        group = a.num_heads // a.num_kv_heads
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = (rope(q) @ rope(k).transpose(1, 2)) / a.head_dim**0.5
        attn = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + attn.transpose(0, 1).reshape(n, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return norm(x, w["model.norm.weight"]) @ head.T
