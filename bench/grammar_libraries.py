"""Benchmark: the three grammar libraries the engine could hold a lane to a JSON schema with.

llguidance, xgrammar and outlines-core, each built offline from SmolLM2's own tokenizer (the
`tokenizers` object `backends/engine/_tokenizer.py` builds from the GGUF's vocabulary: no hub
download), over three schemas: a tool call (an `anyOf` of three tools), `{"answer": integer}`,
and a nested object with arrays. For each it times the tokenizer's preparation, the schema's
compilation, and one decode step's work at K = 1 and K = 8 lanes: every lane's next-token
bitmask filled and its token consumed, along a valid output (the schema's example, tokenized),
median (and the worst) over the output's steps. A library that is not installed is skipped with a line.

    python bench/grammar_libraries.py            # SmolLM2, every installed library
    python bench/grammar_libraries.py --reps 5
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cpu import cpu_kind  # bench/_cpu.py: the flags that decide the kernels

from lanefold.backends.engine import EngineConfig
from lanefold.backends.engine._engine import load_tokenizer
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.backends.engine._weights import gguf_args, open_gguf, resolve_model_path


def _tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": name},
            "arguments": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


SCHEMAS: dict[str, tuple[dict[str, Any], object]] = {
    "tool call (anyOf 3)": (
        {
            "anyOf": [
                _tool(
                    "get_weather",
                    {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                    ["city"],
                ),
                _tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
                _tool(
                    "search",
                    {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
                    ["query"],
                ),
            ]
        },
        {"name": "get_weather", "arguments": {"city": "San Francisco", "unit": "celsius"}},
    ),
    "answer integer": (
        {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
        {"answer": 1234},
    ),
    "nested + arrays": (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "authors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}, "year": {"type": "integer"}},
                        "required": ["name", "year"],
                        "additionalProperties": False,
                    },
                },
                "tags": {"type": "array", "items": {"type": "string"}},
                "score": {"type": "number"},
            },
            "required": ["title", "authors", "tags", "score"],
            "additionalProperties": False,
        },
        {
            "title": "Self-consistency over tool calls",
            "authors": [{"name": "Ada Lovelace", "year": 1843}, {"name": "Alan Turing", "year": 1950}],
            "tags": ["llm", "voting", "json"],
            "score": 0.875,
        },
    ),
}


@dataclass
class Library:
    """One library's way to a compiled schema and a lane's matcher over SmolLM2's vocabulary."""

    name: str
    prepare: Callable[[], object]  # the tokenizer's preparation, once per model
    compile: Callable[[object, str], object]  # (prepared, schema text) -> compiled grammar
    matcher: Callable[[object], Any]  # compiled -> a fresh lane state
    fill: Callable[[Any, torch.Tensor, int], None]  # (state, bitmask, row): the row's mask
    consume: Callable[[Any, int], bool]


