"""Budget: limits, a pricing table and the ledger.

The ledger never lets `spent + reserved` pass a limit: a wave reserves its worst case before
dispatch (`reserve`), each lane settles its actual usage after it lands (`settle`, the unused
part returns to the pool) and a hold that never ran is given back (`release`).

A run may also spend from a pool shared with other runs (`SharedPool`: a named budget in a
database). The ledger forwards every settle, release and cut-off charge to it; the dispatcher
awaits the shared reservation after the ledger's own (`try_reserve`, then `SharedPool.reserve`).

Tokens counted against `max_tokens` are tokens computed: prefill, decode and verifier tokens.
Cached prefill is not computed again; it is bounded through its price.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol

import anyio
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from lanefold.primitives._backend import Usage
from lanefold.primitives._coalesce import Coalesced
from lanefold.primitives._since import at_most
from lanefold.primitives.events import MAX_QUANTITY

__all__ = (
    "Hold",
    "Ledger",
    "Limits",
    "Overrun",
    "Pricing",
    "Refusal",
    "Room",
    "SharedPool",
    "Spend",
    "WaveFit",
    "coalesced_reservations",
    "flush_pending",
    "reserve_in_turn",
    "short_of_room",
)

Bill = Literal["sample", "verifier"]  # the line a lane is priced on
MAX_PRICE = 1_000_000.0  # USD per million tokens (or token-seconds), per line of the bill
# Bounds a config gained after logs were written (a recorded config is let through: _since).
_QUANTITY = AfterValidator(at_most(MAX_QUANTITY))
_PRICE = AfterValidator(at_most(MAX_PRICE))


class Limits(BaseModel):
    """A run's limits; None means unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Counts and amounts a bill (and a JSON number) carries exactly: past them, no limit binds.
    max_tokens: Annotated[int | None, _QUANTITY] = Field(None, ge=0)
    max_cost_usd: Annotated[float | None, _QUANTITY] = Field(None, ge=0)
    max_requests: Annotated[int | None, _QUANTITY] = Field(None, ge=0)
    max_seconds: float | None = Field(None, gt=0)


