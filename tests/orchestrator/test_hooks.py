"""Hooks watch runs and can never break one: a hook that raises, hangs or falls behind leaves
the run's answer, votes and log as they would be without it; `[[hooks]]` in a config builds
them, its keys checked by the hook's own `Params`.

No test waits on wall-clock time for its verdict: a hanging hook is bounded by a short
`END_TIMEOUT_S` patched in, and queues are filled without any hook running.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
import lanefold.execution._session as session_module
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._item import Item
from lanefold.execution import WorkerSpec, portable_hooks
from lanefold.primitives import HOOKS
from lanefold.primitives.internal import HookRunner

SIMULATED = {"kind": "simulated", "accuracy": 0.6}


def config(**loop: Any) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": 5, "seed": 7, **loop},
            "backend": dict(SIMULATED),
            "prompt": {"template": "{question}"},
            "retry": {"max_attempts": 1},
        }
    )


def log_lines(runs: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's log without what differs between two runs of the same seed (times, and the
    log's own path)."""
    lines = []
    for line in (runs / run_id / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        event.pop("time", None)
        lines.append(_without_times(event))
    return lines


def _without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: _without_times(item)
            for key, item in value.items()
            if not key.endswith(("_s", "seconds", "_at")) and key not in ("time", "events")
        }
    if isinstance(value, list):
        return [_without_times(item) for item in value]
    return value


class Raising:
    """Raises on every event and at the run's end."""

    def __init__(self) -> None:
        self.calls = 0

    def on_event(self, event: Any) -> None:
        self.calls += 1
        raise RuntimeError("a hook's own bug")

    def on_run_end(self, result: Any) -> None:
        raise RuntimeError("again")


class Recording:
    """A sync hook keeping what it saw."""

    def __init__(self) -> None:
        self.types: list[str] = []
        self.ends: list[Any] = []

    def on_event(self, event: Any) -> None:
        self.types.append(event.type)

    def on_run_end(self, result: Any) -> None:
        self.ends.append(result)


class AsyncRecording(Recording):
    """The same, async, yielding at each event."""

    async def on_event(self, event: Any) -> None:  # type: ignore[override]
        await anyio.lowlevel.checkpoint()
        self.types.append(event.type)

    async def on_run_end(self, result: Any) -> None:  # type: ignore[override]
        await anyio.lowlevel.checkpoint()
        self.ends.append(result)


class Hanging:
    """Never returns from any call."""

    async def on_event(self, event: Any) -> None:
        await anyio.sleep_forever()

    async def on_run_end(self, result: Any) -> None:
        await anyio.sleep_forever()


@pytest.mark.anyio
async def test_a_hook_raising_on_every_event_changes_nothing_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plain = await lanefold.run(config(), "What is 17 * 23?", runs_dir=tmp_path / "a", run_id="r")
    hook = Raising()
    with caplog.at_level(logging.WARNING, logger="lanefold.hooks"):
        watched = await lanefold.run(
            config(), "What is 17 * 23?", runs_dir=tmp_path / "b", run_id="r", hooks=[hook]
        )
    assert (watched.answer, watched.votes, watched.status) == (plain.answer, plain.votes, plain.status)
    assert log_lines(tmp_path / "b", "r") == log_lines(tmp_path / "a", "r")
    assert hook.calls == len(log_lines(tmp_path / "b", "r"))  # it kept getting every event
    failures = [r for r in caplog.records if "hook.failed" in r.getMessage()]
    assert len(failures) == 1 and "a hook's own bug" in failures[0].getMessage()


@pytest.mark.anyio
async def test_sync_and_async_hooks_see_every_event_and_the_result(tmp_path: Path) -> None:
    sync, asynchronous = Recording(), AsyncRecording()
    result = await lanefold.run(config(), "q", runs_dir=tmp_path, run_id="r", hooks=[sync, asynchronous])
    logged = [line["type"] for line in log_lines(tmp_path, "r")]
    assert sync.types == asynchronous.types == logged
    assert logged[0] == "run.started" and logged[-1] == "run.completed"
    assert sync.ends == asynchronous.ends == [result]


