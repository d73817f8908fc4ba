"""The disk cache of a GGUF's dequantised tensors and tokenizer: reused, keyed, rebuilt when bad."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from tiny import TINY, tiny_checkpoint

from lanefold.backends.engine import EngineConfig
from lanefold.backends.engine._engine import Engine, load_tokenizer
from lanefold.backends.engine._weight_cache import (
    cache_dir,
    cached_checkpoint,
    cached_tokenizer,
    gguf_key,
    open_lazily,
)
from lanefold.backends.engine._weights import load_checkpoint
from lanefold.primitives import ConfigError, LaneRequest, SamplingParams

gguf = pytest.importorskip("gguf")

if TYPE_CHECKING:
    from gguf import GGUFReader

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"


def write_tiny_gguf(path: Path) -> None:
    """The tiny Llama as F32 tensors plus a byte-level BPE vocabulary with one control token."""
    from tokenizers import pre_tokenizers

    a = TINY
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(a.num_layers)
    writer.add_context_length(a.max_position)
    writer.add_embedding_length(a.hidden_size)
    writer.add_feed_forward_length(a.intermediate_size)
    writer.add_head_count(a.num_heads)
    writer.add_head_count_kv(a.num_kv_heads)
    writer.add_layer_norm_rms_eps(a.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    tokens = [*sorted(pre_tokenizers.ByteLevel.alphabet()), "<|im_start|>", "a", "b", "c"]
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3, 1, 1, 1])
    writer.add_token_merges([])
    writer.add_bos_token_id(256)
    writer.add_add_bos_token(True)
    writer.add_chat_template(TEMPLATE)
    layer = {
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
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for name, tensor in sorted(tiny_checkpoint(0).tensors.items()):
        if name.startswith("model.layers."):
            _, _, index, rest = name.split(".", 3)
            name = f"blk.{index}.{layer[rest.removesuffix('.weight')]}.weight"
        else:
            name = top[name]
        writer.add_tensor(name, tensor.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def counted(path: Path, opened: list[int]) -> Callable[[], GGUFReader]:
    """A lazy reader of `path` that counts its calls in `opened`."""
    lazy = open_lazily(path)

    def reader() -> GGUFReader:
        opened.append(1)
        return lazy()

    return reader


def test_a_second_load_reads_the_cache_and_equals_the_first(model_file: Path) -> None:
    opened: list[int] = []
    first = cached_checkpoint(model_file, counted(model_file, opened))
    tok_first = cached_tokenizer(model_file, counted(model_file, opened))
    assert len(opened) == 2
    entry = cache_dir() / gguf_key(model_file)
    assert sorted(p.name for p in entry.iterdir()) == [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_extra.json",
    ]  # and no temporary file left behind
    again = cached_checkpoint(model_file, counted(model_file, opened))
    tok_again = cached_tokenizer(model_file, counted(model_file, opened))
    assert len(opened) == 2  # the GGUF was not opened again
    assert again.args == first.args
    assert again.tensors.keys() == first.tensors.keys()
    for name, tensor in first.tensors.items():
        assert torch.equal(again.tensors[name], tensor), name
    text = "abc a<|im_start|>b"
    assert tok_again.encode(text) == tok_first.encode(text)
    assert tok_again.encode(text)[0] == 256  # add_bos survives the cache
    assert tok_again.chat_template == TEMPLATE
    assert tok_again.decode(tok_again.encode(text)) == tok_first.decode(tok_first.encode(text))


def test_the_architecture_is_read_from_the_header_or_the_entry_alone(model_file: Path) -> None:
    """What `orchestrator doctor` reads of a model: the GGUF's header (no tensor dequantised),
    or, once the cache has the model, the entry's metadata; both the loaded architecture."""
    from lanefold.backends.engine._weight_cache import cached_args
    from lanefold.backends.engine._weights import gguf_args, open_gguf

    assert cached_args(model_file) is None  # no entry yet
    loaded = cached_checkpoint(model_file, open_lazily(model_file)).args
    assert gguf_args(open_gguf(model_file)) == loaded == cached_args(model_file)
    entry = cache_dir() / gguf_key(model_file) / "model.safetensors"
    entry.write_bytes(entry.read_bytes()[:100])  # torn: no architecture, and no error
    assert cached_args(model_file) is None


def test_an_engine_from_the_cache_generates_what_the_first_load_did(model_file: Path) -> None:
    config = EngineConfig(model=str(model_file), device="cpu", num_blocks=64)
    params = SamplingParams(temperature=0.8, max_tokens=6)
    lanes = [LaneRequest(i, i, 6) for i in range(3)]
    cold = Engine.from_config(config)
    prompt = cold.tokenizer.encode("abcabc") if cold.tokenizer else []
    expected = [s.output_ids for s in cold.generate(prompt, params, lanes).sequences]
    assert (cache_dir() / gguf_key(model_file) / "model.safetensors").is_file()
    warm = Engine.from_config(config)
    assert [s.output_ids for s in warm.generate(prompt, params, lanes).sequences] == expected
    assert load_tokenizer(config).encode("abc") == prompt[:4]


