"""The bundled prefix-sharing inference engine (optional extra `[engine]`).

Importing this package imports no torch: `EngineConfig` is plain pydantic, and `EngineBackend`
(which needs torch, tokenizers and gguf) is imported on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lanefold.backends.engine._config import EngineConfig, resolve_model_path

if TYPE_CHECKING:
    from lanefold.backends.engine._backend import EngineBackend

__all__ = ("EngineBackend", "EngineConfig", "resolve_model_path")


def __getattr__(name: str) -> object:
    if name == "EngineBackend":
        from lanefold.backends.engine._backend import EngineBackend

        return EngineBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
