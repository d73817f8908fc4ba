"""Rules a config gained after logs were written: enforced on every config a user gives, let
through where a run's recorded config is read back (`reading_a_record()`), so every log a
release wrote stays readable (logs are never deprecated) while no new config can break them.

`at_most(limit)` is such a bound, as a pydantic after-validator: the bounds on counts a bill
must carry (a lane's tokens, a budget's limits, a price) are these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

__all__ = ("at_most", "in_a_record", "reading_a_record")

N = TypeVar("N", int, float)
_RECORD: ContextVar[bool] = ContextVar("lanefold_reading_a_record", default=False)


@contextlib.contextmanager
def reading_a_record() -> Iterator[None]:
    """While the block validates a run's recorded config: a rule added since it was written
    (a header named as a secret, a bound on a count) does not make the log unreadable."""
    token = _RECORD.set(True)
    try:
        yield
    finally:
        _RECORD.reset(token)


def in_a_record() -> bool:
    """Whether a run's recorded config is being read back (`reading_a_record`)."""
    return _RECORD.get()


def at_most(limit: N) -> Callable[[N | None], N | None]:
    """An after-validator refusing a value above `limit` (in pydantic's words for `le`), except
    in a recorded config."""

    def check(value: N | None) -> N | None:
        if value is not None and value > limit and not in_a_record():
            raise ValueError(f"Input should be less than or equal to {limit}")
        return value

    return check
