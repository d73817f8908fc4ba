"""The gateway's keys: who may call which loop, and the budget each key spends from.

A keys file (TOML) holds one `[[keys]]` table per key: `name`, `sha256` (the hex SHA-256 of the
key; the key itself is never written down), `loops` (model names, `["*"]` for all), `budget`
(`max_tokens`, `max_cost_usd`, `max_requests`, any subset: the same limits as a loop config's
`[budget]`, where a request is one backend request) and `max_concurrency` (requests at once).

A key's budget is a `SharedPool` its runs spend from beside their own budget. On PostgreSQL it
is the shared fleet budget `key:<name>`, so every replica spends from the one row. On the
embedded default this process keeps it, starting from what the key's recorded runs spent (the
record is the log: a restart folds it again, charging a crashed run's lanes in flight whole).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lanefold.config import describe_errors, read_table
from lanefold.execution import Store, budget_store, read_state
from lanefold.primitives import ConfigError, Hold, LanefoldError, Refusal, Room, SharedPool, short_of_room
from lanefold.primitives.events import MAX_QUANTITY

__all__ = ("GatewayKey", "KeyBudget", "Keys", "LocalKeyPool", "load_keys", "spent_by_caller")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class KeyBudget(BaseModel):
    """`budget = {...}` of a key: any subset of the limits; none is unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # As a config's [budget]: counts a bill (and a JSON number) carries exactly.
    max_tokens: int | None = Field(None, ge=0, le=MAX_QUANTITY)
    max_cost_usd: float | None = Field(None, ge=0, le=MAX_QUANTITY, allow_inf_nan=False)
    max_requests: int | None = Field(None, ge=0, le=MAX_QUANTITY)

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_tokens, self.max_cost_usd, self.max_requests))


class GatewayKey(BaseModel):
    """One `[[keys]]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha256: str
    loops: tuple[str, ...] = ("*",)
    budget: KeyBudget = KeyBudget()
    max_concurrency: int | None = Field(None, ge=1)

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
            raise ValueError(
                "the hex SHA-256 of the key (64 hex digits; e.g. printf %s KEY | sha256sum), never the key"
            )
        return value.lower()

    def may_call(self, loop: str) -> bool:
        return "*" in self.loops or loop in self.loops


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[GatewayKey] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class Keys:
    """The keys of a keys file, found by the key a client sends (in constant time)."""

    keys: tuple[GatewayKey, ...]
    _digests: tuple[bytes, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_digests", tuple(bytes.fromhex(k.sha256) for k in self.keys))

    def find(self, sent: str) -> GatewayKey | None:
        """The key whose digest is `sent`'s, else None. Every digest is compared (each in
        constant time), so the time taken says nothing of which key, or how much, matched."""
        digest = hashlib.sha256(sent.encode()).digest()
        found = None
        for key, known in zip(self.keys, self._digests, strict=True):
            if hmac.compare_digest(digest, known) and found is None:
                found = key
        return found


def load_keys(path: str | Path, loops: Iterable[str]) -> Keys:
    """The keys file at `path`, checked: one line naming the file and the key (`keys[1].sha256:
    ...`) for the first thing wrong, a ConfigError (exit 2)."""
    raw = read_table(path)
    try:
        parsed = _KeysFile.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_errors(exc)[0]}") from None
    served = set(loops)
    seen: dict[str, int] = {}
    for i, key in enumerate(parsed.keys):
        if key.name in seen:
            raise ConfigError(f"{path}: keys[{i}].name: {key.name!r} is also keys[{seen[key.name]}]'s name")
        seen[key.name] = i
        unknown = [loop for loop in key.loops if loop != "*" and loop not in served]
        if unknown:
            raise ConfigError(
                f"{path}: keys[{i}].loops: {unknown[0]!r} is not a served loop "
                f"(served: {', '.join(sorted(served)) or 'none'})"
            )
    digests = [k.sha256 for k in parsed.keys]
    if len(set(digests)) != len(digests):
        raise ConfigError(f"{path}: two keys have the same sha256")
    return Keys(tuple(parsed.keys))


def pool_name(key: GatewayKey) -> str:
    """The shared budget a key spends from on PostgreSQL."""
    return f"key:{key.name}"


def spent_by_caller(store: Store, callers: Sequence[str]) -> dict[str, tuple[int, float, int]]:
    """What each caller's recorded runs spent (tokens, USD, requests), with the holds of lanes a
    crash left in flight charged whole: where a key's budget on the embedded store starts."""
    wanted = set(callers)
    spent: dict[str, list[Any]] = {c: [0, 0.0, 0] for c in wanted}
    for summary in store.list_runs():
        if summary.caller not in wanted:
            continue
        try:
            state = read_state(store, summary.run_id)
        except (LanefoldError, OSError):
            continue  # a log the store cannot read holds no spend we can fold
        total = spent[summary.caller]
        total[0] += state.spend.tokens
        total[1] += state.spend.cost_usd
        total[2] += state.spend.requests
        if state.result is None and state.failure is None:
            for _, lane in state.in_flight():
                if lane.hold is not None:
                    total[0] += lane.hold.tokens
                    total[1] += lane.hold.cost_usd
                    total[2] += lane.hold.requests
    return {c: (t[0], t[1], t[2]) for c, t in spent.items()}