@pytest.mark.anyio
async def test_a_hook_that_hangs_is_bounded_at_the_runs_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(HookRunner.__init__, "__kwdefaults__", {"limit": 10_000, "end_timeout_s": 0.05})
    seen = Recording()
    with caplog.at_level(logging.WARNING, logger="lanefold.hooks"):
        with anyio.fail_after(30):  # a generous guard: without the bound this never ends
            result = await lanefold.run(config(), "q", runs_dir=tmp_path, run_id="r", hooks=[Hanging(), seen])
    assert result.status == "answered"
    assert seen.ends == [result]  # the other hook was not held up by the hanging one
    assert any("hook.end_timed_out" in r.getMessage() for r in caplog.records)


class Blocking:
    """A sync hook that blocks its thread until the test lets it go: it must hold up nothing."""

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()
        self.calls = 0

    def on_event(self, event: Any) -> None:
        self.calls += 1
        self.release.wait(60)  # a bound on a leak if the test fails, never reached when it passes


@pytest.mark.anyio
async def test_a_sync_hook_that_blocks_stalls_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(HookRunner.__init__, "__kwdefaults__", {"limit": 10_000, "end_timeout_s": 0.05})
    blocking, seen = Blocking(), Recording()
    try:
        with anyio.fail_after(30):  # without the thread, the event loop itself would block
            result = await lanefold.run(config(), "q", runs_dir=tmp_path, run_id="r", hooks=[blocking, seen])
    finally:
        blocking.release.set()
    assert result.status == "answered" and seen.ends == [result]
    assert blocking.calls == 1  # its first call still blocked when the run ended


@pytest.mark.anyio
async def test_a_full_queue_drops_and_counts_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    hook = Recording()
    runner = HookRunner([hook], "r", limit=3, end_timeout_s=1.0)
    with caplog.at_level(logging.WARNING, logger="lanefold.hooks"):
        async with runner:
            for n in range(10):  # no checkpoint between: the drain has not run yet
                runner.emit(_Event(f"e{n}"))
            await runner.end("done")
    assert hook.types == ["e0", "e1", "e2"] and hook.ends == ["done"]
    assert list(runner.dropped.values()) == [7]
    said = [r.getMessage() for r in caplog.records]
    assert sum("hook.events_dropped " in m for m in said) == 1
    assert any("hook.events_dropped_total" in m and "dropped=7" in m for m in said)


class _Event:
    def __init__(self, type_: str) -> None:
        self.type = type_


@pytest.mark.anyio
async def test_run_many_and_reduce_are_seen(tmp_path: Path) -> None:
    hook = Recording()
    async with lanefold.Session(config(), runs_dir=tmp_path, hooks=[hook]) as session:
        results = [r async for r in session.run_many(["a", "b", "c"], run_ids=["x", "y", "z"])]
        assert len(hook.ends) == 3 and hook.types.count("run.completed") == 3
        reduced = await session.reduce("x", reducer="majority_vote")
    assert hook.types[-2:] == ["reduce.started", "reduce.completed"]
    assert hook.ends[-1] == reduced and len(results) == 3


HOOK_MODULE = """
from pydantic import BaseModel

SEEN = []


class Tally:
    class Params(BaseModel):
        label: str = "tally"

    def __init__(self, params):
        self.label = params.label

    def on_event(self, event):
        SEEN.append((self.label, event.type))
"""


def _write_config(folder: Path, hooks: str) -> Path:
    (folder / "my_hooks_for_test.py").write_text(textwrap.dedent(HOOK_MODULE))
    path = folder / "loop.toml"
    path.write_text(
        textwrap.dedent("""
        [loop]
        k = 3
        seed = 7
        [backend]
        kind = "simulated"
        accuracy = 0.6
        [prompt]
        template = "{question}"
    """)
        + hooks
    )
    return path


@pytest.mark.anyio
async def test_hooks_from_a_config_file_see_run_and_eval(tmp_path: Path) -> None:
    path = _write_config(tmp_path, '[[hooks]]\nkind = "my_hooks_for_test:Tally"\nlabel = "mine"\n')
    await lanefold.run(path, "q", runs_dir=tmp_path / "runs", run_id="r")
    import my_hooks_for_test  # imported beside its config by the run above

    seen = my_hooks_for_test.SEEN
    assert ("mine", "run.started") in seen and ("mine", "run.completed") in seen
    seen.clear()
    summary = await run_eval(
        path,
        [Item(index=i, question=f"q{i}", answer="1") for i in range(3)],
        eval_id="e",
        runs_dir=tmp_path / "runs",
        concurrency=2,
    )
    assert summary.n == 3
    assert [t for _, t in seen].count("run.completed") == 3


