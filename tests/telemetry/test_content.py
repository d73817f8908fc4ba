"""The content the otel hook puts on spans (opt-in): a chat's tool turns as the GenAI
conventions' parts, not dropped or mistaken for (role, content) pairs."""

from __future__ import annotations

import json

from lanefold.primitives.events import Turn, TurnCall
from lanefold.telemetry._content import input_messages


def test_an_agents_calls_and_results_are_parts_of_the_input_messages() -> None:
    call = Turn(
        role="assistant", content="", tool_calls=[TurnCall(id="c1", name="get_weather", arguments="{}")]
    )
    result = Turn(role="tool", content="sunny", tool_call_id="c1", name="get_weather")
    sent = json.loads(input_messages([("system", "Be brief.")], "Weather?", [call, result]))
    assert sent == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather?"}]},
        {
            "role": "assistant",
            "parts": [{"type": "tool_call", "id": "c1", "name": "get_weather", "arguments": "{}"}],
        },
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "sunny"}]},
    ]
