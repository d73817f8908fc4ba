"""A stored key's tokens and requests a minute, at the gateway's door.

Before a request's run starts, `KeyRates.admit` takes from the key's buckets in the store (one
change under the key's lock, shared by every worker and replica): one request, and the request's
token hold, the most its run may compute as its budget's holds count it (its loop's worst case:
every lane's prompt and `max_tokens`, its judge's tokens; where the loop declares no cost shape,
its config's `[budget] max_tokens`, else nothing held and the bucket only charged after). A
bucket short of it refuses the request: 429 `rate_limit_exceeded` with `Retry-After`, the
seconds until the bucket holds enough, rounded up. When the run ends its hold is settled to
the tokens it paid (the unused part goes back; a run whose end is unknown keeps it all).

Here too, beside them: a request's id (`request_id_of`), the headers an answer carries
(`answer_headers`: the same for a plain answer and a stream), and a key's own figures
(`KeyRates.usage`, `GET /v1/usage`), so that the gateway's request path changes by a few lines
only.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request

from lanefold.config import LoopConfig
from lanefold.evaluate import prompt_tokens, worst_case
from lanefold.execution import RunResult, Store
from lanefold.primitives import BudgetStore, BudgetView, KeyStore, RateVerdict, RunState, offload
from lanefold.primitives.events import AnyEvent
from lanefold.primitives.internal import key_budget_name
from lanefold.serve._gateway_wire import Ask, Go
from lanefold.serve._guard import HTTPError
from lanefold.serve._keyring import key_report
from lanefold.serve._keys import GatewayKey

__all__ = ("Admitted", "KeyRates", "answer_headers", "paid_tokens", "request_hold")

Observer = Callable[[AnyEvent], None]
Run = Callable[[Go, Observer | None], Awaitable[tuple[RunResult, RunState | None]]]


def request_hold(config: LoopConfig, ask: Ask) -> int:
    """The tokens a request's run may compute at most, as its budget holds count them."""
    sent = (*(ask.conversation or ()), *ask.turns_after)  # each turn's words and calls, bytes as tokens
    turns = sum(
        len(turn.content.encode())
        + sum(len((c.id + c.name + c.arguments).encode()) for c in turn.tool_calls)
        + 8
        for turn in sent
    )
    worst = worst_case(config, prompt_tokens(config, [ask.question]) + turns)
    if worst is not None:
        return worst.tokens
    return config.budget.max_tokens or 0


def paid_tokens(result: RunResult) -> int:
    """The tokens a run paid as a budget counts them: computed, never cached prefill."""
    u = result.usage
    return u.prefill_tokens + u.decode_tokens + u.verifier_tokens + u.cut_off_tokens


@dataclass(slots=True)
class Admitted:
    """A request the key's buckets admitted: its token hold, and what the buckets held after."""

    rates: KeyRates | None
    key: str | None = None
    hold: int = 0
    verdict: RateVerdict | None = None
    settled: bool = field(default=False)
    limits: tuple[int | None, int | None] = (None, None)  # the key's tpm and rpm
    budget: BudgetView | None = None  # the key's budget as the request was admitted

    @property
    def headers(self) -> dict[str, str]:
        """What the key has left, as it stood when the request was admitted: OpenAI's
        `x-ratelimit-limit-*` and `x-ratelimit-remaining-*` for the buckets it has (this
        minute), and `x-lanefold-budget-remaining-*` for the limits of its budget (in all)."""
        if self.verdict is None or self.key is None:
            return {}
        found: dict[str, str] = {}
        buckets = zip(
            ("tokens", "requests"),
            self.limits,
            (self.verdict.tokens_left, self.verdict.requests_left),
            strict=True,
        )
        for name, limit, left in buckets:
            if limit is not None and left is not None:
                found[f"x-ratelimit-limit-{name}"] = str(limit)
                found[f"x-ratelimit-remaining-{name}"] = str(max(0, int(left)))
        room = self.budget.room if self.budget is not None else None
        if room is not None:
            for name, value in (
                ("tokens", room.tokens),
                ("cost-usd", room.cost_usd),
                ("requests", room.requests),
            ):
                if value is not None:
                    shown = f"{max(0.0, value):.6f}" if name == "cost-usd" else str(max(0, int(value)))
                    found[f"x-lanefold-budget-remaining-{name}"] = shown
        return found

    def around(self, run: Run) -> Run:
        """`run`, its hold settled to what it paid when it ends."""
        if self.rates is None or self.key is None:
            return run

        async def settled(go: Go, observer: Observer | None) -> tuple[RunResult, RunState | None]:
            try:
                done = await run(go, observer)
            except HTTPError as refused:
                if refused.status < 500:  # refused before anything ran (a slot, the budget, 409)
                    await self.settle(0)
                raise
            await self.settle(paid_tokens(done[0]))
            return done

        return settled

    async def settle(self, paid: int) -> None:
        if self.settled or self.rates is None or self.key is None:
            return
        self.settled = True
        if self.limits[0] is None:
            # No tpm when admitted: nothing was held, and the requests bucket refills by the
            # clock alone, so writing it back would change no level (a lock, a read and a
            # forced write of the key's record saved per request).
            return
        store, key, back, now = self.rates.store, self.key, self.hold - paid, self.rates.clock()
        with anyio.CancelScope(shield=True):
            await offload(store.give_key_rate, key, back, now)