def test_a_bad_hooks_key_is_one_line_naming_it(tmp_path: Path) -> None:
    path = _write_config(tmp_path, '[[hooks]]\nkind = "my_hooks_for_test:Tally"\ncolour = "red"\n')
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.load_config(path)
    message = str(caught.value)
    assert "\n" not in message and "hooks[1].colour: unknown key" in message


def test_an_unknown_hook_kind_names_its_table() -> None:
    with pytest.raises(lanefold.ConfigError, match=r"hooks\[1\]\.kind: unknown hook 'nope'"):
        lanefold.parse_config({"hooks": [{"kind": "nope"}]})


def test_a_config_without_hooks_hashes_as_before() -> None:
    assert "hooks" not in config().model_dump(mode="json")


def test_a_registered_hook_is_built_from_its_name() -> None:
    saved = HOOKS.snapshot()
    try:

        @lanefold.register_hook("counting_for_test")
        class Counting:
            def on_event(self, event: Any) -> None: ...

        built = lanefold.parse_config({"hooks": [{"kind": "counting_for_test"}]}).build_hooks()
        assert [type(hook) for hook in built] == [Counting]
    finally:
        HOOKS.restore(saved)


def test_session_keeps_the_hooks_it_is_given() -> None:
    hook = Recording()
    assert session_module.Session(config(), hooks=[hook]).hooks == [hook]


@pytest.mark.anyio
async def test_the_live_display_is_a_hook(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from lanefold.cli._display import Progress

    progress = Progress(Console(file=io.StringIO()))
    with progress:
        await lanefold.run(config(), "q", runs_dir=tmp_path, run_id="r", hooks=[progress])
    assert (progress.k, progress.done, progress.failed) == (5, 5, 0)
    assert progress.tokens > 0


def test_an_installed_hook_is_found_by_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.metadata

    (tmp_path / "installed_hook_for_test.py").write_text(
        "class Installed:\n    def on_event(self, event):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = importlib.metadata.EntryPoint(
        name="installed", group="lanefold.hooks", value="installed_hook_for_test:Installed"
    )
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: [entry] if group == "lanefold.hooks" else []
    )
    saved = HOOKS.snapshot()
    HOOKS.restore(({}, False))
    try:
        [hook] = lanefold.parse_config({"hooks": [{"kind": "installed"}]}).build_hooks()
        assert type(hook).__name__ == "Installed"
    finally:
        HOOKS.restore(saved)


@pytest.mark.anyio
async def test_a_cancelled_run_with_hooks_is_recorded_interrupted(tmp_path: Path) -> None:
    hook = Hanging()
    with anyio.CancelScope() as scope:

        def stop(event: Any) -> None:
            if event.type == "lane.completed":
                scope.cancel()

        slow = config().model_dump(mode="json")
        slow["backend"]["latency_ms"] = [5, 10]  # lanes still in flight at the first landing
        await lanefold.run(
            lanefold.parse_config(slow), "q", runs_dir=tmp_path, run_id="r", hooks=[hook], observer=stop
        )
    assert scope.cancelled_caught
    types = [line["type"] for line in log_lines(tmp_path, "r")]
    assert types[-1] == "run.interrupted"


def test_hooks_travel_to_workers_by_pickle_and_one_that_cannot_stays_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Unpicklable:
        def on_event(self, event: Any) -> None:
            pass

    kept = Recording()
    with caplog.at_level("WARNING", logger="lanefold.executor"):
        spec = WorkerSpec(
            config={}, source="<config>", store=None, hooks=portable_hooks([kept, Unpicklable()])
        )  # type: ignore[arg-type]
    (copy,) = spec.worker_hooks()
    assert type(copy) is Recording and copy is not kept
    assert "cannot be sent to workers" in caplog.text and caplog.text.count("cannot be sent") == 1
    assert WorkerSpec(config={}, source="<config>", store=None).worker_hooks() == []  # type: ignore[arg-type]


class Quitting:
    """Raises what is not an `Exception` (SystemExit, KeyboardInterrupt) on every call."""

    def __init__(self, error: type[BaseException]) -> None:
        self.error = error
        self.calls = 0

    def on_event(self, event: Any) -> None:
        self.calls += 1
        raise self.error()

    def on_run_end(self, result: Any) -> None:
        raise self.error()


