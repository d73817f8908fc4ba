"""The project's habits that are files: a CHANGELOG in Keep a Changelog's form, reference pages
that state the present (dated history lives in docs/history.md), the deprecation rule's table
kept true, and the pre-commit hooks `make lint` runs."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
RELEASE = re.compile(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})")


def releases() -> list[tuple[str, str]]:
    """(heading, body) of each `## ` section, in order."""
    parts = re.split(r"^## (.+)$", CHANGELOG, flags=re.M)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_the_changelog_keeps_a_changelogs_form() -> None:
    assert CHANGELOG.startswith("# Changelog\n")
    headings = [heading for heading, _ in releases()]
    assert headings[0] == "[Unreleased]", headings
    dated = [RELEASE.fullmatch(heading) for heading in headings[1:]]
    assert all(dated), headings
    versions = [tuple(map(int, m[1].split("."))) for m in dated if m]
    assert versions == sorted(versions, reverse=True), "newest first"
    for heading, body in releases():
        kinds = re.findall(r"^### (.+)$", body, flags=re.M)
        assert kinds and set(kinds) <= SECTIONS, (heading, kinds)
        assert len(kinds) == len(set(kinds)), (heading, kinds)


def test_the_unreleased_section_names_the_version_pyproject_gives() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    unreleased = releases()[0][1]
    assert f"released as {version}" in unreleased
    assert not any(RELEASE.fullmatch(h) and h.startswith(f"[{version}]") for h, _ in releases())


def test_reference_pages_state_the_present() -> None:
    """A dated heading is history: it belongs in docs/history.md (or the changelog)."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name == "history.md":
            continue
        dated = re.findall(r"^#+ .*\b\d{4}-\d{2}-\d{2}\b.*$", page.read_text(), flags=re.M)
        assert not dated, f"{page.name}: {dated}"


def deprecated_now() -> list[tuple[str, str, str, str]]:
    """The rows of docs/deprecations.md's table: (deprecated, instead, since, goes in)."""
    text = (ROOT / "docs" / "deprecations.md").read_text()
    table = text.split("## Deprecated now", 1)[1].split("\n## ", 1)[0]
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| ")
    ]
    return [(a, b, c, d) for a, b, c, d in rows[2:]]  # past the header and its rule


def test_each_deprecation_is_in_the_changelog() -> None:
    deprecated = next(body for heading, body in releases() if heading == "[Unreleased]")
    section = deprecated.split("### Deprecated", 1)[1].split("\n### ", 1)[0]
    rows = deprecated_now()
    assert rows
    for name, _, _, goes in rows:
        code = re.search(r"`([^`]+)`", name)
        assert code and f"`{code[1]}`" in section and f"goes in {goes}" in section, (name, section)


def test_import_orchestrator_warns_as_the_table_says() -> None:
    """The one deprecated name warns, naming its replacement and the release it goes in."""
    ((_, instead, _, goes),) = [row for row in deprecated_now() if row[0].startswith("`import orchestrator`")]
    found = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-c", "import orchestrator"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "DeprecationWarning" in found.stderr, found.stderr
    assert instead.strip("`") in found.stderr and goes in found.stderr, found.stderr


def test_pre_commit_runs_ruff_ruff_format_and_mypy() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "mypy"} <= set(hooks)
    assert hooks["mypy"]["pass_filenames"] is False  # the whole package, as `make lint`
