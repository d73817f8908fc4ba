"""The OpenAI-compatible backend: any `/v1/chat/completions` or `/v1/completions` server."""

from __future__ import annotations

from lanefold.backends.openai._backend import BackendEvent, OpenAIBackend
from lanefold.backends.openai._config import OpenAIConfig, read_api_key

__all__ = ("BackendEvent", "OpenAIBackend", "OpenAIConfig", "read_api_key")
