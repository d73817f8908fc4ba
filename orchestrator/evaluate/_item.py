"""One question of a dataset, with its gold answer and where it came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lanefold.primitives import ToolSpec

__all__ = ("Item",)


@dataclass(frozen=True, slots=True)
class Item:
    """A dataset row: its position, the question, the gold answer (None where a scorer
    decides, as HumanEval's tests do) and what else the scorer needs (`meta`). `tools` are
    the functions its run may call (a BFCL entry's own), given to `Session.run(tools=)`."""

    index: int
    question: str
    answer: str | None
    meta: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""  # file and line (or archive member) it came from, for errors
    tools: tuple[ToolSpec, ...] = ()
