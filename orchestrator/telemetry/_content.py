"""Prompts and answers on spans, as the GenAI semantic conventions name them (opt-in).

The `otel` hook puts content on spans only when asked (`capture_content = true`,
`--otel-content`): a prompt or an answer may hold what a team must not ship to its tracing
backend. The names are the conventions' current attributes, `gen_ai.input.messages` and
`gen_ai.output.messages` (opentelemetry-semantic-conventions 0.66b2 lists both; it marks the
older `gen_ai.prompt` and `gen_ai.completion` removed), each a JSON text of messages made of
parts: `[{"role": "user", "parts": [{"type": "text", "content": "..."}]}]`, an output
message also with its `finish_reason`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = ("INPUT_MESSAGES", "OUTPUT_MESSAGES", "input_messages", "output_messages")

INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"


def _message(role: str, text: str) -> dict[str, object]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def input_messages(conversation: Sequence[tuple[str, str]] | None, question: str) -> str:
    """What the client asked, as `gen_ai.input.messages`: the turns before the question
    (a chat's, as recorded), then the question as the user's turn."""
    turns = [_message(role, text) for role, text in conversation or ()]
    return json.dumps([*turns, _message("user", question)], ensure_ascii=False)


def output_messages(text: str, finish_reason: str) -> str:
    """One answer, as `gen_ai.output.messages`: the assistant's message and why it ended."""
    return json.dumps([{**_message("assistant", text), "finish_reason": finish_reason}], ensure_ascii=False)
