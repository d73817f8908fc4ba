"""The otel hook tells events apart by their class (issue 39), as the Hook protocol hands them
over (`AnyEvent`): a type checker then holds each handler to its event's own `data`. On main
it matched 17 event-type strings (`kind == "lane.dispatched"`, `event.type == "lane.failed"`),
which a renamed or new event type would slip past without a word. `test_otel.py` holds what
the spans say."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OTEL = ROOT / "orchestrator" / "telemetry" / "_otel.py"


def _type_strings_compared(path: Path) -> list[str]:
    """Each comparison in the module that holds a dotted event-type string (`"run.started"`),
    or tests membership in a collection of them: dispatch by the type's spelling."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        strings = [
            value.value
            for part in (node.left, *node.comparators)
            for value in ast.walk(part)
            if isinstance(value, ast.Constant) and isinstance(value.value, str)
        ]
        if any("." in s and s.replace(".", "").replace("_", "").isalpha() for s in strings):
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_otel_hook_dispatches_on_event_classes_not_type_strings() -> None:
    assert _type_strings_compared(OTEL) == []


def test_the_scan_sees_a_type_string_compared(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(event, kind):\n"
        '    if kind in ("run.started", "run.resumed"):\n'
        "        pass\n"
        '    if event.type == "lane.failed" or kind != "x":\n'
        "        pass\n"
        '    return "a.b" + kind, isinstance(event, int)\n'
    )
    assert [line.split(" ", 1)[0] for line in _type_strings_compared(probe)] == ["probe.py:2", "probe.py:4"]
