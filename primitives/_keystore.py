"""Gateway keys kept in a store: a key's record and its per-minute rate buckets.

A key's record (`KeyRecord`: name, the SHA-256 of the key, the loops it may call, its limits per
minute and at once, whether it is revoked) and its counters (`KeyRate`: the token and request
buckets, when it was last used, the requests its rates refused) live in the store, written by
`orchestrator keys` and read by every gateway worker and replica. Its budget (tokens, USD and
requests in all) is not here: it is the named budget `key:<name>` of the `BudgetStore`, so a
key's spend is counted by the one ledger every run already spends through.

`KeyStore` is its own protocol beside `BudgetStore` rather than more verbs on it: a store may keep
budgets without keys (a CLI fleet needs no gateway), and the key verbs change a record and a
bucket, never a hold. Both built-in stores implement both.

The bucket rule is `take_rate`/`give_rate` here, once, and each store applies it under its own
lock (a lock file; a row held `FOR UPDATE`): a bucket holds at most its per-minute limit, refills
continuously at limit/60 a second, and a request takes its hold from it or waits (`Retry-After`)
until the bucket holds enough.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lanefold.primitives._errors import ConfigError
from lanefold.primitives.events import MAX_QUANTITY

__all__ = (
    "KeyRate",
    "KeyRecord",
    "KeyStore",
    "RateVerdict",
    "StoredKey",
    "UsesInFlight",
    "check_key_name",
    "give_rate",
    "key_budget_name",
    "rate_levels",
    "take_rate",
    "untaken",
    "use_only",
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_MINUTE = 60.0


def check_key_name(name: str, where: str = "key") -> str:
    """A key's name: letters, digits and `._-`, at most 64 characters, starting with a letter
    or digit (it names a file on the files store, and a run's caller); else a ConfigError
    naming `where` and the name."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ConfigError(f"{where}: {name!r} is not a key name (letters, digits and ._- only, at most 64)")
    return name


def key_budget_name(name: str) -> str:
    """The named budget a key's runs spend from, on every store: `key:<name>`."""
    return f"key:{name}"


class KeyRecord(BaseModel):
    """A key as the store keeps it: never the key, only its SHA-256. `loops`: the model names
    it may call (`*`: all); `tpm`/`rpm`: tokens and requests a minute (None: no limit);
    `max_concurrency`: its requests at once on each gateway process."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha256: str
    loops: tuple[str, ...] = ("*",)
    tpm: int | None = Field(None, ge=1, le=MAX_QUANTITY)
    rpm: int | None = Field(None, ge=1, le=MAX_QUANTITY)
    max_concurrency: int | None = Field(None, ge=1)
    revoked: bool = False
    created: datetime | None = None

    @field_validator("name")
    @classmethod
    def _plain(cls, value: str) -> str:
        if _NAME.fullmatch(value) is None:
            raise ValueError("a key's name is letters, digits and ._- (at most 64)")
        return value

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if re.fullmatch(r"[0-9a-fA-F]{64}", value) is None:
            raise ValueError("the hex SHA-256 of the key (64 hex digits), never the key")
        return value.lower()


class KeyRate(BaseModel):
    """A key's counters: its buckets' levels as they stood at `at` (None: full), when a
    request last used it (`last_used`, the gateway's clock) and the requests its rates
    refused."""

    model_config = ConfigDict(extra="forbid")

    tokens: float | None = None
    requests: float | None = None
    at: float | None = None
    last_used: float | None = None
    refused: int = 0


class StoredKey(BaseModel):
    """A key's record with its counters, as one store read gives them."""

    model_config = ConfigDict(extra="forbid")

    record: KeyRecord
    rate: KeyRate = KeyRate()


@dataclass(frozen=True, slots=True)
class RateVerdict:
    """What a key's buckets said of a request: `retry_after` None where it was admitted (its
    hold taken), else the seconds until the buckets hold enough (`math.inf`: never, the
    request asks more than a minute's limit); what each bucket holds now (None: no limit)."""

    retry_after: float | None
    tokens_left: float | None
    requests_left: float | None
    limit: str | None = None  # "tpm" or "rpm": the bucket that refused
    revoked: bool = False


def _level(stored: float | None, at: float | None, limit: int | None, now: float) -> float | None:
    """A bucket's level at `now`: what it held at `at` plus limit/60 a second since, at most
    `limit` (None: no limit, no bucket)."""
    if limit is None:
        return None
    if stored is None or at is None:
        return float(limit)
    return min(float(limit), stored + max(0.0, now - at) * limit / _MINUTE)


def _wait(level: float, asked: float, limit: int) -> float:
    """Seconds until a bucket at `level` holds `asked` (inf: more than it ever holds)."""
    if asked > limit:
        return math.inf
    return max(0.0, (asked - level) * _MINUTE / limit)


def take_rate(key: StoredKey, tokens: int, requests: int, now: float) -> RateVerdict:
    """Take `tokens` and `requests` from the key's buckets at `now`, both or neither: the rule
    each store applies under its lock to the `KeyRate` it then writes back, where it changed. A
    refusal counts in `refused`; an admission sets `last_used`. A revoked key takes nothing.
    A key `untaken` admits changes nothing: a request admitted while this one waited for the
    lock recorded its use (without this, every request that found the last use a second old
    at once wrote it again, one forced write after another under the lock: on the gateway at
    32 clients, a dozen requests stalled 50 to 240 ms once a second)."""
    record, rate = key.record, key.rate
    if record.revoked:
        return RateVerdict(None, None, None, revoked=True)
    quick = untaken(key, now)
    if quick is not None:
        return quick
    level_t = _level(rate.tokens, rate.at, record.tpm, now)
    level_r = _level(rate.requests, rate.at, record.rpm, now)
    waits = []
    if record.tpm is not None and level_t is not None and level_t < tokens:
        waits.append((_wait(level_t, tokens, record.tpm), "tpm"))
    if record.rpm is not None and level_r is not None and level_r < requests:
        waits.append((_wait(level_r, requests, record.rpm), "rpm"))
    rate.tokens, rate.requests, rate.at = level_t, level_r, now
    if waits:
        rate.refused += 1
        wait, limit = max(waits)
        return RateVerdict(wait, level_t, level_r, limit)
    if level_t is not None:
        rate.tokens = level_t - tokens
    if level_r is not None:
        rate.requests = level_r - requests
    rate.last_used = now
    return RateVerdict(None, rate.tokens, rate.requests)


LAST_USED_GRAIN_S = 1.0  # a key's last use is kept to the second


def untaken(key: StoredKey | None, now: float) -> RateVerdict | None:
    """The verdict on a request a store may give from a read alone, without its lock or a
    write: a key with no buckets (no tpm, no rpm), not revoked, whose last use is recorded
    within a second of `now` (before it, or after it: recorded by a request whose clock was
    read a moment later), is admitted with nothing to take (`take_rate` would only move its
    last use by less than a second). None: `take_rate` it under the lock. A busy key's record
    is thereby written about once a second, not at every request."""
    if key is None or not use_only(key):
        return None
    last = key.rate.last_used
    if last is None or not -LAST_USED_GRAIN_S < now - last < LAST_USED_GRAIN_S:
        return None
    return RateVerdict(None, None, None)


def use_only(key: StoredKey) -> bool:
    """Whether `take_rate` changes `key` by its last use alone: not revoked, no tpm, no rpm."""
    return not key.record.revoked and key.record.tpm is None and key.record.rpm is None


class UsesInFlight:
    """The keys whose last use a request of this process is recording now (a store's own, its
    threads sharing it). A key `use_only` whose last use is a second old is read so by every
    request admitted at that moment: the first records it, under the store's lock and with a
    forced write; the others are admitted with nothing to take rather than wait for that lock
    only to find the use recorded (on the gateway at 32 clients a dozen requests waited 50 to
    240 ms for it once a second). Another process's requests record it on their own."""

    def __init__(self) -> None:
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def take(
        self, read: StoredKey | None, now: float, locked: Callable[[], RateVerdict | None]
    ) -> RateVerdict | None:
        """A store's `take_key_rate`, given its read of the key without the lock: None where
        there is no such key; `untaken`; else for a key `use_only` whose use another request
        of this process records now, admitted with nothing to take; else `locked()`, its
        change under the lock (`take_rate`)."""
        if read is None:
            return None
        quick = untaken(read, now)
        if quick is not None:
            return quick
        if not use_only(read):
            return locked()
        with self.recording(read.record.name) as first:
            return locked() if first else RateVerdict(None, None, None)

    @contextlib.contextmanager
    def recording(self, name: str) -> Iterator[bool]:
        """True for the block if this request records `name`'s use; False if another is already."""
        with self._lock:
            first = name not in self._names
            self._names.add(name)
        try:
            yield first
        finally:
            if first:
                with self._lock:
                    self._names.discard(name)


def give_rate(key: StoredKey, tokens: int, now: float) -> None:
    """Settle a taken token hold to what was paid: `tokens` back into the bucket (negative:
    taken further, where a request paid more than it held), at most the limit."""
    record, rate = key.record, key.rate
    level = _level(rate.tokens, rate.at, record.tpm, now)
    level_r = _level(rate.requests, rate.at, record.rpm, now)
    if level is not None and record.tpm is not None:
        level = min(float(record.tpm), level + tokens)
    rate.tokens, rate.requests, rate.at = level, level_r, now


def rate_levels(key: StoredKey, now: float) -> tuple[float | None, float | None]:
    """What the key's token and request buckets hold at `now` (None: no limit)."""
    rate = key.rate
    return (
        _level(rate.tokens, rate.at, key.record.tpm, now),
        _level(rate.requests, rate.at, key.record.rpm, now),
    )


@runtime_checkable
class KeyStore(Protocol):
    """A store that keeps gateway keys (`KeyRecord` and `KeyRate`), read by every gateway
    worker and replica and written by `orchestrator keys`.

    The contract both stores keep: names and hashes are unique; a record is replaced whole; a
    bucket is changed only by `take_rate`/`give_rate` applied under the key's lock, so
    processes sharing a key never take more than its buckets hold."""

    def create_key(self, record: KeyRecord) -> StoredKey:
        """Add a key; a ConfigError where its name or its hash is already kept."""
        ...

    def replace_key(self, record: KeyRecord) -> StoredKey:
        """Replace the record of the key of that name (its counters kept); a ConfigError where
        there is none."""
        ...

    def read_key(self, name: str) -> StoredKey | None:
        """The key `name` with its counters as they stand; None where there is none."""
        ...

    def list_keys(self) -> list[StoredKey]:
        """Every key, by name."""
        ...

    def take_key_rate(self, name: str, tokens: int, requests: int, now: float) -> RateVerdict | None:
        """`take_rate` on the key under its lock, written back, or where `untaken` gives a
        verdict from a read alone, that verdict (nothing written); None where there is no key."""
        ...

    def give_key_rate(self, name: str, tokens: int, now: float) -> None:
        """`give_rate` on the key under its lock, written back (no key: nothing)."""
        ...
