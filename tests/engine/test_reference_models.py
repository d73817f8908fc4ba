"""The architecture matches the reference implementation, and both file formats load right."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import reference_logits
from test_exactness import record_steps
from tiny import TINY, tiny_checkpoint

from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._model import build_model
from lanefold.backends.engine._weights import load_checkpoint
from lanefold.primitives import LaneRequest, SamplingParams

PROMPT = [(13 * i + 1) % 256 for i in range(21)]


def _engine_from(path: Path) -> Engine:
    model = build_model(load_checkpoint(path), torch.device("cpu"), torch.float32)
    return Engine(model, num_blocks=64, block_size=8)


@pytest.mark.parametrize("tied", [False, True])
def test_logits_equal_transformers_llama_with_the_same_weights(tmp_path: Path, tied: bool) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=TINY.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            param.copy_(
                1 + 0.1 * torch.randn_like(param) if "norm" in name else 0.15 * torch.randn_like(param)
            )
    reference.save_pretrained(tmp_path)
    engine = _engine_from(tmp_path)
    assert engine.model.args.tie_embeddings == tied
    seen = record_steps(engine)
    engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8), [LaneRequest(0, 0, 8)])
    assert len(seen) == 8
    with torch.no_grad():
        for tokens, row in seen:
            expected = reference(torch.tensor([tokens])).logits[0, -1]
            torch.testing.assert_close(row, expected, atol=1e-4, rtol=0)


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's conversion of Q/K rows (what `convert_hf_to_gguf.py` does)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def test_gguf_file_loads_dequantised_and_unpermuted(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    checkpoint = tiny_checkpoint(3)
    a = checkpoint.args
    kinds = [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16, Q.F32]
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(a.num_layers)
    writer.add_context_length(a.max_position)
    writer.add_embedding_length(a.hidden_size)
    writer.add_feed_forward_length(a.intermediate_size)
    writer.add_head_count(a.num_heads)
    writer.add_head_count_kv(a.num_kv_heads)
    writer.add_rope_freq_base(a.rope_theta)
    writer.add_layer_norm_rms_eps(a.rms_norm_eps)
    writer.add_eos_token_id(5)
    expected: dict[str, np.ndarray] = {}
    gguf_names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    layer_names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i, (name, tensor) in enumerate(sorted(checkpoint.tensors.items())):
        array = tensor.numpy()
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{layer_names[rest.removesuffix('.weight')]}.weight"
        else:
            gname = gguf_names[name]
        kind = Q.F32 if array.ndim == 1 else kinds[i % len(kinds)]
        stored = _permute(array, a.num_heads) if "q_proj" in name else array
        stored = _permute(array, a.num_kv_heads) if "k_proj" in name else stored
        data = quantize(stored, kind)
        writer.add_tensor(gname, data, raw_dtype=kind)
        expected[name] = dequantize(quantize(array, kind), kind)  # row-wise: permuting commutes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    loaded = load_checkpoint(path)
    assert loaded.args.rms_norm_eps == pytest.approx(a.rms_norm_eps)  # stored as float32
    assert replace(loaded.args, rms_norm_eps=a.rms_norm_eps) == replace(a, eos_token_ids=(5,))
    assert loaded.tensors.keys() == expected.keys()
    for name, array in expected.items():
        np.testing.assert_array_equal(loaded.tensors[name].numpy(), array.astype(np.float32), err_msg=name)
    # and a model built from it computes what the reference computes from the same numbers
    engine = _engine_from(path)
    seen = record_steps(engine)
    engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=4), [LaneRequest(0, 0, 4)])
    for tokens, row in seen:
        torch.testing.assert_close(row, reference_logits(loaded, tokens)[-1], atol=1e-4, rtol=0)


def test_engine_errors_name_the_problem(tmp_path: Path, make_engine: Callable[..., Engine]) -> None:
    from lanefold.backends.engine import EngineConfig
    from lanefold.backends.engine._weights import resolve_model_path
    from lanefold.primitives import ConfigError, ContextLengthError

    with pytest.raises(ConfigError, match="neither"):
        resolve_model_path(str(tmp_path / "missing.gguf"))
    with pytest.raises(ContextLengthError, match="context is 512"):
        make_engine().add_request(list(range(600)), SamplingParams(), [LaneRequest(0, 0, 1)])
    with pytest.raises(ValueError, match="extra"):
        EngineConfig.model_validate({"kind": "engine", "modle": "x"})