class Pricing(BaseModel):
    """USD per million tokens, per line of the bill; KV residency per million token-seconds.

    `verifier_per_mtok` prices every judge token (prompt and output) as its own line; when it
    is None, judge tokens are priced at the input/cached/output rates but still billed as the
    verifier line.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # At most MAX_PRICE: the largest wave's hold (2**48 tokens) is then still an amount a bill
    # carries (2**53 USD); no model is priced near a million dollars per million tokens.
    input_per_mtok: Annotated[float, _PRICE] = Field(0.0, ge=0)
    cached_input_per_mtok: Annotated[float, _PRICE] = Field(0.0, ge=0)
    output_per_mtok: Annotated[float, _PRICE] = Field(0.0, ge=0)
    verifier_per_mtok: Annotated[float | None, _PRICE] = Field(None, ge=0)
    kv_per_mtok_s: Annotated[float, _PRICE] = Field(0.0, ge=0)


@dataclass(slots=True)
class Spend:
    """Tokens and USD by line of the bill.

    `cut_off_*` is the line of holds charged whole for attempts cut off before they answered
    (a crash, an interrupt, a timeout, the deadline): the backend may have billed them, so they
    are never charged zero, but they are not decode tokens any lane reported.
    """

    prefill_tokens: int = 0
    cached_prefill_tokens: int = 0
    decode_tokens: int = 0
    verifier_tokens: int = 0
    kv_token_seconds: float = 0.0
    requests: int = 0
    prefill_usd: float = 0.0
    cached_prefill_usd: float = 0.0
    decode_usd: float = 0.0
    kv_residency_usd: float = 0.0
    verifier_usd: float = 0.0
    cut_off_tokens: int = 0
    cut_off_usd: float = 0.0

    @property
    def tokens(self) -> int:
        """Tokens computed (or charged as possibly computed): the figure `max_tokens` limits."""
        return self.prefill_tokens + self.decode_tokens + self.verifier_tokens + self.cut_off_tokens

    @property
    def cost_usd(self) -> float:
        return (
            self.prefill_usd
            + self.cached_prefill_usd
            + self.decode_usd
            + self.kv_residency_usd
            + self.verifier_usd
            + self.cut_off_usd
        )

    def usage_lines(self) -> dict[str, int | float]:
        """Tokens by line of the bill, named as a run's result names them."""
        return {
            "prefill_tokens": self.prefill_tokens,
            "cached_prefill_tokens": self.cached_prefill_tokens,
            "decode_tokens": self.decode_tokens,
            "verifier_tokens": self.verifier_tokens,
            "cut_off_tokens": self.cut_off_tokens,
            "kv_token_seconds": self.kv_token_seconds,
            "requests": self.requests,
        }

    def cost_lines(self) -> dict[str, float]:
        """USD by line of the bill and in total, named as a run's result names them."""
        return {
            "prefill": self.prefill_usd,
            "cached_prefill": self.cached_prefill_usd,
            "decode": self.decode_usd,
            "kv_residency": self.kv_residency_usd,
            "verifier": self.verifier_usd,
            "cut_off": self.cut_off_usd,
            "total": self.cost_usd,
        }

    def add_cut_off(self, hold: Hold) -> None:
        """Charge a cut-off attempt its whole hold, on its own line."""
        self.cut_off_tokens += hold.tokens
        self.cut_off_usd += hold.cost_usd
        self.requests += hold.requests

    def add(self, usage: Usage, bill: Bill, pricing: Pricing, requests: int = 0) -> None:
        """Add one lane's usage, priced line by line."""
        per = 1e-6
        self.requests += requests
        self.kv_token_seconds += usage.kv_token_seconds
        self.kv_residency_usd += usage.kv_token_seconds * pricing.kv_per_mtok_s * per
        if bill == "verifier":
            self.verifier_tokens += usage.input_tokens + usage.output_tokens
            self.cached_prefill_tokens += usage.cached_input_tokens
            if pricing.verifier_per_mtok is not None:
                all_tokens = usage.input_tokens + usage.cached_input_tokens + usage.output_tokens
                self.verifier_usd += all_tokens * pricing.verifier_per_mtok * per
            else:
                self.verifier_usd += _priced(usage, pricing)
            return
        self.prefill_tokens += usage.input_tokens
        self.cached_prefill_tokens += usage.cached_input_tokens
        self.decode_tokens += usage.output_tokens
        self.prefill_usd += usage.input_tokens * pricing.input_per_mtok * per
        self.cached_prefill_usd += usage.cached_input_tokens * pricing.cached_input_per_mtok * per
        self.decode_usd += usage.output_tokens * pricing.output_per_mtok * per


def short_of_room(room: Room, tokens: int, cost: float, requests: int) -> tuple[str, float, float] | None:
    """The first limit `tokens`, `cost` and `requests` would pass in `room`: (limit, asked,
    left), or None where all fit."""
    if room.tokens is not None and tokens > room.tokens:
        return "max_tokens", float(tokens), float(room.tokens)
    if room.cost_usd is not None and cost > room.cost_usd + 1e-12:
        return "max_cost_usd", cost, room.cost_usd
    if room.requests is not None and requests > room.requests:
        return "max_requests", float(requests), float(room.requests)
    return None


def reserve_in_turn(
    room: Room, asks: Sequence[Sequence[Hold]], pool: str
) -> tuple[list[tuple[Refusal | None, Room]], tuple[int, float, int]]:
    """Reservations `asks` (each all of its holds or none) taken from `room` one after another,
    as one change of a pool named `pool` makes them: each one's refusal (None: taken) and the
    room left after it, and the total taken (tokens, cost, requests), to add to the pool's
    holds."""
    done: list[tuple[Refusal | None, Room]] = []
    tokens, cost, requests = 0, 0.0, 0
    for holds in asks:
        asked = (sum(h.tokens for h in holds), sum(h.cost_usd for h in holds), sum(h.requests for h in holds))
        short = short_of_room(room, *asked)
        if short is not None:
            done.append((Refusal(*short, room, pool), room))
            continue
        room = Room(
            None if room.tokens is None else room.tokens - asked[0],
            None if room.cost_usd is None else room.cost_usd - asked[1],
            None if room.requests is None else room.requests - asked[2],
        )
        tokens, cost, requests = tokens + asked[0], cost + asked[1], requests + asked[2]
        done.append((None, room))
    return done, (tokens, cost, requests)


