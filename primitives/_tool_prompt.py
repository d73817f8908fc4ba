"""How a conversation with tools reaches a model whose chat template has no tool role.

A template that knows tools (Qwen2.5's, Llama 3.1's, Hermes') is given them as the Jinja variable
`tools`; SmolLM2's (ChatML, no tool role) is not, so the tools are written into the system turn
in ONE format, and the history's calls and results in that same format:

- the system turn gains `tool_prompt`'s block: a line saying what follows, each offered tool as
  one JSON object (`name`, `description`, `parameters`), and how a call is written: the JSON
  object `{"name": ..., "arguments": {...}}` (what `[extract] method = "tool_call"` reads and
  `tools_schema` holds a constrained lane to);
- an assistant turn's `tool_calls` are written as that object, one line each, after its text;
- a `tool` turn becomes a user turn `Result of <name>:` and its content (results that follow
  one another share one turn, so turns still alternate).

Backend-neutral: the engine renders it through a template without tools, and a backend that
sends text (the "raw" form, a model without a template) flattens it (`text_prompt`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from lanefold.primitives._backend import ChatMessage, MessageToolCall, SampleRequest
from lanefold.primitives._tools import TOOL_CHOICES, ToolSpec

__all__ = (
    "call_arguments",
    "flatten_chat",
    "offered_tools",
    "past_call",
    "text_prompt",
    "tool_choice_in_effect",
    "tool_prompt",
    "tool_turns",
)

_SYSTEM_ROLES = ("system", "developer")
_CALL = '{"name": <the function\'s name>, "arguments": <an object of its arguments>}'


def tool_choice_in_effect(request: SampleRequest) -> str | None:
    """The `tool_choice` a request's prompt states: its own, else "required" where its lanes
    are held to a schema (a run that reads calls asks for one, as the openai backend does),
    else "auto"; None for a request without tools."""
    if not request.tools:
        return None
    return request.tool_choice or ("required" if request.schema is not None else "auto")


def offered_tools(tools: Sequence[ToolSpec], choice: str | None) -> tuple[ToolSpec, ...]:
    """The tools a prompt shows under `choice`: none for "none", the named one for a name,
    else all."""
    if choice == "none":
        return ()
    if choice is None or choice in TOOL_CHOICES:
        return tuple(tools)
    return tuple(tool for tool in tools if tool.name == choice)


def tool_prompt(tools: Sequence[ToolSpec], choice: str | None) -> str | None:
    """The block a system turn gains for `tools` under `choice` (see the module); None where
    no tool is offered."""
    offered = offered_tools(tools, choice)
    if not offered:
        return None
    lines = ["You can call these functions (each with a JSON Schema of its arguments):"]
    for tool in offered:
        entry: dict[str, object] = {"name": tool.name}
        if tool.description:
            entry["description"] = tool.description
        entry["parameters"] = tool.parameters_schema()
        lines.append(json.dumps(entry, ensure_ascii=False))
    if choice in (None, "auto"):
        lines.append(f"To call one, reply with only the JSON object {_CALL}; otherwise answer in words.")
    elif choice == "required":
        lines.append(f"Call one of them: reply with only the JSON object {_CALL}.")
    else:
        call = _CALL.replace("<the function's name>", json.dumps(choice))
        lines.append(f"Call {choice}: reply with only the JSON object {call}.")
    return "\n".join(lines)


def call_arguments(call: MessageToolCall) -> object:
    """A past call's arguments as a value (templates and `past_call` write them as JSON):
    the object its JSON text holds, `{}` for none, the text itself where it is not JSON (a
    client's history is shown as it was, never refused)."""
    try:
        arguments: object = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        return call.arguments
    return arguments


def past_call(call: MessageToolCall) -> str:
    """A call an assistant turn made, as the model is told to write one: `{"name": ...,
    "arguments": {...}}`."""
    return json.dumps({"name": call.name, "arguments": call_arguments(call)}, ensure_ascii=False)


def tool_turns(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec] = (), choice: str | None = None
) -> tuple[ChatMessage, ...]:
    """`messages` as plain (role, content) turns for a template without a tool role: the
    tools' block in the system turn (the first turn, where it is a system or developer turn,
    else a new first one), calls and results written as the module says."""
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    turns: list[ChatMessage] = []
    for index, message in enumerate(messages):
        if message.role == "tool":
            name = message.name or names.get(message.tool_call_id or "")
            what = name or (f"call {message.tool_call_id}" if message.tool_call_id else "a call")
            result = f"Result of {what}:\n{message.content}"
            if index and messages[index - 1].role == "tool":  # one turn for a row of results
                result = f"{turns.pop().content}\n\n{result}"
            turns.append(ChatMessage("user", result))
        elif message.tool_calls:
            calls = [past_call(call) for call in message.tool_calls]
            turns.append(ChatMessage(message.role, "\n".join(filter(None, [message.content, *calls]))))
        else:
            turns.append(ChatMessage(message.role, message.content))
    block = tool_prompt(tools, choice)
    if block is not None:
        if turns and turns[0].role in _SYSTEM_ROLES:
            first = turns[0]
            # a developer turn is read as the system's (as the gateway reads it), which a
            # template without tools knows
            turns[0] = ChatMessage("system", f"{first.content}\n\n{block}" if first.content else block)
        else:
            turns.insert(0, ChatMessage("system", block))
    return tuple(turns)


def flatten_chat(messages: Sequence[ChatMessage]) -> str:
    """Plain turns as one prompt, for a backend that cannot template them: a lone user message
    verbatim, any other conversation a role-tagged transcript ending in an open assistant turn."""
    if len(messages) == 1 and messages[0].role == "user":
        return messages[0].content
    return "\n\n".join([*(f"{m.role}: {m.content}" for m in messages), "assistant:"])


def text_prompt(request: SampleRequest) -> str:
    """What a backend that sends text sends for `request`: its conversation with the tools
    (`tool_turns`) flattened; without a conversation (the "raw" form), its prompt after the
    tools' block and a blank line."""
    choice = tool_choice_in_effect(request)
    if request.messages is not None:
        return flatten_chat(tool_turns(request.messages, request.tools, choice))
    block = tool_prompt(request.tools, choice)
    return request.prompt if block is None else f"{block}\n\n{request.prompt}"
