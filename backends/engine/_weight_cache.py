"""A disk cache of what loading a GGUF file costs: its dequantised tensors and its tokenizer.

Dequantising SmolLM2's GGUF takes seconds and parsing its metadata (vocabulary, merges) more;
reading the result back from a safetensors file and a `tokenizer.json` takes a fraction of one.
Entries live under `${LANEFOLD_CACHE:-~/.cache/lanefold}/engine/<key>/`, keyed by the file's
size, modification time and a hash of its first and last MiB (cheap, and any rewrite of a GGUF
changes its header or its tail), plus the layout version below. Every file is written to a
temporary name and renamed into place, so a reader sees a whole file or none; an entry that
does not read back (truncated, edited, from another version) is logged once, removed and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lanefold.backends.engine._cache_folder import cache_dir
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.backends.engine._weights import (
    Checkpoint,
    ModelArgs,
    gguf_field,
    load_checkpoint,
    open_gguf,
    reading_model,
)
from lanefold.primitives import get_logger

if TYPE_CHECKING:
    from gguf import GGUFReader

__all__ = ("cache_dir", "cached_args", "cached_checkpoint", "cached_tokenizer", "gguf_key", "open_lazily")

_LAYOUT = 1  # bump when what is stored for a GGUF changes (names, un-permutation, fields)
_EDGE = 1 << 20  # bytes hashed at each end of the file
_WEIGHTS, _TOKENIZER = "model.safetensors", "tokenizer.json"
_TOKENIZER_EXTRA = "tokenizer_extra.json"  # what tokenizer.json cannot say: template, BOS
_T = TypeVar("_T")


def gguf_key(path: Path) -> str:
    """A key that changes whenever the file does: size, mtime, and its two end MiB hashed."""
    stat = path.stat()
    digest = hashlib.sha256(f"{_LAYOUT}:{stat.st_size}:{stat.st_mtime_ns}:".encode())
    with path.open("rb") as f:
        digest.update(f.read(_EDGE))
        f.seek(max(0, stat.st_size - _EDGE))
        digest.update(f.read(_EDGE))
    return digest.hexdigest()[:32]


def cached_checkpoint(path: Path, reader: Callable[[], GGUFReader]) -> Checkpoint:
    """The GGUF's checkpoint from the cache, or loaded from `reader()` and stored there."""
    with reading_model(path):
        return _through_cache(path, (_WEIGHTS,), _read_checkpoint, lambda: _write_checkpoint(path, reader()))


def cached_tokenizer(path: Path, reader: Callable[[], GGUFReader]) -> Tokenizer:
    """The GGUF's tokenizer from the cache, or built from `reader()` and stored there."""
    with reading_model(path):
        return _through_cache(
            path,
            (_TOKENIZER, _TOKENIZER_EXTRA),
            _read_tokenizer,
            lambda: _write_tokenizer(reader()),
        )


def _through_cache(
    path: Path,
    files: tuple[str, ...],
    read: Callable[[Path], _T],
    build: Callable[[], tuple[_T, Callable[[Path], None]]],
) -> _T:
    """`read` the entry if its marker (`files[0]`, written last) is there, else `build` and
    store; an entry that fails to read loses its `files` and is built again."""
    entry = cache_dir() / gguf_key(path)
    log = get_logger("lanefold.engine", model=str(path))
    if (entry / files[0]).is_file():
        try:
            return read(entry)
        except Exception as exc:  # whatever broke (torn, edited, old), the entry is rebuilt
            log.warning("engine cache entry unreadable; rebuilding", entry=str(entry), error=repr(exc))
            for name in files:
                (entry / name).unlink(missing_ok=True)
    value, write = build()
    try:
        entry.mkdir(parents=True, exist_ok=True)
        write(entry)
    except OSError as exc:  # a read-only or full disk costs the next load time, nothing else
        log.warning("engine cache not written", entry=str(entry), error=repr(exc))
    return value


def _atomic(target: Path, write: Callable[[Path], object]) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _read_checkpoint(entry: Path) -> Checkpoint:
    from safetensors.torch import load_file

    return Checkpoint(_read_args(entry), load_file(entry / _WEIGHTS))


def _read_args(entry: Path) -> ModelArgs:
    from safetensors import safe_open

    with safe_open(entry / _WEIGHTS, "pt") as f:
        meta = f.metadata()
    fields: dict[str, Any] = json.loads(meta["args"])
    fields["eos_token_ids"] = tuple(fields["eos_token_ids"])
    return ModelArgs(**fields)


def cached_args(path: Path) -> ModelArgs | None:
    """The architecture of the GGUF at `path` as its cache entry records it (the entry's
    metadata alone: milliseconds, where parsing the GGUF's header takes seconds); None where
    there is no entry, or it does not read back."""
    entry = cache_dir() / gguf_key(path)
    try:
        return _read_args(entry) if (entry / _WEIGHTS).is_file() else None
    except Exception:  # a torn or foreign entry: the next load rebuilds it
        return None


def _write_checkpoint(path: Path, reader: GGUFReader) -> tuple[Checkpoint, Callable[[Path], None]]:
    from safetensors.torch import save_file

    checkpoint = load_checkpoint(path, reader)
    meta = {"args": json.dumps(asdict(checkpoint.args)), "layout": str(_LAYOUT)}

    def write(entry: Path) -> None:
        _atomic(entry / _WEIGHTS, lambda tmp: save_file(checkpoint.tensors, tmp, metadata=meta))

    return checkpoint, write


def _read_tokenizer(entry: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    extra = json.loads((entry / _TOKENIZER_EXTRA).read_text())
    return Tokenizer(
        Backend.from_file(str(entry / _TOKENIZER)),
        chat_template=extra["chat_template"],
        bos_token_id=extra["bos_token_id"],
        add_bos=extra["add_bos"],
    )


def _write_tokenizer(reader: GGUFReader) -> tuple[Tokenizer, Callable[[Path], None]]:
    tokenizer = Tokenizer.from_gguf(reader)
    extra = {
        "chat_template": tokenizer.chat_template,
        "bos_token_id": tokenizer.bos_token_id,
        "add_bos": bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
    }

    def write(entry: Path) -> None:
        # the extras first: tokenizer.json is the marker a reader looks for
        _atomic(entry / _TOKENIZER_EXTRA, lambda tmp: tmp.write_text(json.dumps(extra)))
        _atomic(entry / _TOKENIZER, lambda tmp: tokenizer.backend.save(str(tmp)))

    return tokenizer, write


def open_lazily(path: Path) -> Callable[[], GGUFReader]:
    """A reader of `path` opened on first call and kept (opening parses all its metadata)."""
    opened: list[GGUFReader] = []

    def reader() -> GGUFReader:
        if not opened:
            opened.append(open_gguf(path))
        return opened[0]

    return reader
