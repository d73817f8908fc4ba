"""What a request's headers may say before anything reads them: one `Authorization` at most.

Starlette-free, so the view and the command line use the same rule without the server's app.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ("twice_sent",)


def twice_sent(headers: Sequence[object], name: str = "Authorization") -> str | None:
    """Why a request carrying these values of one header is refused (None: it carries one or
    none). Two `Authorization` headers are never read as one of them, so no proxy's or client's
    extra header decides who is asking; the gateway, `--api-key-env` and the view refuse them
    (400) in these words."""
    return f"{name}: sent {len(headers)} times; send one" if len(headers) > 1 else None
