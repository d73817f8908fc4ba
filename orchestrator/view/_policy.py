"""The view's guards: the Content-Security-Policy and its companions on every answer, and the
API key asked for (a `Authorization: Bearer` header, or the cookie the login form sets)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from lanefold.serve import twice_sent
from lanefold.view._templates import pages

__all__ = ("COOKIE", "CSP", "Policy", "guard", "login_form")

COOKIE = "lanefold_view_key"
# Scripts and styles only from this origin (the package's static/): no inline script, no inline
# style, nothing fetched from elsewhere, no framing. A value a template failed to escape could
# still not run.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class Policy:
    """Adds the CSP and its companions to every answer: pages, feeds, static files, refusals."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_policy(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, with_policy)


def login_form(request: Request, wrong: bool) -> Response:
    """The key's form (401), saying `wrong key` after a wrong one."""
    return pages.TemplateResponse(
        request, "login.html", {"title": "API key", "live": None, "wrong": wrong}, status_code=401
    )


def guard(key: str) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    async def check(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path == "/login" or request.url.path.startswith("/static/"):
            return await call_next(request)
        sent = request.headers.getlist("authorization")
        if (twice := twice_sent(sent)) is not None:
            context = {"title": "refused", "live": None, "line": twice}
            return pages.TemplateResponse(request, "error.html", context, status_code=400)
        bearer = sent[0] if sent else ""
        given = bearer[7:] if bearer.lower().startswith("bearer ") else request.cookies.get(COOKIE, "")
        if hmac.compare_digest(given.encode(), key.encode()):
            return await call_next(request)
        return login_form(request, False)

    return check
