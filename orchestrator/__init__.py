"""orchestrator"""

from __future__ import annotations

__all__: tuple[str, ...] = ()
