"""The `orchestrator` command end to end over the simulated backend: the event log."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path

from cli_support import EXAMPLE, QUESTION, RFC3339_UTC, Outcome, events_path, log_events

import lanefold
from lanefold.primitives.events import SCHEMA_VERSION

# -- the event log ----------------------------------------------------------------------------------


def test_every_event_has_the_envelope(finished: Outcome, runs: Path) -> None:
    events = log_events(events_path(runs, "done"))
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["id"] for e in events}) == len(events)
    for event in events:
        assert event["specversion"] == "1.0"
        assert event["schemaversion"] == SCHEMA_VERSION
        assert isinstance(event["id"], str) and event["id"]
        assert isinstance(event["source"], str) and event["source"]
        assert re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", event["type"])
        assert event["run_id"] == "done"
        assert RFC3339_UTC.fullmatch(event["time"]), event["time"]
        when = datetime.fromisoformat(event["time"])
        assert when.utcoffset() == timedelta(0)
        assert set(event) <= {
            "specversion",
            "schemaversion",
            "id",
            "source",
            "type",
            "time",
            "sequence",
            "run_id",
            "wave",
            "lane",
            "attempt",
            "data",
        }
        if event["type"].startswith("lane."):
            assert {"wave", "lane", "attempt"} <= set(event)
        if event["type"].startswith("run."):
            assert "lane" not in event
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed"
    for expected in ("wave.started", "lane.dispatched", "lane.completed", "wave.barrier", "reduce.completed"):
        assert expected in kinds
    for event in events:
        if event["type"] == "lane.completed":
            usage = event["data"]["usage"]
            assert {"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"} <= set(usage)


def test_run_started_holds_the_resolved_config_and_its_hash(finished: Outcome, runs: Path) -> None:
    started = log_events(events_path(runs, "done"))[0]
    assert started["type"] == "run.started"
    config = lanefold.load_config(EXAMPLE)
    assert started["data"]["config"] == config.model_dump(mode="json")
    assert started["data"]["config_hash"] == lanefold.config_hash(config)
    assert started["data"]["question"] == QUESTION
    # resolved: the recorded config alone rebuilds the same config
    again = lanefold.parse_config(started["data"]["config"])
    assert lanefold.config_hash(again) == started["data"]["config_hash"]


def test_run_completed_holds_the_printed_result(finished: Outcome, runs: Path) -> None:
    last = log_events(events_path(runs, "done"))[-1]
    assert last["data"]["result"] == finished.json
