"""Retry policy and the lane-counted slots of the dispatch path.

Backoff is exponential with jitter drawn from a seeded generator (no global randomness) and
never shorter than the retry-after a server asked for; tenacity runs the loop.
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass

import anyio
from tenacity import RetryCallState
from tenacity.wait import wait_base

__all__ = ("Backoff", "LaneSlots", "RetryLanes", "RetryPolicy")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts per lane and the backoff between them."""

    max_attempts: int = 3
    initial_backoff_s: float = 0.25
    max_backoff_s: float = 8.0
    jitter: float = 0.25  # +/- this fraction of the backoff


class RetryLanes(Exception):
    """Some lanes of a request failed retryably; tenacity waits, then the next attempt."""

    def __init__(self, retry_after: float | None) -> None:
        super().__init__("retry")
        self.retry_after = retry_after


class Backoff(wait_base):
    """Exponential backoff with seeded jitter, never shorter than a server's retry-after."""

    def __init__(self, policy: RetryPolicy, rng: random.Random) -> None:
        self._policy, self._rng = policy, rng

    def __call__(self, retry_state: RetryCallState) -> float:
        p = self._policy
        wait = min(p.max_backoff_s, p.initial_backoff_s * 2 ** (retry_state.attempt_number - 1))
        wait *= 1.0 + self._rng.uniform(-p.jitter, p.jitter)
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, RetryLanes) and exc.retry_after:
            wait = max(wait, float(exc.retry_after))
        return float(max(wait, 0.0))


# One queue per limiter, however many dispatchers (runs) take from it: a taker holding part of
# what it needs while another holds the rest would wait for ever. Keyed weakly by the limiter,
# so the queue lives exactly as long as the limiter it guards.
_QUEUES: weakref.WeakKeyDictionary[anyio.CapacityLimiter, anyio.Lock] = weakref.WeakKeyDictionary()


class LaneSlots:
    """A CapacityLimiter counted in lanes: a request of n lanes takes n tokens.

    Takers of n > 1 tokens queue on one lock per limiter, shared by every LaneSlots over it, so
    two requests (of one run or of two runs sharing the limiter) never each hold part of what
    both need; a request never asks for more tokens than the limiter has (the dispatcher
    splits larger ones).
    """

    def __init__(self, limiter: anyio.CapacityLimiter) -> None:
        self.limiter = limiter
        lock = _QUEUES.get(limiter)
        if lock is None:
            lock = _QUEUES[limiter] = anyio.Lock()
        self._lock = lock

    async def acquire(self, n: int) -> list[object]:
        """Take n lanes' worth; give them back with `release`."""
        if n == 1:  # one token cannot be half-held: the limiter's own queue keeps the order
            borrower = object()
            await self.limiter.acquire_on_behalf_of(borrower)
            return [borrower]
        borrowers: list[object] = []
        try:
            async with self._lock:
                for _ in range(n):
                    borrower = object()
                    await self.limiter.acquire_on_behalf_of(borrower)
                    borrowers.append(borrower)
        except BaseException:
            self.release(borrowers)
            raise
        return borrowers

    def release(self, borrowers: list[object]) -> None:
        for borrower in borrowers:
            self.limiter.release_on_behalf_of(borrower)