def test_a_changed_file_gets_a_new_key(model_file: Path) -> None:
    key = gguf_key(model_file)
    assert gguf_key(model_file) == key
    stat = model_file.stat()
    os.utime(model_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert gguf_key(model_file) != key


@pytest.mark.parametrize("damaged", ["model.safetensors", "tokenizer.json", "tokenizer_extra.json"])
def test_a_corrupt_entry_is_logged_once_and_rebuilt(
    model_file: Path, damaged: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = cached_checkpoint(model_file, open_lazily(model_file))
    expected = cached_tokenizer(model_file, open_lazily(model_file)).encode("abc a")
    target = cache_dir() / gguf_key(model_file) / damaged
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])  # torn
    with caplog.at_level(logging.WARNING, logger="lanefold.engine"):
        again = cached_checkpoint(model_file, open_lazily(model_file))
        tokenizer = cached_tokenizer(model_file, open_lazily(model_file))
    warnings = [r for r in caplog.records if "unreadable" in r.getMessage()]
    assert len(warnings) == 1
    for name, tensor in first.tensors.items():
        assert torch.equal(again.tensors[name], tensor), name
    assert tokenizer.encode("abc a") == expected
    # rebuilt and stored again (the sound part kept): a third load reads both, opening nothing
    caplog.clear()
    opened: list[int] = []
    with caplog.at_level(logging.WARNING, logger="lanefold.engine"):
        cached_checkpoint(model_file, counted(model_file, opened))
        cached_tokenizer(model_file, counted(model_file, opened))
    assert not caplog.records
    assert not opened


# -- a model file that is not one is a config error naming backend.model ---------------------------


def _damaged(data: bytes) -> dict[str, bytes]:
    """The tiny GGUF broken the ways a download, a disk or a wrong file breaks one."""
    return {
        "empty": b"",
        "not-gguf": b"PK\x03\x04" + data[4:],
        "unknown-version": data[:4] + (99).to_bytes(4, "little") + data[8:],
        "header-only": data[:24],
        "cut-in-metadata": data[:200],
        "cut-in-tensors": data[: len(data) // 2],
        "last-bytes-lost": data[:-100],
        "metadata-scrambled": data[:40] + bytes(b ^ 0xFF for b in data[40:80]) + data[80:],
        "counts-absurd": data[:8] + b"\xff" * 8 + data[16:],
    }


DAMAGE = list(_damaged(b"\0" * 64))


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_gguf_is_a_config_error_naming_backend_model(
    damage: str, model_file: Path, tmp_path: Path
) -> None:
    # It used to be whatever the gguf reader raised: ValueError, IndexError, a traceback.
    path = tmp_path / f"{damage}.gguf"
    path.write_bytes(_damaged(model_file.read_bytes())[damage])
    config = EngineConfig(model=str(path), device="cpu", num_blocks=64)
    for load in (
        lambda: Engine.from_config(config),
        lambda: load_tokenizer(config),
        lambda: cached_checkpoint(path, open_lazily(path)),
    ):
        with pytest.raises(ConfigError) as caught:
            load()
        message = str(caught.value)
        assert message.startswith(f"backend.model: {path}"), message
        assert "\n" not in message and caught.value.__cause__ is None


@pytest.mark.parametrize("damage", ["empty", "not-gguf", "header-only", "cut-in-tensors"])
def test_the_command_says_so_in_one_line_and_creates_no_run(
    damage: str, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    path = tmp_path / f"{damage}.gguf"
    path.write_bytes(_damaged(model_file.read_bytes())[damage])
    config = tmp_path / "loop.toml"
    config.write_text(
        f'[loop]\nk = 2\n[backend]\nkind = "engine"\nmodel = "{path}"\ndevice = "cpu"\nnum_blocks = 64\n'
    )
    code = main(["run", str(config), "--question", "q?", "--runs-dir", str(tmp_path / "runs")])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "backend.model: " in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
    if damage in ("empty", "not-gguf"):  # a wrong header: seen by validate (and preflight) too
        assert main(["validate", str(config)]) == 2
        assert f"{config}: backend.model: {path}: not a GGUF file" in capsys.readouterr().err


def test_a_broken_hugging_face_folder_names_backend_model(tmp_path: Path) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", "vocab_size": ')
    with pytest.raises(
        ConfigError,
        match=rf"^backend\.model: {re.escape(str(folder))}: no "
        r"tokenizer\.json$",
    ):
        Engine.from_config(EngineConfig(model=str(folder), device="cpu", num_blocks=64))
    with pytest.raises(
        ConfigError,
        match=rf"^backend\.model: {re.escape(str(folder))} is not a "
        r"readable model file \(JSONDecodeError: ",
    ):
        load_checkpoint(folder)


@pytest.mark.parametrize("damage", ["not-gguf", "cut-in-tensors"])
def test_serve_says_so_in_one_line_before_serving(
    damage: str, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    path = tmp_path / f"{damage}.gguf"
    path.write_bytes(_damaged(model_file.read_bytes())[damage])
    backend = tmp_path / "backend.toml"
    backend.write_text(f'[backend]\nkind = "engine"\nmodel = "{path}"\ndevice = "cpu"\n')
    assert main(["serve", "--backend-config", str(backend), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("orchestrator serve: ") and f"backend.model: {path}" in err
