"""The OpenAI-compatible backend: any `/v1/chat/completions` or `/v1/completions` server."""

from __future__ import annotations

from lanefold.backends.openai._backend import BackendEvent, OpenAIBackend
from lanefold.backends.openai._config import OpenAIConfig, read_api_key
from lanefold.backends.openai._transport import PooledTransport

__all__ = ("BackendEvent", "OpenAIBackend", "OpenAIConfig", "PooledTransport", "read_api_key")
