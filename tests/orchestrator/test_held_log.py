"""A run spending from a shared budget has its log made once its first wave is funded
(`HeldLog`): in the same worker-thread trip that writes its first lines, after the pool's
reservation, never for a run the pool refuses; a run another process writes meanwhile is
refused there and gives its holds back, unspent."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from lanefold.config import parse_config
from lanefold.execution import Session, open_store
from lanefold.primitives import BudgetExhaustedError, RunInUseError, Store

LOOP: dict[str, Any] = {
    "loop": {"k": 4, "max_concurrency": 4, "seed": 7, "min_quorum": 2},
    "sampling": {"max_tokens": 64},
    "backend": {"kind": "simulated", "prompt_tokens": 20, "output_tokens": 30, "latency_ms": [0, 0]},
}


class Watched:
    """A store that notes each log it makes: the thread it was made on and what the budget
    `team` held at that moment."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.made: list[tuple[bool, int]] = []  # (on the event loop's thread, tokens held)

    def create_log(self, run_id: str, fsync: Any = "barrier") -> Any:
        budget = self.inner.read_budget("team")
        held = budget.held_tokens if budget is not None else -1
        self.made.append((threading.current_thread() is threading.main_thread(), held))
        return self.inner.create_log(run_id, fsync)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _session(runs: Path, max_tokens: int) -> tuple[Session, Watched]:
    store = Watched(open_store(None, runs))
    store.set_budget("team", max_tokens=max_tokens)
    return Session(parse_config(LOOP), store=store), store  # type: ignore[arg-type]


def test_a_funded_runs_log_is_made_after_its_first_wave_is_reserved_off_the_loop(tmp_path: Path) -> None:
    session, store = _session(tmp_path / "runs", 100_000)
    result = anyio.run(lambda: session.run("What is 2 + 2?", pools=["team"]))
    assert result.status == "answered"
    # Once, in a worker thread, with the wave's holds already taken from the pool (before this
    # change the log was made before the reservation, holding nothing).
    ((on_loop, held),) = store.made
    assert not on_loop and held > 0
    assert store.exists(result.run_id)
    budget = store.read_budget("team")
    assert budget is not None and budget.held_tokens == 0 and budget.spent_tokens > 0


def test_a_run_the_pool_refuses_makes_no_log(tmp_path: Path) -> None:
    session, store = _session(tmp_path / "runs", 100)  # below the quorum's two lanes
    with pytest.raises(BudgetExhaustedError):
        anyio.run(lambda: session.run("What is 2 + 2?", pools=["team"]))
    assert store.made == []  # not made, then thrown away: never made
    assert store.list_runs() == []
    budget = store.read_budget("team")
    assert budget is not None and budget.refusals == 1 and budget.held_tokens == budget.spent_tokens == 0


def test_a_run_another_writer_holds_is_refused_and_gives_its_holds_back(tmp_path: Path) -> None:
    session, store = _session(tmp_path / "runs", 100_000)
    live = store.inner.create_log("raced")  # another writer of the run id, live
    try:
        with pytest.raises(RunInUseError):
            anyio.run(lambda: session.run("What is 2 + 2?", run_id="raced", pools=["team"]))
    finally:
        live.close()
    assert len(store.made) == 1  # refused when its log was to be made, after the reservation
    budget = store.read_budget("team")
    assert budget is not None
    assert budget.held_tokens == budget.spent_tokens == budget.refusals == 0  # given back whole
