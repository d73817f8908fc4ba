"""Where the engine keeps what it can reuse between processes, under the library's cache folder.

`${LANEFOLD_CACHE:-~/.cache/lanefold}/engine/` holds three kinds of entry: a GGUF's dequantised
tensors and tokenizer (`<key>/`, `_weight_cache.py`), numba's compiled kernels (`numba/`,
`_compiled.py`) and the decode paths chosen for a machine, model, dtype and thread count
(`paths/<key>.json`, `_decode_paths.py`). Each is rebuilt when missing or unreadable; a folder
that cannot be written costs later loads time and nothing else. Delete it to reclaim the space.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ("cache_dir", "cache_root")


def cache_root() -> Path:
    """The library's cache folder: `${LANEFOLD_CACHE:-~/.cache/lanefold}`."""
    root = os.environ.get("LANEFOLD_CACHE") or str(Path("~/.cache/lanefold").expanduser())
    return Path(root).expanduser()


def cache_dir() -> Path:
    """Where the engine's cache entries live: `${LANEFOLD_CACHE:-~/.cache/lanefold}/engine`."""
    return cache_root() / "engine"
