"""Paired tests of two configs on the same questions: McNemar's exact test, and Holm's
correction across the tests of one table.

A table that tests several configs (or several budgets) against one reference makes several
tests; each p-value alone overstates how surprising the smallest is. Holm's step-down
correction (Holm 1979) controls the chance of any false "differs" across them, and is never
less powerful than Bonferroni's. McNemar's p-value is always the exact binomial one on the
discordant pairs, never a normal or chi-square approximation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ("CORRECTION", "McNemar", "holm", "mcnemar", "mcnemar_p")

CORRECTION = "holm"  # how the p-values of one table's tests are adjusted


class McNemar(BaseModel):
    """A paired test of two configs on the same questions.

    `only_first`: questions the first got right and the second wrong; `only_second` the
    reverse; `p_value` two-sided, McNemar's exact test (`method` "exact": the binomial on the
    discordant pairs), None where nothing was paired; `p_adjusted`, the p-value after Holm's
    correction across the tests of its table (`adjusted_over` of them; None where not
    adjusted).
    """

    model_config = ConfigDict(frozen=True)

    paired: int
    only_first: int
    only_second: int
    p_value: float | None
    method: Literal["exact", "none"]
    p_adjusted: float | None = None
    adjusted_over: int | None = None


def mcnemar(first: Mapping[int, bool], second: Mapping[int, bool]) -> McNemar:
    """McNemar's exact test over the questions both have (keys: question index)."""
    common = set(first) & set(second)
    b = sum(1 for i in common if first[i] and not second[i])
    c = sum(1 for i in common if second[i] and not first[i])
    if not common:
        return McNemar(paired=0, only_first=0, only_second=0, p_value=None, method="none")
    p, method = mcnemar_p(b, c)
    return McNemar(paired=len(common), only_first=b, only_second=c, p_value=p, method=method)


def mcnemar_p(b: int, c: int) -> tuple[float, Literal["exact"]]:
    """Two-sided exact p-value of b against c discordant pairs: the binomial (n = b + c,
    p = 1/2) tail at min(b, c), doubled and capped at 1; computed in integers, so it is exact
    for any n."""
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**n))), "exact"


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values, in the order given (None stays None and is not counted): the
    i-th smallest of m is multiplied by m - i + 1, each kept at least as large as the one
    before it and capped at 1."""
    ranked = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(ranked)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted
