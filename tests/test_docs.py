"""The docs' python blocks run, so the pages stay true to the code."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
PAGES = sorted((ROOT / "docs").glob("*.md"))


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page's blocks run in order in one namespace, as a reader pastes them into one
    session, from a folder holding `examples/` (on `sys.path`, as the CLI puts the working
    directory, so a block may import a module an earlier one wrote there)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict[str, Any] = {"__name__": f"__docs_{page.stem.replace('-', '_')}__"}
    for number, code in enumerate(blocks(page), 1):
        exec(compile(code, f"{page.name}#block{number}", "exec"), namespace)


def test_every_config_key_is_documented() -> None:
    from lanefold import LoopConfig

    text = (ROOT / "docs" / "config.md").read_text()
    for section, field in LoopConfig.model_fields.items():
        assert f"[{section}]" in text, section
        model = field.annotation
        for name, info in getattr(model, "model_fields", {}).items():
            key = info.alias or name  # a key is written as its alias (`[extract] schema`)
            assert f"`{key}`" in text, f"{section}.{key} is not in docs/config.md"


def test_every_backend_key_is_documented() -> None:
    """The built-in backends' own `[backend]` keys are on the config page too."""
    from lanefold.primitives import BACKENDS

    text = (ROOT / "docs" / "config.md").read_text()
    for name, model in BACKENDS.items():
        if not model.__module__.startswith("lanefold.backends."):
            continue  # a backend some other test or page registered
        assert f'`kind = "{name}"`' in text, f"backend {name} is not in docs/config.md"
        for key in model.model_fields:
            assert f"`{key}`" in text, f"backend.{key} ({name}) is not in docs/config.md"


def test_every_loop_key_is_documented() -> None:
    """The built-in loops' own `[loop]` keys (their Params) are on the config page too."""
    from lanefold.primitives.internal import loop_names, resolve_loop

    text = (ROOT / "docs" / "config.md").read_text()
    for name in loop_names():
        loop = resolve_loop(name)
        if not loop.__module__.startswith("coordinators"):
            continue  # a loop some other test or page registered
        assert f"`{name}`" in text, f"loop {name} is not in docs/config.md"
        for key in loop.Params.model_fields:
            assert f"`{key}`" in text, f"loop.{key} ({name}) is not in docs/config.md"


def test_every_event_type_is_documented() -> None:
    from lanefold.primitives.events import EVENT_TYPES

    text = (ROOT / "docs" / "eventlog.md").read_text()
    for name in sorted(EVENT_TYPES):
        assert f"`{name}`" in text, name
    assert "`loop.<name>.<noun>`" in text, "a loop's own events"


def test_every_reducer_is_documented() -> None:
    from lanefold.primitives import resolve_reducer
    from lanefold.primitives.internal import reducer_names

    text = (ROOT / "docs" / "reducers.md").read_text()
    for name in reducer_names():
        if resolve_reducer(name).__module__.startswith("coordinators"):
            assert f"## {name}" in text, f"reducer {name} has no section in docs/reducers.md"


def test_every_page_is_linked_from_the_index() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    for page in PAGES:
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"docs/index.md does not link {page.name}"


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_links_between_pages_resolve() -> None:
    link = re.compile(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)")
    names = {page.name: page for page in PAGES}
    for page in PAGES:
        for target, anchor in link.findall(page.read_text()):
            assert target in names, f"{page.name} links {target}, which is not a page"
            if anchor:
                assert anchor in anchors(names[target]), f"{page.name} links {target}#{anchor}"