def _byte_vocab(tokenizer: Tokenizer, size: int) -> list[bytes]:
    """Each id's bytes (the byte-level BPE alphabet mapped back), special tokens as b""."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda c: ord(c))
    # GPT-2's byte <-> char table: printable bytes map to themselves, the rest to 256 + n
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = dict.fromkeys(alphabet)
    table: dict[str, int] = {}
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    assert set(table) == set(chars)
    special = {t.content for t in tokenizer.backend.get_added_tokens_decoder().values()}
    out: list[bytes] = []
    for i in range(size):
        piece = tokenizer.backend.id_to_token(i)
        out.append(b"" if piece is None or piece in special else bytes(table[c] for c in piece))
    return out


def libraries(tokenizer: Tokenizer, vocab: int, eos: list[int]) -> list[Library]:
    found: list[Library] = []
    if importlib.util.find_spec("llguidance"):
        import llguidance
        import llguidance.torch

        options: Any = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

        def lg_compile(tok: object, schema: str) -> object:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=options)
            return llguidance.LLMatcher(tok, grammar)  # type: ignore[arg-type]

        found.append(
            Library(
                "llguidance " + importlib.metadata.version("llguidance"),
                lambda: llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab, eos_token=eos),
                lg_compile,
                lambda c: c.deep_copy(),  # type: ignore[attr-defined]
                lambda m, mask, row: llguidance.torch.fill_next_token_bitmask(m, mask, row),
                lambda m, t: m.consume_token(t),
            )
        )
    else:
        print("llguidance: not installed, skipped")
    if importlib.util.find_spec("xgrammar"):
        import xgrammar

        def xg_prepare() -> object:
            info = xgrammar.TokenizerInfo(
                _byte_vocab(tokenizer, vocab),
                xgrammar.VocabType.RAW,
                vocab_size=vocab,
                stop_token_ids=eos,
            )
            return xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

        found.append(
            Library(
                "xgrammar " + importlib.metadata.version("xgrammar"),
                xg_prepare,
                lambda compiler, schema: compiler.compile_json_schema(  # type: ignore[attr-defined]
                    schema, any_whitespace=False, separators=(", ", ": ")
                ),
                lambda c: xgrammar.GrammarMatcher(c),
                lambda m, mask, row: m.fill_next_token_bitmask(mask, row),
                lambda m, t: m.accept_token(t),
            )
        )
    else:
        print("xgrammar: not installed, skipped")
    if importlib.util.find_spec("outlines_core"):
        import outlines_core

        def oc_prepare() -> object:
            pieces: dict[bytes, list[int]] = {}
            for i, piece in enumerate(_byte_vocab(tokenizer, vocab)):
                if piece and i not in eos:
                    pieces.setdefault(piece, []).append(i)
            return outlines_core.Vocabulary(eos[0], pieces)

        def oc_compile(vocabulary: object, schema: str) -> object:
            regex = outlines_core.json_schema.build_regex_from_schema(
                schema, r"[ ]?"
            )  # ", " and ": " as the others
            return outlines_core.Index(regex, vocabulary)

        found.append(
            Library(
                "outlines-core " + importlib.metadata.version("outlines-core"),
                oc_prepare,
                oc_compile,
                lambda index: outlines_core.Guide(index),
                lambda g, mask, row: g.write_mask_into(mask[row].data_ptr(), mask.shape[1], 4),
                lambda g, t: bool(g.advance(t)) or True,
            )
        )
    else:
        print("outlines-core: not installed, skipped")
    return found


def step_times(lib: Library, compiled: object, ids: list[int], k: int, vocab: int) -> list[float]:
    """Each step's time to fill K lanes' masks and consume their token, along `ids`."""
    lanes = [lib.matcher(compiled) for _ in range(k)]
    mask = torch.zeros((k, (vocab + 31) // 32), dtype=torch.int32)
    times = []
    for token in ids:
        start = time.perf_counter()
        for row, lane in enumerate(lanes):
            lib.fill(lane, mask, row)
        allowed = bool((mask[0, token // 32] >> (token % 32)) & 1)
        for lane in lanes:
            lib.consume(lane, token)
        times.append(time.perf_counter() - start)
        assert allowed, f"{lib.name}: token {token} of the example is masked"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="compilations timed per schema")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = resolve_model_path("smollm2-135m")
    model = gguf_args(open_gguf(path))
    tokenizer = load_tokenizer(EngineConfig())
    vocab, eos = model.vocab_size, list(model.eos_token_ids)
    print(cpu_kind())
    print(f"python {platform.python_version()}, SmolLM2-135M vocabulary {vocab}, EOS {eos}, one thread")
    print(
        f"{'library':<22} {'prepare s':>9} {'schema':<20} {'compile ms':>10} "
        f"{'step K=1 us':>11} {'step K=8 us':>11} {'worst K=8':>11} {'steps':>5}"
    )
    for lib in libraries(tokenizer, vocab, eos):
        start = time.perf_counter()
        prepared = lib.prepare()
        prepare_s = time.perf_counter() - start
        for label, (schema, example) in SCHEMAS.items():
            text = json.dumps(schema)
            compiles = []
            for _ in range(args.reps):
                start = time.perf_counter()
                compiled = lib.compile(prepared, text)
                compiles.append(time.perf_counter() - start)
            ids = tokenizer.backend.encode(json.dumps(example)).ids
            one = step_times(lib, compiled, ids, 1, vocab)
            eight = step_times(lib, compiled, ids, 8, vocab)
            print(
                f"{lib.name:<22} {prepare_s:9.2f} {label:<20} {statistics.median(compiles) * 1e3:10.1f} "
                f"{statistics.median(one) * 1e6:11.0f} {statistics.median(eight) * 1e6:11.0f} "
                f"{max(eight) * 1e6:11.0f} {len(ids):5d}"
            )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
