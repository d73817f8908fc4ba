"""A gateway key's budget at its edges (issue 38): what a run started under a key spends is
charged to that key whoever continues the run, a refusal gives back what it took and leaves
no run behind, and the refusals are counted where the key's spend is kept."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_support import cli

from lanefold.config import LoopConfig, parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import AnyEvent, Event, EventLog, LogWriteError, Store
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, load_keys

pytest.importorskip("starlette")
from starlette.testclient import TestClient

ALICE = "alice-key-0123456789"


def _loop(**budget: Any) -> LoopConfig:
    return parse_config(
        {
            "loop": {"k": 8, "max_concurrency": 8, "seed": 7, "min_quorum": 3},
            "sampling": {"max_tokens": 96, "temperature": 0.8},
            "backend": {"kind": "simulated", "prompt_tokens": 40, "output_tokens": 60, "latency_ms": [0, 0]},
            "budget": {"max_tokens": 20000, **budget},
            "pricing": {"input_per_mtok": 0.15, "cached_input_per_mtok": 0.075, "output_per_mtok": 0.6},
        }
    )


def _keys(folder: Path, extra: str) -> Path:
    path = folder / "keys.toml"
    sha = hashlib.sha256(ALICE.encode()).hexdigest()
    path.write_text(f'[[keys]]\nname = "alice"\nsha256 = "{sha}"\n{extra}\n')
    return path


class CutLog:
    """A run's log that stops taking appends after `left` of them, as a killed process's
    would: what is written stands, nothing more is."""

    def __init__(self, inner: EventLog, left: int) -> None:
        self.inner, self.left = inner, left

    def append(self, event: Event) -> None:
        if self.left <= 0:
            raise LogWriteError("the process died here")
        self.left -= 1
        self.inner.append(event)

    def read(self, from_sequence: int = 1) -> Iterator[AnyEvent]:
        return self.inner.read(from_sequence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CutStore:
    """A store whose next new run's log is cut after `cut_after` appends (then whole again)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.cut_after: int | None = None

    def create_log(self, run_id: str, fsync: Any = "barrier") -> Any:
        log = self.inner.create_log(run_id, fsync)
        if self.cut_after is None:
            return log
        left, self.cut_after = self.cut_after, None
        return CutLog(log, left)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def gateway(runs: Path, keys: Path, loop: LoopConfig, store: Any = None) -> Iterator[TestClient]:
    store = store or open_store(None, runs)
    loops = {"vote": loop}
    parsed = load_keys(keys, loops)
    pools = KeyPools(parsed, store)
    pools.prepare()
    app = create_gateway(Session(store=store), loops, keys=parsed, pools=pools, heartbeat_s=0.05)
    with TestClient(app, base_url="http://gateway/v1", raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {ALICE}"
        yield client


def _chat(question: str = "What is 17 * 23?", **fields: Any) -> dict[str, Any]:
    return {"model": "vote", "messages": [{"role": "user", "content": question}], **fields}


def _key_spend(store: Store, caller: str = "alice") -> int:
    """What the key's runs spent, folded from their logs (a crash's lanes in flight whole)."""
    total = 0
    for summary in store.list_runs():
        state = read_state(store, summary.run_id)
        if state.started is None or state.started.caller != caller:
            continue
        total += state.spend.tokens
        if state.result is None and state.failure is None:
            total += sum(lane.hold.tokens for _, lane in state.in_flight() if lane.hold is not None)
    return total


def test_a_cli_resume_of_a_gateway_run_charges_the_runs_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: `orchestrator resume` of an interrupted gateway run charged nothing to its key."""
    runs = tmp_path / "runs"
    store = CutStore(open_store(None, runs))
    keys = _keys(tmp_path, "budget = {max_tokens = 900}")
    with gateway(runs, keys, _loop(), store) as client:
        # run.started, wave.started, 8 lanes dispatched, 3 landed: then the process "dies"
        store.cut_after = 13
        cut = client.post("/chat/completions", json=_chat(), headers={"Idempotency-Key": "cut"})
        assert cut.status_code >= 500, cut.text
    (summary,) = store.list_runs()
    assert summary.status == "stopped"
    assert _key_spend(store) <= 900
    outcome = cli(capsys, "resume", summary.run_id, "--runs-dir", runs, "--json")
    assert outcome.code == 0, outcome.err
    assert _key_spend(store) <= 900  # the rest of the run spent from the key too
    state = read_state(store, summary.run_id)
    assert state.result is not None
    refused = [lane for wave in state.waves.values() for lane in wave.lanes.values() if lane.error]
    assert refused and all("shared budget 'key:alice'" in (lane.error or "") for lane in refused)
    assert store.read_budget("key:alice").spent_tokens == _key_spend(store)


def test_a_stream_refused_for_a_spent_key_gives_its_slot_back(tmp_path: Path) -> None:
    """Defect: a refused `stream: true` request kept its `max_concurrency` slot for good."""
    runs = tmp_path / "runs"
    keys = _keys(tmp_path, "budget = {max_requests = 1}\nmax_concurrency = 1")
    with gateway(runs, keys, _loop()) as client:
        assert client.post("/chat/completions", json=_chat()).status_code == 200
        for _ in range(3):
            refused = client.post("/chat/completions", json=_chat(stream=True))
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "insufficient_quota"


def test_a_refused_request_is_no_run_and_is_counted_with_the_keys_spend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: every refused (429) request was recorded as a `failed` run with 0 lanes."""
    runs = tmp_path / "runs"
    store = open_store(None, runs)
    # 820 tokens fund the first request's wave (40 + 8 x 96 held, 40 + 8 x 60 spent); the 300
    # left fund 2 lanes of the next (40 + 2 x 96), short of its quorum of 3
    keys = _keys(tmp_path, "budget = {max_tokens = 820}")
    with gateway(runs, keys, _loop()) as client:
        assert client.post("/chat/completions", json=_chat()).status_code == 200
        for stream in (False, True, False):
            refused = client.post("/chat/completions", json=_chat(stream=stream))
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "insufficient_quota"
    assert [s.status for s in store.list_runs()] == ["answered"]
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith(".")) == [
        store.list_runs()[0].run_id
    ]
    shown = cli(capsys, "budget", "show", "key:alice", "--runs-dir", runs, "--json")
    assert shown.code == 0, shown.err
    view = json.loads(shown.out)
    assert view["refusals"] == 3
    assert view["spent_tokens"] == _key_spend(store) <= 820


