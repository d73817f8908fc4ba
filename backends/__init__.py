"""The built-in backends, each registering its config model (`[backend] kind`) on import:
`simulated` (the test double), `engine` (the bundled engine; torch only when built) and
`openai` (any OpenAI-compatible server)."""

from __future__ import annotations

from lanefold.backends import engine, openai, simulated

__all__ = ("engine", "openai", "simulated")