class AsyncQuitting(Quitting):
    async def on_event(self, event: Any) -> None:  # type: ignore[override]
        self.calls += 1
        raise self.error()

    async def on_run_end(self, result: Any) -> None:  # type: ignore[override]
        raise self.error()


@pytest.mark.anyio
@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
@pytest.mark.parametrize("hook_class", [Quitting, AsyncQuitting], ids=["sync", "async"])
async def test_a_hook_raising_systemexit_or_keyboardinterrupt_is_contained(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, error: type[BaseException], hook_class: type[Quitting]
) -> None:
    # Such a hook used to fail the run with a traceback (or end the process).
    plain = await lanefold.run(config(), "What is 17 * 23?", runs_dir=tmp_path / "a", run_id="r")
    hook = hook_class(error)
    with caplog.at_level(logging.WARNING, logger="lanefold.hooks"):
        watched = await lanefold.run(
            config(), "What is 17 * 23?", runs_dir=tmp_path / "b", run_id="r", hooks=[hook]
        )
    assert (watched.answer, watched.votes, watched.status) == (plain.answer, plain.votes, plain.status)
    assert log_lines(tmp_path / "b", "r") == log_lines(tmp_path / "a", "r")
    assert hook.calls == len(log_lines(tmp_path / "b", "r"))  # it kept getting every event
    failures = [r.getMessage() for r in caplog.records if "hook.failed" in r.getMessage()]
    assert len(failures) == 1 and error.__name__ in failures[0]


class Forging:
    """Rewrites the result it is handed, and the event that carries it."""

    def on_event(self, event: Any) -> None:
        if event.type == "run.completed":
            event.data.result["answer"] = "forged"

    def on_run_end(self, result: Any) -> None:
        result.votes.clear()  # a frozen model's dict is still a dict
        object.__setattr__(result, "answer", "forged")  # and frozen only to `=`


class AsyncForging(Forging):
    async def on_run_end(self, result: Any) -> None:  # type: ignore[override]
        result.votes.clear()
        object.__setattr__(result, "answer", "forged")


@pytest.mark.anyio
@pytest.mark.parametrize("hook_class", [Forging, AsyncForging], ids=["sync", "async"])
async def test_a_hook_sees_a_copy_of_the_result(tmp_path: Path, hook_class: type[Forging]) -> None:
    # on_run_end used to get the very result the caller (and `run --json`) is given.
    plain = await lanefold.run(config(), "What is 17 * 23?", runs_dir=tmp_path / "a", run_id="r")
    seen = Recording()
    watched = await lanefold.run(
        config(), "What is 17 * 23?", runs_dir=tmp_path / "b", run_id="r", hooks=[hook_class(), seen]
    )
    assert watched.answer == plain.answer != "forged" and watched.votes == plain.votes
    assert seen.ends == [watched] and seen.ends[0] is not watched  # each hook its own copy


SLEEPING_HOOK = """
import time


class Sleeping:
    def on_event(self, event):
        time.sleep(60)

    def on_run_end(self, result):
        time.sleep(60)
"""


@pytest.mark.slow
def test_a_sync_hook_that_sleeps_does_not_hold_the_command_past_the_end_cap(tmp_path: Path) -> None:
    # A sync hook sleeping 25 s held `orchestrator run` open for 53 s: its worker thread was
    # waited for at exit. The cap is END_TIMEOUT_S (5 s); the test's own bound is 30 s.
    from cli_support import command

    (tmp_path / "sleeping_hook_for_test.py").write_text(SLEEPING_HOOK)
    path = tmp_path / "loop.toml"
    path.write_text(
        textwrap.dedent("""
        [loop]
        k = 3
        seed = 7
        [backend]
        kind = "simulated"
        accuracy = 0.9
        [prompt]
        template = "{question}"
        [[hooks]]
        kind = "sleeping_hook_for_test:Sleeping"
    """)
    )
    done = command(
        "run", path, "--question", "What is 17 * 23?", "--runs-dir", tmp_path / "runs", "--json", timeout=30
    )
    assert done.code == 0, done.err
    assert done.json["status"] == "answered"
    assert "Traceback" not in done.err