def coalesced_reservations(
    pool: SharedPool,
    take: Callable[[Sequence[tuple[Hold, ...]]], Awaitable[list[tuple[Refusal | None, Room]]]],
) -> Coalesced[tuple[Hold, ...], Refusal | None]:
    """A pool's `reserve`, grouped (`Coalesced`): `take(asks)` makes the asks in one change
    (with `reserve_in_turn`); the pool's `room` is set to the room after the last of them,
    and a reservation whose caller went away before it got it is released to the pool."""

    async def run(asks: Sequence[tuple[Hold, ...]]) -> list[Refusal | None]:
        done = await take(asks)
        pool.room = done[-1][1]
        return [refusal for refusal, _ in done]

    def give_back(holds: tuple[Hold, ...], refusal: Refusal | None) -> None:
        if refusal is None:
            for hold in holds:
                pool.release(hold)

    return Coalesced(run, give_back)


def coalesced_flushes(write: Callable[[], Awaitable[None]]) -> Coalesced[None, None]:
    """A pool's `flush`, grouped (`Coalesced`): `write()` writes what is pending; the flushes
    asked for while one is under way make one write after it. Each caller's settlements were
    noted before it asked, so that write takes them along: 32 runs ending together wait for
    two writes, not 32 in line."""

    async def run(items: Sequence[None]) -> list[None]:
        await write()
        return [None] * len(items)

    return Coalesced(run, lambda item, result: None)  # nothing to give back: a write is kept


async def flush_pending(
    pending: Callable[[], bool], lock: anyio.Lock, write: Callable[[], Awaitable[None]], *, wait: bool
) -> None:
    """A pool's `flush`: `write()` what is `pending()` (its grouped write, `coalesced_flushes`),
    `lock` being held by each of the pool's changes (a reservation's, a flush's). What was
    noted before the call is down when it returns: with nothing pending, a change under way
    may have taken it along, so that change is waited for (and what it put back, failing, is
    written). `wait=False` returns rather than wait for a change under way (the next one
    takes it along)."""
    if not pending():
        if not (wait and lock.locked()):
            return
        async with lock:  # the change under way ends: what it took along is down
            pass
        if not pending():
            return  # (else it failed and put it back: written below, or its error raised)
    if not wait and lock.locked():
        return
    await write()


def _priced(usage: Counts, pricing: Pricing) -> float:
    return 1e-6 * (
        usage.input_tokens * pricing.input_per_mtok
        + usage.cached_input_tokens * pricing.cached_input_per_mtok
        + usage.output_tokens * pricing.output_per_mtok
    )


class Counts(Protocol):
    """A usage's counts, read-only: a `Usage`, or its record in an event (`UsageData`)."""

    @property
    def input_tokens(self) -> int: ...

    @property
    def cached_input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def kv_token_seconds(self) -> float: ...


def cost_of(usage: Counts, bill: Bill, pricing: Pricing) -> float:
    """USD for one lane's usage under `pricing`: bit for bit `Spend().add(...)`'s `cost_usd`
    (the lines added in its order, the empty ones left out as adding 0.0 changes nothing),
    without building a Spend: the dispatch path and the fold price every lane with it."""
    per = 1e-6
    kv = usage.kv_token_seconds * pricing.kv_per_mtok_s * per
    if bill == "verifier":
        if pricing.verifier_per_mtok is not None:
            all_tokens = usage.input_tokens + usage.cached_input_tokens + usage.output_tokens
            return kv + all_tokens * pricing.verifier_per_mtok * per
        return kv + _priced(usage, pricing)
    return (
        usage.input_tokens * pricing.input_per_mtok * per
        + usage.cached_input_tokens * pricing.cached_input_per_mtok * per
        + usage.output_tokens * pricing.output_per_mtok * per
        + kv
    )