class LocalKeyPool:
    """A key's budget kept by this process (the embedded store): every run of the key spends
    from this one object, so what they hold and spend together never passes the limits."""

    def __init__(self, name: str, budget: KeyBudget, spent: tuple[int, float, int] = (0, 0.0, 0)) -> None:
        self.name = name
        self.budget = budget
        self.spent = list(spent)
        self.held: list[Any] = [0, 0.0, 0]
        self.room: Room | None = None
        self._update()

    def _update(self) -> None:
        b = self.budget
        limits = (b.max_tokens, b.max_cost_usd, b.max_requests)
        left = [
            None if limit is None else limit - s - h
            for limit, s, h in zip(limits, self.spent, self.held, strict=True)
        ]
        self.room = Room(*left)

    def _add(self, into: list[Any], tokens: int, cost_usd: float, requests: int, sign: int = 1) -> None:
        into[0] += sign * tokens
        into[1] += sign * cost_usd
        into[2] += sign * requests

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None:
        asked = (sum(h.tokens for h in holds), sum(h.cost_usd for h in holds), sum(h.requests for h in holds))
        assert self.room is not None
        short = short_of_room(self.room, *asked)
        if short is not None:
            return Refusal(*short, self.room)
        self._add(self.held, *asked)
        self._update()
        return None

    def settle(self, hold: Hold, tokens: int, cost_usd: float, requests: int) -> None:
        self._add(self.held, hold.tokens, hold.cost_usd, hold.requests, -1)
        self._add(self.spent, tokens, cost_usd, requests)
        self._update()

    def release(self, hold: Hold) -> None:
        self._add(self.held, hold.tokens, hold.cost_usd, hold.requests, -1)
        self._update()

    def charge_cut_off(self, hold: Hold) -> None:
        self.settle(hold, hold.tokens, hold.cost_usd, hold.requests)

    async def flush(self, *, wait: bool = True) -> None:
        """Nothing to write: the log is the record this pool is folded from."""

    def exhausted(self) -> str | None:
        """The limit with nothing left under it, if one is."""
        room = self.room
        assert room is not None
        lefts = (
            ("max_tokens", room.tokens),
            ("max_cost_usd", room.cost_usd),
            ("max_requests", room.requests),
        )
        for limit, left in lefts:
            if left is not None and left <= 0:
                return limit
        return None


class KeyPools:
    """Each key's pool: on PostgreSQL a shared budget opened per run (`open`), kept in the
    store; else one LocalKeyPool per key for the process's life."""

    def __init__(self, keys: Keys, store: Store) -> None:
        self.keys, self.store = keys, store
        self.shared = hasattr(store, "open_shared_pool")
        self.local: dict[str, LocalKeyPool] = {}
        self.limiters = {
            k.name: anyio.Semaphore(k.max_concurrency) for k in keys.keys if k.max_concurrency is not None
        }

    def prepare(self) -> None:
        """Make each limited key's budget: PostgreSQL's rows (limits set, spend kept), or this
        process's pools, from what the key's recorded runs spent."""
        limited = [k for k in self.keys.keys if k.budget.limited]
        if self.shared:
            budgets = budget_store(self.store, "--keys")
            for key in limited:
                b = key.budget
                limits = {
                    "max_tokens": b.max_tokens,
                    "max_cost_usd": b.max_cost_usd,
                    "max_requests": b.max_requests,
                }
                budgets.set_budget(pool_name(key), **limits)
            return
        spent = spent_by_caller(self.store, [k.name for k in limited])
        self.local = {k.name: LocalKeyPool(pool_name(k), k.budget, spent[k.name]) for k in limited}

    async def open(self, key: GatewayKey, run_id: str) -> SharedPool | None:
        """The pool `key`'s run `run_id` spends from (None: the key is unlimited). The caller
        closes it with `close`."""
        if not key.budget.limited:
            return None
        if not self.shared:
            return self.local[key.name]
        pool: SharedPool = await budget_store(self.store, "--keys").open_shared_pool(pool_name(key), run_id)
        return pool

    async def close(self, pool: SharedPool | None) -> None:
        if pool is not None and not isinstance(pool, LocalKeyPool):
            await pool.aclose()  # type: ignore[attr-defined]

    def exhausted(self, key: GatewayKey) -> str | None:
        """The limit the key has nothing left under, if one (read now)."""
        if not key.budget.limited:
            return None
        if not self.shared:
            return self.local[key.name].exhausted()
        view = budget_store(self.store, "--keys").read_budget(pool_name(key))
        if view is None:
            return None
        for limit, cap, spent, held in (
            ("max_tokens", view.max_tokens, view.spent_tokens, view.held_tokens),
            ("max_cost_usd", view.max_cost_usd, view.spent_cost_usd, view.held_cost_usd),
            ("max_requests", view.max_requests, view.spent_requests, view.held_requests),
        ):
            if cap is not None and cap - spent - held <= 0:
                return limit
        return None
