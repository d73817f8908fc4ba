"""What the view's browser tests share (the browser and page fixtures are conftest's): what a
page's CSP refused, its address on a loopback server. (docs/view/'s screenshots are taken by
scripts/view_screenshots.py, not by the tests.)"""

from __future__ import annotations

from typing import Any

from loopback import Loopback


def violations(page: Any) -> list[str]:
    """What the page's CSP refused so far, and any console line saying it refused something."""
    refused = list(page.evaluate("window.__violations || []"))
    return refused + [line for line in page.console_errors if "Content Security Policy" in line]


def url(server: Loopback, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"
