"""Holding a lane to a JSON schema: the schema compiled once, each lane's own matcher, the mask.

A schema's text is compiled by llguidance (chosen against xgrammar and outlines-core by what
each costs on SmolLM2's vocabulary, docs/engine.md#constrained-decoding) into a matcher at the
schema's start, once per distinct text, kept in a small cache. Each lane holds its own copy of
that matcher (a copy costs under a microsecond), advanced by the lane's own tokens: the K forks
of one prompt share the compiled grammar and each keeps its own place in it. Before a sampling
step every held lane fills its row of a bitmask (a bit per token id: may come next) and the
sampler draws only among the allowed ids. A lane ends once nothing but end-of-sequence may
follow its text (`LaneGrammar.advance`).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from lanefold.primitives import ConfigError

if TYPE_CHECKING:
    import llguidance

    from lanefold.backends.engine._tokenizer import Tokenizer

__all__ = ("CACHE_SIZE", "Grammar", "Grammars", "LaneGrammar", "allowed_tokens")

CACHE_SIZE = 64  # compiled schemas kept per engine (one is ~1 ms to compile again)

# How a value is written: as `json.dumps` writes it (", " between items, ": " after a key) and no
# other whitespace, so a small model cannot spend its tokens on newlines and indents. A schema's
# own "x-guidance" options override these (llguidance reads them from the schema).
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# The end-of-sequence token the grammar library is told of where the model has none (it needs
# one): an added token just past the tokenizer's vocabulary, never sampled (masked off).
_PHANTOM_EOS = "<|lanefold-end-of-value|>"


@dataclass(slots=True, eq=False)
class Grammar:
    """One schema compiled: the matcher at its start, which every lane held to it copies."""

    schema: str
    start: llguidance.LLMatcher
    words: int  # int32 words in one row of the bitmask
    phantom_eos: int | None  # the id masked off where the model has no end-of-sequence token
    _first_row: Tensor | None = None  # the mask at the start, the same for every lane

    def lane(self) -> LaneGrammar:
        """A fresh lane's matcher: a copy of the start, advanced by that lane alone."""
        return LaneGrammar(self, self.start.deep_copy())

    def first_row(self) -> Tensor:
        """The bitmask row at the start, filled once (the K forks of a prompt all begin here)."""
        if self._first_row is None:
            row = torch.empty(self.words, dtype=torch.int32)
            self.start.deep_copy().unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
            self._first_row = row
        return self._first_row


@dataclass(slots=True, eq=False)
class LaneGrammar:
    """A lane's place in its schema's grammar."""

    grammar: Grammar
    matcher: llguidance.LLMatcher
    consumed: int = field(default=0)

    def fill(self, row: Tensor) -> None:
        """Write which token ids may come next into `row` (int32, contiguous, on the CPU)."""
        if self.consumed == 0:
            row.copy_(self.grammar.first_row())
        else:
            self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)

    def advance(self, token: int) -> bool:
        """Take the lane's sampled token; True once nothing but end-of-sequence may follow (the
        value is complete), or the matcher refused the token (`error`)."""
        self.consumed += 1
        self.matcher.consume_token(token)
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        """Why the matcher stopped in error ("" where it did not)."""
        return self.matcher.get_error()


