"""The facade's defaults, named once: the one place under `orchestrator/` that names a built-in
plug-in. Everything else finds plug-ins through their registries."""

from __future__ import annotations

__all__ = ("DEFAULT_EXECUTOR", "DEFAULT_STORE")

DEFAULT_STORE = "files"  # the store a command opens without a URL (`runs_dir`)
DEFAULT_EXECUTOR = "local"  # where a Session's questions run when none is named: here
