"""Request bodies the served app accepts, and the chat-messages-to-prompt flattening."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = (
    "ChatBody",
    "ChatMessageIn",
    "CompletionBody",
    "StreamOptions",
    "TextPart",
    "flatten_messages",
)


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk carrying the request's usage."""

    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _Body(BaseModel):
    # Unknown fields are refused, as OpenAI does: a silently ignored knob is a wrong answer.
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)  # vLLM's extension; -1 and 0 are "off"
    n: int = Field(default=1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False  # vLLM's and llama.cpp's extension: decode through end-of-sequence

    def stops(self) -> tuple[str, ...]:
        """`stop` as a tuple, whichever form it came in."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionBody(_Body):
    """A `/v1/completions` request; one prompt (a list of one is accepted)."""

    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20)


class TextPart(BaseModel):
    """A text part of a chat message's content list."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    """One chat message; content as a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        """The message's text, parts joined."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatBody(_Body):
    """A `/v1/chat/completions` request."""

    messages: list[ChatMessageIn] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def flatten_messages(messages: Sequence[tuple[str, str]]) -> str:
    """Chat messages as one prompt for a Backend, whose request carries a prompt string.

    A lone user message passes through verbatim, so a backend that applies its model's chat
    template (the bundled engine does) sees exactly what an in-process run would send. Any
    other conversation becomes a role-tagged transcript ending in an open assistant turn; a
    structured `messages` field on SampleRequest would let the backend template it properly.
    """
    if len(messages) == 1 and messages[0][0] == "user":
        return messages[0][1]
    turns = [f"{role}: {content}" for role, content in messages]
    return "\n\n".join([*turns, "assistant:"])
