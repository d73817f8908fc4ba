"""Keys kept in the store (issue 41 items 1 and 2), on files and on PostgreSQL alike: made,
changed and revoked by `orchestrator keys` while a gateway serves, seen within its refresh
(no restart); tokens and requests a minute refused with a Retry-After that is right, shared by
every gateway over the store; a key reading its own spend (`GET /v1/usage`, `keys show`).

Clocks are injected (the keys' refresh and the buckets'): nothing here waits on wall time."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_support import cli

from lanefold.config import LoopConfig, parse_config
from lanefold.execution import Session, Store, open_store
from lanefold.serve import StoreKeys
from lanefold.serve._gateway import create_gateway
from lanefold.serve._gateway_wire import parse_ask
from lanefold.serve._keys import KeyPools, Keys
from lanefold.serve._limits import request_hold

pytest.importorskip("starlette")
from starlette.testclient import TestClient


class Clock:
    """A clock a test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _loop() -> LoopConfig:
    return parse_config(
        {
            "loop": {"k": 4, "max_concurrency": 4, "seed": 7, "min_quorum": 2},
            "sampling": {"max_tokens": 32, "temperature": 0.8},
            "backend": {"kind": "simulated", "prompt_tokens": 20, "output_tokens": 10, "latency_ms": [0, 0]},
            "pricing": {"input_per_mtok": 0.15, "cached_input_per_mtok": 0.075, "output_per_mtok": 0.6},
        }
    )


@contextmanager
def gateway(store: Store, wall: Clock, fresh: Clock) -> Iterator[TestClient]:
    """A gateway over `store`'s keys: `fresh` the keys' refresh clock, `wall` the buckets'."""
    keys = StoreKeys(store, clock=fresh)  # type: ignore[arg-type]
    keys.load()
    pools = KeyPools(Keys(()), store, every=True)
    app = create_gateway(Session(store=store), {"vote": _loop()}, keys=keys, pools=pools, clock=wall)
    with TestClient(app, base_url="http://gateway/v1", raise_server_exceptions=False) as client:
        yield client


def _chat(question: str = "What is 17 * 23?") -> dict[str, Any]:
    return {"model": "vote", "messages": [{"role": "user", "content": question}]}


