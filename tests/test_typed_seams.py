"""A plug-in author's type checker holds a plug-in to what the docs say (issue 39): mypy strict,
run on a plug-in module written against the public names, flags each line marked `# E` below
and nothing else. On main the seams said `Any` (`Hook.on_event(self, event: Any) -> Any`,
`Session(hooks: Sequence[Any])`, `Registry[Any]`), so every marked line passed.

mypy reads `lanefold` as `make lint` lays it out (build/typecheck, scripts/typecheck_tree.py)
and with the project's own settings and cache, so after `make lint` this checks one file."""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lanefold

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = """\
from collections.abc import Sequence
from typing import ClassVar

from pydantic import BaseModel

import lanefold
from lanefold.primitives import (
    LOOPS, REDUCERS, VERIFIERS, AnyEvent, Hook, LoopContext, Outcome, RunResult, Verdict,
    register_hook, register_loop, register_verifier,
)


class Tally:  # the docs' hook: both methods
    def on_event(self, event: AnyEvent) -> None: ...

    async def on_run_end(self, result: RunResult) -> None: ...


class EndOnly:  # either method may be left out
    def on_run_end(self, result: RunResult) -> None: ...


class WrongEvent:  # an event is every event, not a number
    def on_event(self, event: int) -> None: ...


class NoMethod:  # neither method
    def watch(self, event: AnyEvent) -> None: ...


good: Sequence[Hook] = [Tally(), EndOnly()]
lanefold.Session("loop.toml", hooks=good)
lanefold.Session("loop.toml", hooks=[WrongEvent()])  # E
lanefold.SyncSession("loop.toml", hooks=[NoMethod()])  # E
lanefold.run_sync("loop.toml", "q", hooks=[Tally(), NoMethod()])  # E
lanefold.run_sync("loop.toml", "q", hook=[Tally()])  # E
bad: Hook = NoMethod()  # E


@register_hook("typed_probe")
class Registered:
    def on_event(self, event: AnyEvent) -> None: ...


@register_hook("typed_probe_bad")
class NotAHook:  # E
    pass


class FanParams(BaseModel):
    n: int = 2


@register_loop
class Fan:
    name: ClassVar[str] = "typed_fan"
    Params: ClassVar[type[BaseModel]] = FanParams

    def __init__(self, params: FanParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        return Outcome(answer="1")


@register_loop
class NoRun:  # E
    name: ClassVar[str] = "typed_no_run"
    Params: ClassVar[type[BaseModel]] = FanParams


@register_verifier("typed_fn")
def by_function(question: str, text: str, answer: str | None) -> bool:
    return answer == "1"


@register_verifier("typed_bad")  # E
def by_nothing(question: str) -> bool:
    return True


loop = LOOPS.get("typed_fan")
reducer = REDUCERS.get("majority_vote")
if loop is not None and reducer is not None:
    made = loop(FanParams())
    reveal_type(made.run)  # N: question: str) -> typing.Coroutine[Any, Any, lanefold.primitives._loop.Out
    reveal_type(reducer(None).reduce)  # N: Reduction
    loop.no_such_attr  # E
reveal_type(VERIFIERS.get("typed_fn"))  # N: Verifier
verdict: Verdict = Verdict(1.0, True)
"""


def _typecheck_tree() -> None:
    """build/typecheck as `make lint` lays it out (a checkout where it is not made yet)."""
    if (ROOT / "build" / "typecheck" / "lanefold").is_dir():
        return
    spec = importlib.util.spec_from_file_location("typecheck_tree", ROOT / "scripts" / "typecheck_tree.py")
    assert spec is not None and spec.loader is not None
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    tree.lay_out()


@pytest.mark.slow
def test_a_plug_in_authors_type_checker_flags_what_the_docs_forbid(tmp_path: Path) -> None:
    _typecheck_tree()
    plugin = tmp_path / "typed_plugin.py"
    plugin.write_text(PLUGIN)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), str(plugin)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    # By the file's name: mypy's cache replays an unchanged module's findings under the path it
    # last read it from (another run's tmp_path).
    found = re.findall(r"^.*\btyped_plugin\.py:(\d+): (error|note): (.*)$", done.stdout, re.M)
    errors = sorted({int(line) for line, kind, _ in found if kind == "error"})
    notes = {int(line): text for line, kind, text in found if kind == "note"}
    lines = PLUGIN.splitlines()
    marked = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith("# E")]
    assert errors == marked, done.stdout
    for i, text in enumerate(lines, 1):
        if "# N: " in text:
            assert text.split("# N: ")[1] in notes.get(i, ""), (i, notes.get(i), done.stdout)


def test_sync_session_takes_what_session_takes() -> None:
    """SyncSession's parameters are Session's (written out, so a type checker sees them): the
    two lists are one, and each blocking method has its Session method's signature."""
    session = inspect.signature(lanefold.Session.__init__).parameters
    sync = inspect.signature(lanefold.SyncSession.__init__).parameters
    assert [(p.name, p.kind, p.default) for p in sync.values()] == [
        (p.name, p.kind, p.default) for p in session.values()
    ]
    for method in ("run", "resume", "reduce", "run_many"):
        blocking = inspect.signature(getattr(lanefold.SyncSession, method))
        coroutine = inspect.signature(getattr(lanefold.Session, method))
        assert list(blocking.parameters) == list(coroutine.parameters), method
