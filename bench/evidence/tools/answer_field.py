"""A scorer for the arithmetic sample's structured form: `--scorer answer_field:right`.

A lane held to `{"answer": integer}` answers `{"answer":15}` (the canonical JSON text), while the
sample's gold is `"15"`: `exact` compares the whole texts and would call every answer wrong.
This reads the object's `answer` field as `[extract] method = "json_field"` reads it, then
compares it with the gold as `exact` compares (`normalize_answer` on both), so the scoring
rule stays the library's and only the field is picked out here.
"""

from __future__ import annotations

from lanefold.primitives import ExtractSpec, extract_answer, normalize_answer

FIELD = ExtractSpec(method="json_field", field="answer")


def right(gold: str | None, answer: str | None, item: object) -> bool:
    """Whether the answer's `answer` field equals the gold, as `exact` compares them.

    An abstention, a text that is no JSON object, or an object without the field is wrong.
    """
    if gold is None or answer is None:
        return False
    value = extract_answer(answer, FIELD)
    return value is not None and normalize_answer(value) == normalize_answer(gold)
