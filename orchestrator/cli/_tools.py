"""`orchestrator run --tools FILE`: the run's tools, read from a JSON file.

The file holds OpenAI's `tools` list (`[{"type": "function", "function": {...}}, ...]`, bare
functions accepted). A file that cannot be read, is not JSON or holds no valid tools is refused
in one line naming the file (and the line, or the tool and field), before any run is created.
"""

from __future__ import annotations

import json
from pathlib import Path

from lanefold.primitives import ConfigError, ToolSpec, parse_tools

__all__ = ("read_tools",)


def read_tools(path: str) -> tuple[ToolSpec, ...]:
    """The tools in the JSON file `path` (ConfigError naming the place when it has none)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"--tools: cannot read {path}: {reason}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from None
    if isinstance(raw, dict) and isinstance(raw.get("tools"), list):
        raw = raw["tools"]  # a request body's `tools`, as OpenAI's API takes it
    return parse_tools(raw, where=f"{path}: tools")
