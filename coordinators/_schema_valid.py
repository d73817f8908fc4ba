"""schema_valid: the built-in verifier that passes a lane whose call or JSON value is valid.

Whether a call is valid (one of the run's tools, its arguments valid under that tool's
parameters) or a value is (valid under `[extract] schema`) is decided once, by the extractor
(`lanefold.primitives.read_answer`): a structured lane has an answer exactly where it is valid,
and its `lane.completed` says why where it is not. This verifier gives that verdict to the
reducers that rank by one: `any_pass` with it is best-of-k by validity, the first valid call.
"""

from __future__ import annotations

import json
from typing import ClassVar

from lanefold.primitives import Verdict, register_verifier

__all__ = ("SchemaValid",)


@register_verifier("schema_valid")
class SchemaValid:
    """Score 1 (passed) for a lane with a valid call or JSON value, 0 for one without."""

    name = "schema_valid"
    # It reads structured answers only: with any other extractor it would pass any answer.
    extract_methods: ClassVar[frozenset[str]] = frozenset({"json", "tool_call"})

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        """Passed where the extractor read a valid call or value from the lane's text."""
        if answer is None:
            return Verdict(
                0.0, False, "no valid call or value in the lane's text (its answer_error says why)"
            )
        try:
            json.loads(answer)
        except ValueError:
            return Verdict(0.0, False, "the answer is not a call or a JSON value")
        return Verdict(1.0, True, "valid")
