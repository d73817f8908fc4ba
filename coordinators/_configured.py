"""The reducer a built-in loop's `[loop]` keys name, found from its params alone."""

from __future__ import annotations

from pydantic import BaseModel

from lanefold.coordinators._reducer_keys import recorded_name
from lanefold.primitives import LOOPS, loop_reducer

__all__ = ("configured_reducer",)


def configured_reducer(params: BaseModel) -> str | None:
    """The reducer a loop's `[loop]` keys name for the run's own reduce, by the name its
    `reduce.completed` records; "" for a loop configured to answer without one; None where
    the loop (a plug-in) picks reducers itself. `fold` refuses a reduce by another."""
    for _, loop in LOOPS.items():
        if loop.Params is type(params):
            choice = loop_reducer(loop, params)
            if choice is None:
                return None
            return recorded_name(choice.name) if choice.name else ""
    return None