def answer_headers(run_id: str, request_id: str, admitted: Admitted) -> dict[str, str]:
    """The headers of a loop's answer, plain or streamed (or replayed from the record): the
    run's id, the request's, and what the key had left when the request was admitted. Each is
    known before the run starts, so a stream sends them all with its response start; what the
    run paid is in the answer's `usage` (a stream's last chunk), never in a header."""
    return {"x-lanefold-run-id": run_id, "x-request-id": request_id, **admitted.headers}


def request_id_of(request: Request) -> str:
    """The request's id as its run records it: the client's `X-Request-ID` where it sent one
    that is plain (at most 128 printable ASCII characters), else one made here."""
    sent = request.headers.get("x-request-id", "").strip()
    if 0 < len(sent) <= 128 and sent.isascii() and sent.isprintable():
        return sent
    return "req_" + secrets.token_hex(12)


class KeyRates:
    """The buckets of the store's keys (`clock`: the wall clock the store's buckets are kept
    in; a test gives its own)."""

    def __init__(
        self, store: KeyStore, clock: Callable[[], float] = time.time, budgets: BudgetStore | None = None
    ) -> None:
        self.store, self.clock, self.budgets = store, clock, budgets

    async def admit(self, key: GatewayKey | None, hold: Callable[[], int]) -> Admitted:
        """Take one request and `hold()` tokens from the key's buckets, or refuse (429); a key
        revoked since it was read is refused as unknown (401). Every stored key passes here,
        so its last use is recorded."""
        if key is None:
            return Admitted(None)
        tokens = hold() if key.tpm is not None else 0
        now = self.clock()
        budgets, name = self.budgets, key_budget_name(key.name)

        def take() -> tuple[RateVerdict | None, BudgetView | None]:
            """The buckets taken from, then (admitted) the key's budget: one trip to a worker
            thread. A budget made unlimited where a key was stored without one (its runs spend
            from it)."""
            verdict = self.store.take_key_rate(key.name, tokens, 1, now)
            if budgets is None or verdict is None or verdict.revoked or verdict.retry_after is not None:
                return verdict, None
            return verdict, budgets.read_budget(name) or budgets.start_budget(name, (0, 0.0, 0))

        verdict, budget = await offload(take)
        if verdict is None or verdict.revoked:
            raise HTTPError(
                401,
                "missing or unknown API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if verdict.retry_after is not None:
            raise _refusal(key, verdict, tokens)
        return Admitted(self, key.name, tokens, verdict, limits=(key.tpm, key.rpm), budget=budget)

    async def usage(self, key: GatewayKey, store: Store) -> dict[str, Any]:
        """`GET /v1/usage`: the key's own limits, spend, refusals and last use, as `keys show`
        prints them (`key_report`)."""
        stored = await offload(self.store.read_key, key.name)
        if stored is None:
            raise HTTPError(401, "missing or unknown API key", code="invalid_api_key")
        now = self.clock()
        return await offload(key_report, store, stored, now)


def _refusal(key: GatewayKey, verdict: RateVerdict, tokens: int) -> HTTPError:
    if math.isinf(verdict.retry_after or 0.0):
        return HTTPError(
            429,
            f"this request may compute {tokens} tokens, more than this key's {key.tpm} a minute "
            "(tpm): lower max_tokens, or ask for a higher tpm",
            kind="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"x-should-retry": "false"},
        )
    wait = math.ceil(round(verdict.retry_after or 0.0, 6))  # float noise never adds a second
    what = (
        f"{key.tpm} tokens a minute (tpm); this request holds {tokens}"
        if verdict.limit == "tpm"
        else f"{key.rpm} requests a minute (rpm)"
    )
    headers = {"Retry-After": str(wait)}
    for name, left in (("tokens", verdict.tokens_left), ("requests", verdict.requests_left)):
        if left is not None:
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, int(left)))
    return HTTPError(
        429,
        f"rate limit reached for this key: {what}; retry in {wait} s",
        kind="rate_limit_error",
        code="rate_limit_exceeded",
        headers=headers,
    )
