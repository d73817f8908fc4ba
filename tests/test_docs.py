"""The docs' python blocks run, so the pages stay true to the code."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = sorted((ROOT / "docs").glob("*.md"))


def blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    for number, code in enumerate(blocks(page), 1):
        exec(compile(code, f"{page.name}#block{number}", "exec"), {"__name__": "__docs__"})


def test_every_config_key_is_documented() -> None:
    from orchestrator import LoopConfig

    text = (ROOT / "docs" / "config.md").read_text()
    for section, field in LoopConfig.model_fields.items():
        assert f"[{section}]" in text, section
        model = field.annotation
        for key in getattr(model, "model_fields", {}):
            assert f"`{key}`" in text, f"{section}.{key} is not in docs/config.md"


def test_every_event_type_is_documented() -> None:
    from typing import get_args

    from primitives import AnyEvent

    text = (ROOT / "docs" / "eventlog.md").read_text()
    union = get_args(AnyEvent)[0]
    for kind in get_args(union):
        name = kind.model_fields["type"].default
        assert f"`{name}`" in text, name