@dataclass(frozen=True, slots=True)
class Hold:
    """One lane attempt's reservation: its worst-case usage, cost and request count."""

    usage: Usage
    cost_usd: float
    requests: int
    bill: Bill

    @property
    def tokens(self) -> int:
        if self.bill == "verifier":
            return self.usage.input_tokens + self.usage.output_tokens
        return self.usage.computed_tokens


@dataclass(frozen=True, slots=True)
class Overrun:
    """Actual spend above what was reserved (a remote backend's estimate was short)."""

    limit: str
    reserved: float
    actual: float


@dataclass(frozen=True, slots=True)
class WaveFit:
    """How many of the asked lanes the pool can fund, and which limit bound it."""

    k: int
    limit: str | None  # None: all asked lanes fit
    needed: float = 0.0
    available: float = 0.0
    shared: str | None = None  # the shared budget's name, when its limit bound


@dataclass(frozen=True, slots=True)
class Room:
    """What a shared pool can still fund (limit - spent - held); None where unlimited."""

    tokens: int | None = None
    cost_usd: float | None = None
    requests: int | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A shared pool's no: the limit that refused, what was asked, the room left, and the
    pool's name (of the several a run may spend from, the one that said no)."""

    limit: str
    needed: float
    available: float
    room: Room
    pool: str = ""


class SharedPool(Protocol):
    """A budget other runs spend from too (e.g. in PostgreSQL). `reserve` is one transaction
    (all or nothing); `settle`, `release` and `charge_cut_off` mirror the ledger's, are
    synchronous (they run in the dispatch path's callbacks) and take effect in the pool at
    the next `reserve` or `flush`. Until then the pool keeps counting the whole hold, so the
    fleet's spend is never understated."""

    name: str
    room: Room | None  # what it had left at this run's last reservation, less what it holds since

    @property
    def exhausted(self) -> str | None:
        """The limit its spend had reached when this segment last read it (at its opening,
        then at each change), if one (nothing left under it, whatever live runs give back): a
        segment that opens it spent is refused before it records."""

    async def reserve(self, holds: Sequence[Hold]) -> Refusal | None: ...

    def settle(self, hold: Hold, tokens: int, cost_usd: float, requests: int) -> None: ...

    def release(self, hold: Hold) -> None: ...

    def charge_cut_off(self, hold: Hold) -> None: ...

    async def flush(self, *, wait: bool = True) -> None:
        """Write what is noted; `wait=False` leaves it to a write already under way. Else
        what was noted before the call is down when it returns."""


