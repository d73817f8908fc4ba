"""Text to token ids and back, built from the checkpoint itself (no hub download).

A GGUF file carries its byte-level BPE vocabulary, merges and chat template; a Hugging Face
folder carries `tokenizer.json` and `tokenizer_config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanefold.primitives import ConfigError

if TYPE_CHECKING:
    import tokenizers
    from gguf import GGUFReader

__all__ = ("Tokenizer",)

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types that are added tokens, not BPE pieces


class Tokenizer:
    """Encodes prompts (optionally through the chat template) and decodes generated ids."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        chat_template: str | None = None,
        bos_token_id: int | None = None,
        add_bos: bool = False,
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self._prefix = [bos_token_id] if add_bos and bos_token_id is not None else []

    @classmethod
    def from_gguf(cls, reader: GGUFReader) -> Tokenizer:
        """Build the byte-level BPE tokenizer stored in a GGUF file's metadata."""
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as Backend

        from lanefold.backends.engine._weights import gguf_field

        kind, pre = (
            gguf_field(reader, "tokenizer.ggml.model"),
            gguf_field(reader, "tokenizer.ggml.pre"),
        )
        if kind != "gpt2" or pre not in ("smollm", "gpt2", "default"):
            raise ConfigError(f"GGUF tokenizer {kind!r}/{pre!r} is not supported (gpt2/smollm BPE)")
        tokens: list[str] = gguf_field(reader, "tokenizer.ggml.tokens")
        types: list[int] = gguf_field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges", [])]
        backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        # llama.cpp's "smollm" pre-tokenizer splits every digit on its own before the GPT-2 regex.
        backend.pre_tokenizer = (
            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
            if pre == "smollm"
            else byte_level
        )
        backend.decoder = decoders.ByteLevel()
        backend.add_tokens(
            [
                AddedToken(t, special=ty == _CONTROL, normalized=False)
                for t, ty in zip(tokens, types, strict=True)
                if ty in (_CONTROL, _USER_DEFINED)
            ]
        )
        return cls(
            backend,
            chat_template=gguf_field(reader, "tokenizer.chat_template"),
            bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
            add_bos=bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
        )

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        """Load `tokenizer.json` (its post-processor adds BOS where the model wants it)."""
        from tokenizers import Tokenizer as Backend

        from lanefold.backends.engine._weights import reading_model

        with reading_model(folder):
            if not (folder / "tokenizer.json").is_file():
                raise ConfigError("no tokenizer.json")
            config_file = folder / "tokenizer_config.json"
            config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}
            template = config.get("chat_template")
            return cls(
                Backend.from_file(str(folder / "tokenizer.json")),
                chat_template=template if isinstance(template, str) else None,
            )

    def encode(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of `text`; `chat` wraps it as one user turn of the chat template first."""
        if chat:
            text = self.render_chat(text)
        return self._prefix + self.backend.encode(text).ids

    def encode_chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """Token ids of a conversation of (role, content) turns rendered by the chat template,
        ending where the assistant speaks."""
        return self._prefix + self.backend.encode(self.render_chat(messages)).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens left out."""
        return self.backend.decode(ids, skip_special_tokens=True)

    def render_chat(self, prompt: str | Sequence[tuple[str, str]]) -> str:
        """The chat template applied to one user message (or to (role, content) turns), ending
        where the assistant speaks."""
        turns = [("user", prompt)] if isinstance(prompt, str) else list(prompt)
        if not self.chat_template:
            raise ConfigError("chat_template = true but the model has no chat template")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ConfigError(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=[{"role": role, "content": content} for role, content in turns],
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
        )
