"""Text to token ids and back, built from the checkpoint itself (no hub download).

A GGUF file carries its byte-level BPE vocabulary, merges and chat template; a Hugging Face
folder carries `tokenizer.json` and `tokenizer_config.json`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lanefold.primitives import ChatMessage, ConfigError, ToolSpec, call_arguments, offered_tools, tool_turns

if TYPE_CHECKING:
    import jinja2
    import tokenizers
    from gguf import GGUFReader

__all__ = ("Tokenizer", "Turn")

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

    def encode_chat(
        self,
        messages: Sequence[Turn],
        *,
        tools: Sequence[ToolSpec] = (),
        tool_choice: str | None = None,
    ) -> list[int]:
        """Token ids of a conversation rendered by the chat template (`render_chat`), ending
        where the assistant speaks."""
        return self._prefix + self.backend.encode(self.render_chat(messages, tools, tool_choice)).ids

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens left out."""
        return self.backend.decode(ids, skip_special_tokens=True)

    def render_chat(
        self, prompt: str | Sequence[Turn], tools: Sequence[ToolSpec] = (), tool_choice: str | None = None
    ) -> str:
        """The chat template applied to one user message (or to a conversation of turns, each
        a `ChatMessage` or a (role, content) pair), ending where the assistant speaks.

        A template that takes `tools` (`takes_tools`) is given the tools `tool_choice` offers
        and the turns as Hugging Face's templates read them (an assistant's `tool_calls`, a
        tool turn's `tool_call_id`); any other gets `tool_turns`' plain turns, the tools in its
        system turn (one format for every backend, `lanefold.primitives.tool_turns`)."""
        turns = [ChatMessage("user", prompt)] if isinstance(prompt, str) else [_turn(t) for t in prompt]
        if not self.chat_template:
            raise ConfigError("chat_template = true but the model has no chat template")
        template, takes_tools = _compiled(self.chat_template)
        if takes_tools:
            offered = [tool.to_openai() for tool in offered_tools(tools, tool_choice)]
            return template.render(
                messages=[_template_turn(turn) for turn in turns],
                tools=offered or None,
                add_generation_prompt=True,
                bos_token="",
                eos_token="",
            )
        return template.render(
            messages=[{"role": t.role, "content": t.content} for t in tool_turns(turns, tools, tool_choice)],
            add_generation_prompt=True,
            bos_token="",
            eos_token="",
        )

    @property
    def takes_tools(self) -> bool:
        """Whether the chat template reads a `tools` variable (Qwen2.5's, Llama 3.1's, Hermes'
        do; SmolLM2's does not), found from the template's own text."""
        return bool(self.chat_template) and _compiled(self.chat_template or "")[1]


Turn = ChatMessage | tuple[str, str]
"""A turn of a conversation the tokenizer renders."""


def _turn(turn: Turn) -> ChatMessage:
    return turn if isinstance(turn, ChatMessage) else ChatMessage(*turn)


def _template_turn(turn: ChatMessage) -> dict[str, object]:
    """A turn as Hugging Face's chat templates read it: a call's `arguments` as an object (the
    templates write it with `tojson`), a tool turn's `tool_call_id` and `name` where known."""
    message: dict[str, object] = {"role": turn.role, "content": turn.content}
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call_arguments(call)},
            }
            for call in turn.tool_calls
        ]
    if turn.tool_call_id is not None:
        message["tool_call_id"] = turn.tool_call_id
    if turn.name is not None:
        message["name"] = turn.name
    return message


def _tojson(
    value: object, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    """Hugging Face's `tojson` for chat templates: plain JSON, not Jinja's HTML-escaped one."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compiled(text: str) -> tuple[jinja2.Template, bool]:
    """A chat template compiled once per text, and whether it reads `tools`."""
    from jinja2 import meta
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ConfigError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = _tojson
    return env.from_string(text), "tools" in meta.find_undeclared_variables(env.parse(text))
