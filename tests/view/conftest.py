"""The view's fixtures: a finished run (the CLI tests' one), and for the browser tests Debian's
`chromium` driven by Playwright, skipped, saying why, only where either cannot be had (`make
test` installs both where it can)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import _finished_once, finished, runs  # noqa: F401  # fixtures, found by name

# Before any page script: each CSP violation the browser reports, kept where a test reads it.
_WATCH = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH: apt-get install chromium (make test does it as root)")
    with sync_api.sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page whose console errors are kept (`page.console_errors`) and whose CSP violations
    `view_browser.violations(page)` reads."""
    opened = browser.new_page(viewport={"width": 1200, "height": 800})
    opened.console_errors = []
    opened.on("console", lambda m: opened.console_errors.append(m.text) if m.type == "error" else None)
    opened.add_init_script(_WATCH)
    try:
        yield opened
    finally:
        opened.close()
