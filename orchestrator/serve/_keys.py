"""The gateway's keys: who may call which loop, and the budget each key spends from.

A keys file (TOML) holds one `[[keys]]` table per key: `name`, `sha256` (the hex SHA-256 of the
key; the key itself is never written down), `loops` (model names, `["*"]` for all), `budget`
(`max_tokens`, `max_cost_usd`, `max_requests`, any subset: the same limits as a loop config's
`[budget]`, where a request is one backend request), `max_concurrency` (requests at once) and
`tpm`/`rpm` (tokens and requests a minute, enforced where the keys are kept in the store).

A key's budget is the named budget `key:<name>` in the store (a row on PostgreSQL, a file in
`runs/.budgets/` on the files store), which every run of the key spends from beside its own
budget and names in its `run.started`: a replica, a restart, a CLI `resume` or a retry of the
run all charge the same budget. Made when the gateway starts, it begins from what the key's
recorded runs spent (a crashed run's lanes in flight charged whole).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lanefold.config import describe_errors, read_table
from lanefold.execution import Store, budget_store, read_state
from lanefold.primitives import ConfigError, LanefoldError
from lanefold.primitives.events import MAX_QUANTITY

__all__ = ("GatewayKey", "KeyBudget", "KeyPools", "Keys", "load_keys", "pool_name", "spent_by_key")

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
    tpm: int | None = Field(None, ge=1, le=MAX_QUANTITY)  # tokens a minute (the request's hold)
    rpm: int | None = Field(None, ge=1, le=MAX_QUANTITY)  # requests a minute

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
        """Whether the key may call the served name `loop`: listed, or (`vote/gpt-4o-mini`) its
        loop `vote` listed, which opens every model the loop serves."""
        return "*" in self.loops or loop in self.loops or loop.partition("/")[0] in self.loops


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
    """The named budget a key's runs spend from, on either store."""
    return f"key:{key.name}"


def spent_by_key(store: Store, key: str) -> tuple[int, float, int]:
    """What the key's recorded runs spent (tokens, USD, requests), with the holds of lanes a
    crash left in flight charged whole: where the key's budget starts when it is first made.
    A run is the key's if its `run.started` names the key's budget, or (a log from before
    budgets were recorded) the key as its caller."""
    name = f"key:{key}"
    total: list[Any] = [0, 0.0, 0]
    for summary in store.list_runs():
        if summary.caller != key:
            continue
        try:
            state = read_state(store, summary.run_id)
        except (LanefoldError, OSError):
            continue  # a log the store cannot read holds no spend we can fold
        started = state.started
        if started is not None and started.pools is not None and name not in started.pools:
            continue
        total[0] += state.spend.tokens
        total[1] += state.spend.cost_usd
        total[2] += state.spend.requests
        if state.result is None and state.failure is None:
            for _, lane in state.in_flight():
                if lane.hold is not None:
                    total[0] += lane.hold.tokens
                    total[1] += lane.hold.cost_usd
                    total[2] += lane.hold.requests
    return (total[0], total[1], total[2])


class KeyPools:
    """Each key's budget (a named budget in the store) and its concurrency slots. `every`:
    every key spends from its budget, limited or not (keys kept in the store, whose spend
    `keys show` reports), else only the limited ones (a keys file's)."""

    def __init__(self, keys: Keys, store: Store, *, every: bool = False) -> None:
        self.keys, self.store, self.every = keys, store, every
        self._limiters: dict[str, tuple[int, anyio.Semaphore]] = {}

    def limiter(self, key: GatewayKey) -> anyio.Semaphore | None:
        """The key's slots in this process (made again where its `max_concurrency` changed;
        requests holding the old ones finish on them)."""
        if key.max_concurrency is None:
            self._limiters.pop(key.name, None)
            return None
        found = self._limiters.get(key.name)
        if found is None or found[0] != key.max_concurrency:
            found = self._limiters[key.name] = (key.max_concurrency, anyio.Semaphore(key.max_concurrency))
        return found[1]

    def prepare(self) -> None:
        """Make each limited key's budget in the store (from what its recorded runs spent, the
        first time) and set its limits from the keys file; a key no longer limited whose
        budget exists is set unlimited (its recorded runs still charge it on resume)."""
        budgets = budget_store(self.store, "--keys")
        for key in self.keys.keys:
            name = pool_name(key)
            if budgets.read_budget(name) is None:
                if not key.budget.limited:
                    continue
                budgets.start_budget(name, spent_by_key(self.store, key.name))
            b = key.budget
            budgets.set_budget(
                name, max_tokens=b.max_tokens, max_cost_usd=b.max_cost_usd, max_requests=b.max_requests
            )

    def pools(self, key: GatewayKey | None) -> tuple[str, ...]:
        """The named budgets a run of `key` spends from (none for an unlimited file key)."""
        if key is None or not (self.every or key.budget.limited):
            return ()
        return (pool_name(key),)
