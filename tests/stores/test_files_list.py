"""The files store's list reads an ended run's log once, and again only once the log changes."""

from __future__ import annotations

from pathlib import Path

import lanefold
from lanefold.execution import open_store


def test_an_ended_run_is_listed_again_when_its_log_changes(tmp_path: Path) -> None:
    config = lanefold.parse_config({"loop": {"k": 2, "seed": 1}, "backend": {"kind": "simulated"}})
    lanefold.run_sync(config, "What is 17 * 23?", runs_dir=tmp_path, run_id="one")
    store = open_store(None, tmp_path)
    assert [(s.run_id, s.status) for s in store.list_runs()] == [("one", "answered")]
    assert [(s.run_id, s.status) for s in store.list_runs()] == [("one", "answered")]  # from the cache
    log = tmp_path / "one" / "events.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:3]))  # cut back: killed mid-run
    assert [(s.run_id, s.status) for s in store.list_runs()] == [("one", "stopped")]