@dataclass(slots=True)
class Ledger:
    """The pool a run spends from. Not thread-safe: the dispatch path runs in one event loop."""

    limits: Limits
    pricing: Pricing
    clock: Callable[[], float] = time.monotonic
    spent: Spend = field(default_factory=Spend)
    reserved_tokens: int = 0
    reserved_cost_usd: float = 0.0
    reserved_requests: int = 0
    elapsed_before: float = 0.0  # active seconds of earlier segments of a resumed run
    started_at: float | None = None  # the clock starts at the first dispatch, not at model load
    shared: SharedPool | None = None  # a fleet's budget this run spends from too

    def start(self) -> None:
        """Start the `max_seconds` clock (once; later calls do nothing)."""
        if self.started_at is None:
            self.started_at = self.clock()

    # -- worst cases ----------------------------------------------------------------------------

    def holds_for_request(
        self, prompt_tokens: int, max_tokens: Sequence[int], *, share_prefix: bool, bill: Bill
    ) -> list[Hold]:
        """Per-lane worst cases for one backend request of len(max_tokens) lanes.

        With a shared prefix the first lane carries the prompt as prefill and the others as
        cached prefill; without, every lane pays the whole prompt.
        """
        holds = []
        for i, lane_max in enumerate(max_tokens):
            if share_prefix and i > 0:
                usage = Usage(0, prompt_tokens, lane_max)
            else:
                usage = Usage(prompt_tokens, 0, lane_max)
            holds.append(Hold(usage, cost_of(usage, bill, self.pricing), int(i == 0), bill))
        return holds

    def fit(self, holds: Sequence[Hold], room: Room | None = None, pool: str | None = None) -> WaveFit:
        """Largest prefix of `holds` the pool can fund now (at least 0 lanes); with `room`,
        also within what the shared pool `pool` (by default this ledger's) said it has left."""
        tokens, cost, requests = 0, 0.0, 0
        for k, hold in enumerate(holds):
            tokens, cost, requests = tokens + hold.tokens, cost + hold.cost_usd, requests + hold.requests
            short = self._short(tokens, cost, requests)
            if short is not None:
                limit, needed, available = short
                return WaveFit(k, limit, needed, available)
            if room is not None:
                short = short_of_room(room, tokens, cost, requests)
                if short is not None:
                    limit, needed, available = short
                    name = pool or (self.shared.name if self.shared is not None else "")
                    return WaveFit(k, limit, needed, available, name)
        return WaveFit(len(holds), None)

    def _short(self, tokens: int, cost: float, requests: int) -> tuple[str, float, float] | None:
        lim = self.limits
        if lim.max_tokens is not None:
            available = lim.max_tokens - self.spent.tokens - self.reserved_tokens
            if tokens > available:
                return "max_tokens", float(tokens), float(available)
        if lim.max_cost_usd is not None:
            available_usd = lim.max_cost_usd - self.spent.cost_usd - self.reserved_cost_usd
            if cost > available_usd + 1e-12:
                return "max_cost_usd", cost, available_usd
        if lim.max_requests is not None:
            available = lim.max_requests - self.spent.requests - self.reserved_requests
            if requests > available:
                return "max_requests", float(requests), float(available)
        return None

    # -- reserve / settle / release -------------------------------------------------------------

    def try_reserve(self, holds: Sequence[Hold]) -> tuple[str, float, float] | None:
        """Reserve all of `holds` or none; returns the limit that refused, if one did."""
        tokens = sum(h.tokens for h in holds)
        cost = math.fsum(h.cost_usd for h in holds)
        requests = sum(h.requests for h in holds)
        short = self._short(tokens, cost, requests)
        if short is None:
            self.reserved_tokens += tokens
            self.reserved_cost_usd += cost
            self.reserved_requests += requests
        return short

    def unreserve(self, holds: Sequence[Hold]) -> None:
        """Undo `try_reserve` here only (the shared pool refused the same holds)."""
        for hold in holds:
            self._drop(hold)

    def _drop(self, hold: Hold) -> None:
        self.reserved_tokens -= hold.tokens
        self.reserved_cost_usd -= hold.cost_usd
        self.reserved_requests -= hold.requests

    def release(self, hold: Hold) -> None:
        """Give back a hold that never reached a backend."""
        self._drop(hold)
        if self.shared is not None:
            self.shared.release(hold)

    def charge_cut_off(self, hold: Hold) -> None:
        """Replace a hold by itself, charged whole: the attempt was cut off before it answered."""
        self._drop(hold)
        self.spent.add_cut_off(hold)
        if self.shared is not None:
            self.shared.charge_cut_off(hold)

    def settle(self, hold: Hold, actual: Usage, *, requests: int | None = None) -> list[Overrun]:
        """Replace a hold by what the lane actually spent; report any overrun of the hold."""
        self._drop(hold)
        before_tokens, before_cost = self.spent.tokens, self.spent.cost_usd
        used_requests = hold.requests if requests is None else requests
        self.spent.add(actual, hold.bill, self.pricing, used_requests)
        overruns = []
        used_tokens = self.spent.tokens - before_tokens
        used_cost = self.spent.cost_usd - before_cost
        if self.shared is not None:
            self.shared.settle(hold, used_tokens, used_cost, used_requests)
        if used_tokens > hold.tokens:
            overruns.append(Overrun("max_tokens", float(hold.tokens), float(used_tokens)))
        if used_cost > hold.cost_usd + 1e-12:
            overruns.append(Overrun("max_cost_usd", hold.cost_usd, used_cost))
        return overruns

    # -- time -----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        """Active seconds: earlier segments plus this one since its first dispatch."""
        if self.started_at is None:
            return self.elapsed_before
        return self.elapsed_before + (self.clock() - self.started_at)

    def seconds_left(self) -> float | None:
        if self.limits.max_seconds is None:
            return None
        return self.limits.max_seconds - self.elapsed()
