"""What the view's browser tests share (the browser and page fixtures are conftest's): what a
page's CSP refused, its address on a loopback server, where screenshots go."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from cli_support import ROOT
from loopback import Loopback

# Screenshots go to docs/view/ when asked (`LANEFOLD_SCREENSHOTS=docs/view`), else to a scratch
# folder: a test run leaves the repository's files as they were.
SHOTS = (
    ROOT / os.environ["LANEFOLD_SCREENSHOTS"]
    if os.environ.get("LANEFOLD_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "lanefold-view-shots"
)


def violations(page: Any) -> list[str]:
    """What the page's CSP refused so far, and any console line saying it refused something."""
    refused = list(page.evaluate("window.__violations || []"))
    return refused + [line for line in page.console_errors if "Content Security Policy" in line]


def url(server: Loopback, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