@pytest.mark.parametrize(
    ("path", "stream"),
    [
        ("the key's budget cannot fund the first wave", False),
        ("the key's budget cannot fund the first wave", True),
        ("the run fails", False),
        ("the run fails", True),
        ("the log stops taking writes", False),
    ],
)
def test_every_way_out_of_a_run_gives_the_keys_slot_back(path: str, stream: bool, tmp_path: Path) -> None:
    """A key runs one request at once: each refusal or error below, three times over, is
    told as itself, never as `rate_limit_exceeded` (which a slot kept by the one before would
    give), and an ordinary request goes through after them."""
    runs = tmp_path / "runs"
    store = CutStore(open_store(None, runs))
    loop = _loop()
    if path == "the run fails":  # every lane fails for good: the quorum is not met
        loop = loop.model_copy(update={"backend": loop.backend.model_copy(update={"failure_rate": 1.0})})
        loop = loop.model_copy(update={"retry": loop.retry.model_copy(update={"max_attempts": 1})})
    budget = "max_tokens = 300" if path.startswith("the key's budget") else "max_tokens = 100000"
    keys = _keys(tmp_path, f"budget = {{{budget}}}\nmax_concurrency = 1")
    with gateway(runs, keys, loop, store) as client:
        for _ in range(3):
            if path == "the log stops taking writes":
                store.cut_after = 5
            answer = client.post("/chat/completions", json=_chat(stream=stream))
            if answer.status_code == 200:  # a stream under way when its run failed: said at its end
                assert stream and 'data: {"error"' in answer.text, answer.text
                continue
            assert answer.status_code in (429, 500), answer.text
            assert answer.json()["error"]["code"] != "rate_limit_exceeded", answer.text
        if path != "the run fails":
            assert client.post("/chat/completions", json=_chat()).status_code == (
                429 if path.startswith("the key's budget") else 200
            )
    assert store.read_budget("key:alice").held_tokens == 0


def test_a_run_whose_recorded_budget_the_store_does_not_keep_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gateway run carried to another runs folder (whose store has no `key:alice`) is not
    resumed without its key's budget: exit 2, one line naming the run and the budget."""
    import shutil

    runs = tmp_path / "runs"
    store = CutStore(open_store(None, runs))
    with gateway(runs, _keys(tmp_path, "budget = {max_tokens = 5000}"), _loop(), store) as client:
        store.cut_after = 12
        assert client.post("/chat/completions", json=_chat()).status_code == 500
    (summary,) = store.list_runs()
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(runs / summary.run_id, elsewhere / summary.run_id)
    before = (elsewhere / summary.run_id / "events.jsonl").read_bytes()
    outcome = cli(capsys, "resume", summary.run_id, "--runs-dir", elsewhere)
    assert outcome.code == 2
    assert f"run {summary.run_id}: its run.started names budget 'key:alice'" in outcome.error_line
    assert (elsewhere / summary.run_id / "events.jsonl").read_bytes() == before
