"""Keys kept in the store, as the gateway and `orchestrator keys` see them.

`StoreKeys` is the gateway's view of the store's keys: every record read again at most
`refresh_s` after the last read (0.5 s), so a key created, changed or revoked by `orchestrator
keys` is seen by every worker within a second, without a restart; a revoked key is also refused
by its own bucket at the next request it makes (the store's row says so). A served gateway
reads them in the background (`keep_fresh`, started with the server), so no request waits for
that read; without it (an app driven by a test client), the request that finds them stale reads
them. `seed_keys` writes a keys file's keys into the store (the file seeds; the store then holds
them). `key_report` is what `keys show` prints and `GET /v1/usage` answers: one function, so
both say the same figures.

A key is a secret of 256 random bits (`new_key`), so its SHA-256 is all the store keeps: a
slow KDF protects guessable passwords, and nothing about such a key is guessable.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from lanefold.execution import Store, budget_store
from lanefold.primitives import ConfigError, KeyRecord, KeyStore, StoredKey
from lanefold.primitives.internal import key_budget_name, rate_levels
from lanefold.serve._keys import GatewayKey, KeyBudget, Keys, spent_by_key

__all__ = (
    "TOKENS_NOTE",
    "StoreKeys",
    "gateway_key",
    "key_digest",
    "key_report",
    "key_store",
    "new_key",
    "seed_keys",
)

_log = logging.getLogger("lanefold.serve")

TOKENS_NOTE = (
    "spend.tokens counts the tokens the key's budget counts: prefill, decode and judge tokens "
    "computed, the holds of crashed runs' lanes charged whole. A response's usage.total_tokens "
    "also counts cached prefill (usage.prompt_tokens_details.cached_tokens), which is paid "
    "through its price (in spend.cost_usd), not counted again as tokens; so spend.tokens is "
    "the sum over the key's runs of total_tokens - cached_tokens."
)


def new_key() -> str:
    """A new API key: `lf-` and 256 random bits, URL-safe."""
    return "lf-" + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """The hex SHA-256 the store keeps of `key`."""
    return hashlib.sha256(key.encode()).hexdigest()


def key_store(store: Any, where: str = "--store") -> KeyStore:
    """`store` where it keeps gateway keys (both built-in stores do)."""
    if not isinstance(store, KeyStore):
        raise ConfigError(
            f"{where}: the store {getattr(store, 'describe', store)} keeps no gateway keys "
            "(the files and PostgreSQL stores do)"
        )
    return store


def gateway_key(record: KeyRecord) -> GatewayKey:
    """A stored key as the gateway serves it (its budget is the store's `key:<name>`)."""
    return GatewayKey(
        name=record.name,
        sha256=record.sha256,
        loops=record.loops,
        max_concurrency=record.max_concurrency,
        tpm=record.tpm,
        rpm=record.rpm,
    )


class StoreKeys:
    """The store's keys as the gateway reads them: the unrevoked ones, read again at most
    `refresh_s` after the last read (`clock`: monotonic seconds)."""

    def __init__(
        self, store: KeyStore, *, refresh_s: float = 0.5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store, self.refresh_s, self.clock = store, refresh_s, clock
        self.current = Keys(())
        self._read_at: float | None = None
        self._lock = anyio.Lock()
        self._kept = False  # `keep_fresh` runs: requests read only where it fell behind

    def load(self) -> Keys:
        """Read every key now (blocking)."""
        found = self.store.list_keys()
        self.current = Keys(tuple(gateway_key(k.record) for k in found if not k.record.revoked))
        self._read_at = self.clock()
        return self.current

    async def fresh(self) -> Keys:
        """The keys, read again in a worker thread where the last read is `refresh_s` old; while
        `keep_fresh` runs, only where it has fallen behind by several reads (a store that
        failed it), so that such a request says why."""
        after = self.refresh_s * (4 if self._kept else 1)
        if not self._older_than(after):
            return self.current  # no lock taken: a background read under way is not waited for
        async with self._lock:
            if self._older_than(after):  # not read meanwhile by the lock's last holder
                await anyio.to_thread.run_sync(self.load)
        return self.current

    def _older_than(self, seconds: float) -> bool:
        """Whether the keys were never read, or last read `seconds` ago or more."""
        return self._read_at is None or self.clock() - self._read_at >= seconds

    async def keep_fresh(self) -> None:
        """Read the keys every `refresh_s`, in a worker thread, until cancelled (a server runs it
        beside itself): the periodic read otherwise falls on a request, twice a second, about
        half a millisecond added to it on a 2-core machine. A read that fails is logged and
        tried again at the next; requests find the keys stale after four missed reads and read
        them themselves, failing as the store does."""
        self._kept = True
        try:
            while True:
                await anyio.sleep(self.refresh_s)
                try:
                    async with self._lock:
                        await anyio.to_thread.run_sync(self.load)
                except Exception as exc:  # the server serves on with the keys it has
                    _log.warning("the gateway's keys were not read again: %s: %s", type(exc).__name__, exc)
        finally:
            self._kept = False

    def find(self, sent: str) -> GatewayKey | None:
        """The unrevoked key whose digest is `sent`'s, as last read."""
        return self.current.find(sent)


def seed_keys(store: Store, keys: Keys) -> None:
    """Write a keys file's keys into the store: a new one created, a known one's record set
    from the file (its revocation kept: a file does not bring back a revoked key), and each
    key's budget made (from what its recorded runs spent) with the file's limits."""
    kept = key_store(store, "--keys")
    budgets = budget_store(store, "--keys")
    for key in keys.keys:
        found = kept.read_key(key.name)
        record = KeyRecord(
            name=key.name,
            sha256=key.sha256,
            loops=key.loops,
            tpm=key.tpm,
            rpm=key.rpm,
            max_concurrency=key.max_concurrency,
            revoked=found.record.revoked if found is not None else False,
            created=found.record.created if found is not None else datetime.now(UTC),
        )
        if found is None:
            kept.create_key(record)
        elif found.record != record:
            kept.replace_key(record)
        name = key_budget_name(key.name)
        if budgets.read_budget(name) is None:
            budgets.start_budget(name, spent_by_key(store, key.name))
        b = key.budget
        budgets.set_budget(
            name, max_tokens=b.max_tokens, max_cost_usd=b.max_cost_usd, max_requests=b.max_requests
        )


def _when(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


def key_report(store: Store, key: StoredKey, now: float) -> dict[str, Any]:
    """A key's limits, spend, refusals and last use as `keys show --json` prints them and `GET
    /v1/usage` answers them; `now` is the clock the buckets are read at (`time.time`)."""
    record = key.record
    view = budget_store(store).read_budget(key_budget_name(record.name))
    tokens_left, requests_left = rate_levels(key, now)
    budget = (
        KeyBudget()
        if view is None
        else KeyBudget(
            max_tokens=view.max_tokens, max_cost_usd=view.max_cost_usd, max_requests=view.max_requests
        )
    )
    return {
        "object": "key.usage",
        "name": record.name,
        "loops": list(record.loops),
        "revoked": record.revoked,
        "created": None if record.created is None else record.created.isoformat(),
        "last_used": _when(key.rate.last_used),
        "limits": {
            **budget.model_dump(),
            "tpm": record.tpm,
            "rpm": record.rpm,
            "max_concurrency": record.max_concurrency,
        },
        "spend": {
            "tokens": 0 if view is None else view.spent_tokens,
            "cost_usd": 0.0 if view is None else view.spent_cost_usd,
            "requests": 0 if view is None else view.spent_requests,
        },
        "held": {
            "tokens": 0 if view is None else view.held_tokens,
            "cost_usd": 0.0 if view is None else view.held_cost_usd,
            "requests": 0 if view is None else view.held_requests,
        },
        "remaining": {
            "tokens": None if view is None or view.room.tokens is None else max(0, view.room.tokens),
            "cost_usd": None if view is None or view.room.cost_usd is None else max(0.0, view.room.cost_usd),
            "requests": None if view is None or view.room.requests is None else max(0, view.room.requests),
            "tokens_this_minute": None if tokens_left is None else max(0, int(tokens_left)),
            "requests_this_minute": None if requests_left is None else max(0, int(requests_left)),
        },
        "refusals": {"budget": 0 if view is None else view.refusals, "rate": key.rate.refused},
        "tokens_note": TOKENS_NOTE,
    }