class Grammars:
    """The schemas one model's lanes are held to, each compiled once (the most recent
    `capacity` kept), against the model's vocabulary and end-of-sequence ids."""

    def __init__(
        self, tokenizer: Tokenizer, vocab_size: int, eos_ids: Sequence[int], capacity: int = CACHE_SIZE
    ) -> None:
        self.vocab_size = vocab_size
        self.capacity = capacity
        self._tokenizer = tokenizer
        self._eos = list(eos_ids)
        self._lock = threading.Lock()
        self._compiled: OrderedDict[str, Grammar] = OrderedDict()
        self._library: tuple[llguidance.LLTokenizer, int, int | None] | None = None

    def compile(self, schema: str) -> Grammar:
        """`schema` (JSON Schema as JSON text) compiled, from the cache where it is there.

        Raises ConfigError, in one line, where the text is not a JSON object or the schema
        does not compile (an unknown type or format, a bad pattern, an unsatisfiable schema)."""
        with self._lock:
            found = self._compiled.get(schema)
            if found is not None:
                self._compiled.move_to_end(schema)
                return found
            grammar = self._compile(schema)
            self._compiled[schema] = grammar
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
            return grammar

    def _compile(self, schema: str) -> Grammar:
        import llguidance

        try:
            parsed = json.loads(schema)
        except ValueError as exc:
            raise ConfigError(f"schema: not JSON text ({exc})") from None
        if not isinstance(parsed, dict):
            raise ConfigError(f"schema: a JSON Schema is an object, not {_json_type(parsed)}")
        tokenizer, words, phantom = self._prepared()
        try:
            text = llguidance.LLMatcher.grammar_from_json_schema(parsed, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"schema: {_one_line(str(exc))}") from None
        start = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if start.is_error():
            raise ConfigError(f"schema: {_one_line(start.get_error())}")
        return Grammar(schema, start, words, phantom)

    def _prepared(self) -> tuple[llguidance.LLTokenizer, int, int | None]:
        """The library's view of the vocabulary (built once: ~0.7 s for SmolLM2's 49152
        tokens), the words of a mask row, and the phantom end-of-sequence id if any."""
        if self._library is None:
            try:
                import llguidance
            except ImportError:
                raise ConfigError(
                    "schema: constrained decoding needs llguidance: pip install 'lanefold[engine]'"
                ) from None
            data = json.loads(self._tokenizer.backend.to_str())
            size = self._tokenizer.backend.get_vocab_size(with_added_tokens=True)
            eos: list[int] = self._eos
            phantom = None
            if not eos:  # told of none, the library would take id 0 (a real token) as the end
                phantom = size
                data.setdefault("added_tokens", []).append(
                    {"id": size, "content": _PHANTOM_EOS, "single_word": False, "lstrip": False}
                    | {"rstrip": False, "normalized": False, "special": True}
                )
                size, eos = size + 1, [phantom]
            width = max(self.vocab_size, size)
            try:
                tokenizer = llguidance.LLTokenizer(json.dumps(data), n_vocab=width, eos_token=eos)
            except ValueError as exc:
                raise ConfigError(f"schema: the model's tokenizer: {_one_line(str(exc))}") from None
            self._library = tokenizer, (width + 31) // 32, phantom
        return self._library

    def __len__(self) -> int:
        return len(self._compiled)


def allowed_tokens(lanes: Sequence[LaneGrammar | None], vocab: int, device: torch.device) -> Tensor | None:
    """`[lanes, vocab]` booleans, True where a token may come next: each held lane's row from its
    matcher, every id for a lane held to nothing; None where no lane is held (nothing to mask)."""
    held = [(row, lane) for row, lane in enumerate(lanes) if lane is not None]
    if not held:
        return None
    grammar = held[0][1].grammar
    bits = torch.full((len(lanes), grammar.words), -1, dtype=torch.int32)
    for row, lane in held:
        lane.fill(bits[row])
    if device.type == "cpu" and sys.byteorder == "little":
        # token 32w + j is bit j of word w: byte 4w + j // 8, bit j % 8 of it, little-endian
        # (numpy unpacks the bits of a step's 8 rows of SmolLM2 in ~10 us, torch's shifts ~150)
        unpacked = np.unpackbits(bits.numpy().view(np.uint8), axis=1, count=vocab, bitorder="little")
        allowed = torch.from_numpy(unpacked).view(torch.bool)
    else:  # on the GPU: the packed rows cross, 32 times smaller, and unpack there
        shifts = torch.arange(32, dtype=torch.int32, device=device)
        allowed = ((bits.to(device)[:, :, None] >> shifts) & 1).view(len(lanes), -1)[:, :vocab].bool()
    if grammar.phantom_eos is not None and grammar.phantom_eos < vocab:
        allowed[[row for row, _ in held], grammar.phantom_eos] = False
    return allowed


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