def _create(capsys: pytest.CaptureFixture[str], flags: list[str], name: str, *limits: str) -> str:
    made = cli(capsys, "keys", "create", name, *limits, *flags, "--json")
    assert made.code == 0, made.err
    key = made.json["key"]
    assert isinstance(key, str) and key.startswith("lf-")
    return key


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_key_created_while_serving_is_usable_within_a_second_and_a_revoked_one_refused(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    wall, fresh = Clock(), Clock(0.0)
    with gateway(store, wall, fresh) as client:
        key = _create(capsys, flags, "alice", "--loops", "vote")
        # read at start, before the key existed: unknown until the next read
        assert client.post("/chat/completions", json=_chat(), headers=_auth(key)).status_code == 401
        fresh.now += 0.5  # the refresh: at most half a second later
        answered = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert answered.status_code == 200, answered.text
        revoked = cli(capsys, "keys", "revoke", "alice", *flags)
        assert revoked.code == 0, revoked.err
        assert "revoked" in revoked.out
        # refused at once, before the keys are read again: the key's own row says so
        refused = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_api_key"
        fresh.now += 0.5
        assert client.get("/models", headers=_auth(key)).status_code == 401


def test_requests_a_minute_refused_with_the_seconds_until_one_fits(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    key = _create(capsys, flags, "bob", "--rpm", "2")
    wall = Clock()
    with gateway(store, wall, Clock()) as client:
        for left in ("1", "0"):
            ok = client.post("/chat/completions", json=_chat(), headers=_auth(key))
            assert ok.status_code == 200, ok.text
            assert ok.headers["x-ratelimit-remaining-requests"] == left
            assert ok.headers["x-ratelimit-limit-requests"] == "2"
            assert "x-ratelimit-remaining-tokens" not in ok.headers  # no tpm: no token bucket
        refused = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.headers["Retry-After"] == "30"  # one request refills in 60/2 s
        streamed = client.post("/chat/completions", json={**_chat(), "stream": True}, headers=_auth(key))
        assert streamed.status_code == 429  # refused before the stream starts: a plain answer
        assert streamed.headers["Retry-After"] == "30"
        wall.now += 29.0
        again = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert again.status_code == 429
        assert again.headers["Retry-After"] == "1"
        wall.now += 1.0
        assert client.post("/chat/completions", json=_chat(), headers=_auth(key)).status_code == 200
    shown = cli(capsys, "keys", "show", "bob", *flags, "--json")
    assert shown.json["refusals"]["rate"] == 3
    assert shown.json["spend"]["requests"] > 0


def test_tokens_a_minute_hold_the_worst_case_and_settle_to_what_was_paid(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    loop = _loop()
    hold = request_hold(loop, parse_ask("vote", "chat.completion", _chat()))
    assert hold > 0
    key = _create(capsys, flags, "carol", "--tpm", str(hold))  # one worst case a minute
    wall = Clock()
    with gateway(store, wall, Clock()) as client:
        first = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert first.status_code == 200, first.text
        usage = first.json()["usage"]
        paid = usage["total_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
        assert 0 < paid < hold  # the hold was settled to what the run paid
        refused = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert refused.status_code == 429
        # the bucket holds hold - paid: a hold fits again once `paid` tokens refill, at hold/60 a second
        assert refused.headers["Retry-After"] == str(math.ceil(paid * 60 / hold))
        wall.now += math.ceil(paid * 60 / hold)
        assert client.post("/chat/completions", json=_chat(), headers=_auth(key)).status_code == 200
        # a request that could compute more than a minute's tokens never fits: not to be retried
        cli(capsys, "keys", "update", "carol", "--tpm", str(hold - 1), *flags)
        never = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert never.status_code == 429
        assert never.headers["x-should-retry"] == "false"
        assert "Retry-After" not in never.headers


def test_two_gateways_over_one_store_share_a_keys_requests_a_minute(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    key = _create(capsys, flags, "dave", "--rpm", "5")
    other = open_store(None, flags[1]) if flags[0] == "--runs-dir" else open_store(flags[1])
    wall = Clock()
    with gateway(store, wall, Clock()) as one, gateway(other, wall, Clock()) as two:
        clients = [one, two] * 6

        def ask(client: TestClient) -> int:
            return client.post("/chat/completions", json=_chat(), headers=_auth(key)).status_code

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            codes = list(pool.map(ask, clients))
    assert sorted(codes) == [200] * 5 + [429] * 7
    shown = cli(capsys, "keys", "show", "dave", *flags, "--json")
    assert shown.json["refusals"]["rate"] == 7


def test_a_key_reads_its_own_spend_as_keys_show_prints_it(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    key = _create(capsys, flags, "erin", "--max-tokens", "100000", "--max-cost-usd", "5", "--rpm", "100")
    paid = 0
    with gateway(store, Clock(), Clock()) as client:
        for question in ("What is 2 + 2?", "What is 3 + 3?"):
            done = client.post("/chat/completions", json=_chat(question), headers=_auth(key))
            assert done.status_code == 200, done.text
            # what the budget had left as the request was admitted: all but what ran before it
            assert done.headers["x-lanefold-budget-remaining-tokens"] == str(100000 - paid)
            assert "x-lanefold-budget-remaining-requests" not in done.headers  # no such limit
            usage = done.json()["usage"]
            paid += usage["total_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
        own = client.get("/usage", headers=_auth(key))
        assert own.status_code == 200, own.text
        assert client.get("/usage").status_code == 401
    report = own.json()
    shown = cli(capsys, "keys", "show", "erin", *flags, "--json").json
    assert report["spend"] == shown["spend"]
    assert report["spend"]["tokens"] == paid  # the paid tokens: total_tokens less cached prefill
    assert report["spend"]["requests"] > 0 and report["spend"]["cost_usd"] > 0
    assert report["limits"]["max_tokens"] == 100000 and report["limits"]["rpm"] == 100
    assert report["remaining"]["tokens"] == 100000 - paid
    assert report["last_used"] is not None
    assert "cached" in report["tokens_note"]


def test_keys_on_the_command_line(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    store, flags = opened
    made = cli(capsys, "keys", "create", "frank", "--loops", "vote", "qa", "--tpm", "5000", *flags)
    assert made.code == 0, made.err
    key = made.out.split()[2]
    assert key.startswith("lf-")
    stored = store.read_key("frank")  # type: ignore[attr-defined]
    assert stored is not None and key not in stored.model_dump_json()  # only its hash is kept
    again = cli(capsys, "keys", "create", "frank", *flags)
    assert again.code == 2 and "frank" in again.error_line
    changed = cli(capsys, "keys", "update", "frank", "--tpm", "none", "--rpm", "60", *flags, "--json")
    assert changed.code == 0, changed.err
    assert changed.json["limits"]["tpm"] is None and changed.json["limits"]["rpm"] == 60
    assert changed.json["loops"] == ["vote", "qa"]
    listed = cli(capsys, "keys", "list", *flags)
    assert "frank" in listed.out and "active" in listed.out
    missing = cli(capsys, "keys", "show", "nobody", *flags)
    assert missing.code == 2 and "nobody" in missing.error_line


def test_a_gateways_runs_say_who_asked_for_which_model(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 41 item 6: each run records the model name asked for, the key's name (never the
    key) and the request's id; `list`, `show` show them, `list --model --caller` filter."""
    store, flags = opened
    alice = _create(capsys, flags, "alice")
    bob = _create(capsys, flags, "bob")
    with gateway(store, Clock(), Clock()) as client:
        mine = client.post("/chat/completions", json=_chat(), headers={**_auth(alice), "X-Request-ID": "r-1"})
        assert mine.status_code == 200, mine.text
        assert mine.headers["x-request-id"] == "r-1"
        theirs = client.post("/chat/completions", json=_chat(), headers=_auth(bob))
        assert theirs.status_code == 200, theirs.text
        assert theirs.headers["x-request-id"].startswith("req_")  # none sent: the gateway's own
    run_id = mine.headers["x-lanefold-run-id"]
    listed = cli(capsys, "list", "--model", "vote", "--caller", "alice", *flags, "--json")
    assert listed.code == 0, listed.err
    assert [json.loads(line)["run_id"] for line in listed.out.splitlines()] == [run_id]
    row = json.loads(listed.out)
    assert (row["model"], row["caller"], row["request_id"]) == ("vote", "alice", "r-1")
    assert row["loop"] == "parallel_sample"  # the loop's class, beside the model asked for
    assert cli(capsys, "list", "--model", "qa", *flags).out.startswith("no runs")
    table = cli(capsys, "list", "--caller", "bob", *flags).out
    assert "vote (parallel_sample) by bob" in table and run_id not in table
    shown = cli(capsys, "show", run_id, *flags)
    assert "asked: model vote, caller alice, request_id r-1" in shown.out
    assert cli(capsys, "show", run_id, *flags, "--json").json["asked"]["request_id"] == "r-1"
    for line in (Path(flags[1]) / run_id / "events.jsonl",) if flags[0] == "--runs-dir" else ():
        assert alice not in line.read_text()  # the key's name, never the key


def test_a_keys_file_seeds_the_store_and_a_revoked_key_stays_revoked(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from lanefold.serve import gateway_app, key_digest

    store, flags = opened
    keys = tmp_path / "keys.toml"
    keys.write_text(
        f'[[keys]]\nname = "gina"\nsha256 = "{key_digest("gina-key-0123456789")}"\nloops = ["vote"]\n'
        "rpm = 7\nbudget = { max_tokens = 5000 }\n"
    )
    gateway_app({"vote": _loop()}, store, keys_file=keys, store_keys=True)
    shown = cli(capsys, "keys", "show", "gina", *flags, "--json").json
    assert shown["limits"]["rpm"] == 7 and shown["limits"]["max_tokens"] == 5000
    assert cli(capsys, "keys", "revoke", "gina", *flags).code == 0
    app = gateway_app({"vote": _loop()}, store, keys_file=keys, store_keys=True)  # a restart
    assert cli(capsys, "keys", "show", "gina", *flags, "--json").json["revoked"] is True
    with TestClient(app, base_url="http://gateway/v1") as client:
        refused = client.post("/chat/completions", json=_chat(), headers=_auth("gina-key-0123456789"))
        assert refused.status_code == 401


def test_a_bad_key_name_or_limit_is_one_line_naming_it(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: `keys create "bad name!"` (and `keys show ../x`) ended in a traceback."""
    _store, flags = opened
    for verb in ("create", "show", "update", "revoke"):
        bad = cli(capsys, "keys", verb, "bad name!", *flags)
        assert bad.code == 2, bad.err
        assert "name" in bad.error_line and "bad name!" in bad.error_line
    escape = cli(capsys, "keys", "show", "../x", *flags)
    assert escape.code == 2 and "../x" in escape.error_line


def test_a_key_stored_without_a_budget_gets_one_at_its_first_request(opened: tuple[Store, list[str]]) -> None:
    """Defect: a key a store was given directly (`create_key`, no `orchestrator keys`) had no
    budget `key:<name>`, and its every run failed opening it."""
    from lanefold.primitives import KeyRecord
    from lanefold.serve import key_digest

    store, _flags = opened
    store.create_key(KeyRecord(name="ivan", sha256=key_digest("ivan-key-0123456789")))  # type: ignore[attr-defined]
    with gateway(store, Clock(), Clock()) as client:
        done = client.post("/chat/completions", json=_chat(), headers=_auth("ivan-key-0123456789"))
        assert done.status_code == 200, done.text
    assert store.read_budget("key:ivan").spent_tokens > 0  # type: ignore[attr-defined]


def test_a_key_without_tpm_is_written_at_admission_only(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Settling a request gives its token hold back; a key with no tpm held none, and its
    requests bucket refills by the clock alone, so the gateway does not change the key's record
    a second time per request (on files: a lock, a read and a forced write). One with a tpm is
    settled, as before."""
    store, flags = opened
    plain, metered = _create(capsys, flags, "ivan"), _create(capsys, flags, "judy", "--tpm", "100000")
    given: list[str] = []
    real = store.give_key_rate  # type: ignore[attr-defined]

    def counted(name: str, tokens: int, now: float) -> None:
        given.append(name)
        real(name, tokens, now)

    monkeypatch.setattr(store, "give_key_rate", counted)
    with gateway(store, Clock(), Clock()) as client:
        for key in (plain, plain, metered):
            answered = client.post("/chat/completions", json=_chat(), headers=_auth(key))
            assert answered.status_code == 200, answered.text
    assert given == ["judy"]


def test_a_key_without_buckets_records_its_last_use_to_the_second(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """A key with no tpm and no rpm takes nothing from a bucket: its record changes only by its
    last use, which is kept to the second, so a busy key's record is read, not rewritten, at
    each request (on files: no lock, no forced write). Revoking it still refuses it."""
    store, flags = opened
    key = _create(capsys, flags, "kate")
    wall, fresh = Clock(), Clock()

    def last_used() -> float | None:
        stored = store.read_key("kate")  # type: ignore[attr-defined]
        return stored.rate.last_used

    with gateway(store, wall, fresh) as client:
        for at, recorded in ((1000.0, 1000.0), (1000.6, 1000.0), (1000.99, 1000.0), (1001.2, 1001.2)):
            wall.now = at
            answered = client.post("/chat/completions", json=_chat(), headers=_auth(key))
            assert answered.status_code == 200, answered.text
            assert last_used() == recorded, at
        assert cli(capsys, "keys", "revoke", "kate", *flags).code == 0
        wall.now = 1001.5  # within the second of its last recorded use: the record says revoked
        refused = client.post("/chat/completions", json=_chat(), headers=_auth(key))
        assert refused.status_code == 401, refused.text


def test_requests_finding_a_keys_last_use_stale_together_record_it_once(
    opened: tuple[Store, list[str]], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a second a busy key's last use is a second old: every request admitted then read it
    so, and each went on to take its rate under the lock and write the record again, one forced
    write after another (a dozen requests stalled 100-200 ms on the gateway at 32 clients). Now
    one request records the use; the others are admitted without waiting for the lock while it
    does (`UsesInFlight`), or, come after it, find the use recorded (within a second, before or
    after their own clock) and change nothing."""
    import lanefold.primitives._keystore as rule
    import lanefold.stores.files._keys as files_keys
    import lanefold.stores.postgres._keys as pg_keys

    store, flags = opened
    _create(capsys, flags, "liam")
    assert store.take_key_rate("liam", 0, 1, 1000.0) is not None  # type: ignore[attr-defined]
    racing = 8
    together = threading.Barrier(racing)
    local = threading.local()
    changed: list[bool] = []
    real_untaken, real_take = rule.untaken, rule.take_rate

    def read_stale(key: Any, now: float) -> Any:
        found = real_untaken(key, now)
        if not getattr(local, "read", False):  # a request's read before any lock
            local.read = True
            assert found is None  # a second old for every one of them
            together.wait(timeout=30)  # each read it before any went on
        return found

    def taken(key: Any, tokens: int, requests: int, now: float) -> Any:
        before = key.model_copy(deep=True)
        verdict = real_take(key, tokens, requests, now)
        changed.append(key != before)
        return verdict

    for module in (rule, files_keys, pg_keys):
        monkeypatch.setattr(module, "untaken", read_stale, raising=False)
    for module in (files_keys, pg_keys):
        monkeypatch.setattr(module, "take_rate", taken)
    with concurrent.futures.ThreadPoolExecutor(racing) as pool:
        verdicts = list(
            pool.map(lambda i: store.take_key_rate("liam", 0, 1, 1001.5 + i / 100), range(racing))  # type: ignore[attr-defined]
        )
    assert all(v is not None and v.retry_after is None for v in verdicts)  # every one admitted
    assert changed.count(True) == 1  # one write, not eight
    stored = store.read_key("liam")  # type: ignore[attr-defined]
    assert 1001.5 <= stored.rate.last_used <= 1001.5 + (racing - 1) / 100


def test_a_use_the_files_store_is_recording_admits_the_processs_other_requests_without_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the store, as the gateway asks it: while one request records a key's stale use
    (under the keys' lock), another of the same process is admitted without queueing for that
    lock. The store keeps one `UsesInFlight` for its life (it made a new one at every call
    before, so no request ever saw another's use in flight). On PostgreSQL the keys share one
    kept connection, so a read waits for a change under way whatever the rule."""
    import lanefold.stores.files._keys as files_keys

    store = open_store(None, tmp_path / "runs")
    _create(capsys, ["--runs-dir", str(tmp_path / "runs")], "pia")
    assert store.take_key_rate("pia", 0, 1, 1000.0) is not None  # type: ignore[attr-defined]
    recording, second_through = threading.Event(), threading.Event()
    calls: list[float] = []
    real_take = files_keys.take_rate

    def held(key: Any, tokens: int, requests: int, now: float) -> Any:
        calls.append(now)
        recording.set()
        assert second_through.wait(timeout=10), "the second request queued for the lock"
        return real_take(key, tokens, requests, now)

    monkeypatch.setattr(files_keys, "take_rate", held)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first = pool.submit(store.take_key_rate, "pia", 0, 1, 1002.0)  # type: ignore[attr-defined]
        assert recording.wait(timeout=10)
        second = store.take_key_rate("pia", 0, 1, 1002.1)  # type: ignore[attr-defined]
        second_through.set()
        assert first.result(timeout=30) is not None
    assert second is not None and second.retry_after is None and not second.revoked
    assert calls == [1002.0]  # one took under the lock; the other was admitted beside it


def test_a_last_use_recorded_by_a_request_whose_clock_read_later_is_kept() -> None:
    """A request admitted while another recorded the key's use may hold an earlier `now` than
    the one recorded: within the second, its take changes nothing (it wrote the use back by a
    few milliseconds before)."""
    from lanefold.primitives import KeyRecord, StoredKey, take_rate

    key = StoredKey(record=KeyRecord(name="mia", sha256="0" * 64))
    assert take_rate(key, 0, 1, 1001.6).retry_after is None
    before = key.model_copy(deep=True)
    assert take_rate(key, 0, 1, 1001.5).retry_after is None
    assert key == before and key.rate.last_used == 1001.6
    assert take_rate(key, 0, 1, 1000.5).retry_after is None  # a clock stepped back a second
    assert key.rate.last_used == 1000.5


def test_a_use_being_recorded_admits_the_keys_other_requests_without_the_lock() -> None:
    """While one request of a process records a key's use (under the store's lock, a forced
    write), another that found the use stale is admitted with nothing to take, never waiting
    for that lock; a key with buckets always takes under the lock."""
    from lanefold.primitives import KeyRecord, RateVerdict, StoredKey, UsesInFlight

    uses = UsesInFlight()
    plain = StoredKey(record=KeyRecord(name="nia", sha256="1" * 64))
    metered = StoredKey(record=KeyRecord(name="otto", sha256="2" * 64, rpm=60))
    locked: list[str] = []

    def recording() -> RateVerdict:
        locked.append("nia")
        meanwhile = uses.take(plain, 5.0, lambda: pytest.fail("waited for the lock"))
        assert meanwhile == RateVerdict(None, None, None)
        assert uses.take(metered, 5.0, lambda: locked.append("otto") or RateVerdict(None, 59.0, 59.0))
        return RateVerdict(None, None, None)

    assert uses.take(plain, 5.0, recording) == RateVerdict(None, None, None)
    assert locked == ["nia", "otto"]
    assert uses.take(plain, 6.0, lambda: locked.append("nia") or RateVerdict(None, None, None)) is not None
    assert locked == ["nia", "otto", "nia"]  # recorded, then let go: the next stale read records it


def test_a_served_gateway_reads_its_keys_in_the_background_and_no_request_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While `keep_fresh` runs (a served gateway runs it beside itself), the keys are read again
    in the background: no request waits for a read, even one under way (each takes 0.3 s here),
    and a key created meanwhile is found at the next read. A store that fails those reads is
    logged; after four missed reads a request reads the keys itself and fails as the store
    does."""
    from lanefold.primitives import KeyRecord, StoreError
    from lanefold.serve import key_digest, new_key

    store = open_store(None, tmp_path / "runs")
    failing: list[bool] = []

    class Slow:
        def list_keys(self) -> Any:
            if failing:
                raise StoreError("the keys' folder cannot be read")
            time.sleep(0.3)
            return store.list_keys()  # type: ignore[attr-defined]

    keys = StoreKeys(Slow(), refresh_s=0.1)  # type: ignore[arg-type]
    token = new_key()
    waits: list[float] = []

    async def scenario() -> None:
        await keys.fresh()  # nothing read yet: this request reads them
        async with anyio.create_task_group() as tg:
            tg.start_soon(keys.keep_fresh)
            store.create_key(KeyRecord(name="quinn", sha256=key_digest(token)))  # type: ignore[attr-defined]
            end = time.monotonic() + 1.2
            while time.monotonic() < end:
                began = time.monotonic()
                await keys.fresh()
                waits.append(time.monotonic() - began)
                await anyio.sleep(0.01)
            assert keys.find(token) is not None  # created after the first read, found since
            failing.append(True)
            with caplog.at_level(logging.WARNING, logger="lanefold.serve"):
                await anyio.sleep(0.6)  # a read or two fail in the background: logged
                assert any("not read again" in r.getMessage() for r in caplog.records)
                await anyio.sleep(0.4)
                with pytest.raises(StoreError, match="cannot be read"):
                    await keys.fresh()  # four reads missed: this request's own read fails
            tg.cancel_scope.cancel()

    anyio.run(scenario)
    assert len(waits) > 20 and max(waits) < 0.15, max(waits)
