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

from lanefold.primitives.events import Turn

__all__ = ("INPUT_MESSAGES", "OUTPUT_MESSAGES", "input_messages", "output_messages")

INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"


def _message(role: str, text: str) -> dict[str, object]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def _turn(turn: tuple[str, str] | Turn) -> dict[str, object]:
    """A recorded turn as a message of parts: an assistant's calls as `tool_call` parts, a
    tool's result as a `tool_call_response` part (the conventions' part types)."""
    if not isinstance(turn, Turn):
        return _message(*turn)
    if turn.tool_call_id is not None:
        part: dict[str, object] = {
            "type": "tool_call_response",
            "id": turn.tool_call_id,
            "response": turn.content,
        }
        return {"role": turn.role, "parts": [part]}
    parts: list[dict[str, object]] = [{"type": "text", "content": turn.content}] if turn.content else []
    parts += [
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
        for c in turn.tool_calls or ()
    ]
    return {"role": turn.role, "parts": parts}


def input_messages(
    conversation: Sequence[tuple[str, str] | Turn] | None,
    question: str,
    after: Sequence[tuple[str, str] | Turn] | None = None,
) -> str:
    """What the client asked, as `gen_ai.input.messages`: the turns before the question
    (a chat's, as recorded), the question as the user's turn, then the turns after it (an
    agent's calls and its tools' results)."""
    turns = [_turn(turn) for turn in conversation or ()]
    later = [_turn(turn) for turn in after or ()]
    return json.dumps([*turns, _message("user", question), *later], ensure_ascii=False)


def output_messages(text: str, finish_reason: str) -> str:
    """One answer, as `gen_ai.output.messages`: the assistant's message and why it ended."""
    return json.dumps([{**_message("assistant", text), "finish_reason": finish_reason}], ensure_ascii=False)
