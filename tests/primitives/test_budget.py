"""Budget: worst cases, fit, reserve/settle/release arithmetic, pricing lines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lanefold.primitives import Hold, Ledger, Limits, Pricing, Spend, Usage
from lanefold.primitives.internal import cost_of

PRICES = Pricing(
    input_per_mtok=2.0,
    cached_input_per_mtok=0.5,
    output_per_mtok=8.0,
    verifier_per_mtok=1.0,
    kv_per_mtok_s=0.01,
)


def ledger(**limits: float) -> Ledger:
    return Ledger(Limits(**limits), PRICES, clock=lambda: 0.0)  # type: ignore[arg-type]


def test_shared_prefix_prices_the_prompt_once() -> None:
    holds = ledger().holds_for_request(100, [50, 50, 50], share_prefix=True, bill="sample")
    assert [h.usage for h in holds] == [Usage(100, 0, 50), Usage(0, 100, 50), Usage(0, 100, 50)]
    assert [h.requests for h in holds] == [1, 0, 0]
    assert sum(h.tokens for h in holds) == 100 + 3 * 50


def test_unshared_prompt_is_paid_by_every_lane() -> None:
    holds = ledger().holds_for_request(100, [50, 50], share_prefix=False, bill="sample")
    assert [h.usage for h in holds] == [Usage(100, 0, 50), Usage(100, 0, 50)]
    assert sum(h.tokens for h in holds) == 300


def test_fit_shrinks_to_what_the_token_limit_funds() -> None:
    book = ledger(max_tokens=100 + 4 * 50 + 49)
    holds = book.holds_for_request(100, [50] * 8, share_prefix=True, bill="sample")
    fit = book.fit(holds)
    assert (fit.k, fit.limit) == (4, "max_tokens")
    assert fit.needed == 350 and fit.available == 349
    assert book.fit(holds[:4]).limit is None


def test_fit_by_cost_and_requests() -> None:
    one = cost_of(Usage(100, 0, 50), "sample", PRICES)
    book = ledger(max_cost_usd=one * 2.5)
    holds = book.holds_for_request(100, [50] * 5, share_prefix=False, bill="sample")
    assert (book.fit(holds).k, book.fit(holds).limit) == (2, "max_cost_usd")
    book = ledger(max_requests=3)
    holds = book.holds_for_request(100, [50] * 5, share_prefix=False, bill="sample")
    assert sum(h.requests for h in holds) == 1  # one request carrying five lanes
    singles = [
        h for _ in range(5) for h in book.holds_for_request(100, [50], share_prefix=False, bill="sample")
    ]
    assert (book.fit(singles).k, book.fit(singles).limit) == (3, "max_requests")


def test_reserve_is_all_or_nothing() -> None:
    book = ledger(max_tokens=500)
    holds = book.holds_for_request(100, [100] * 4, share_prefix=False, bill="sample")
    assert book.try_reserve(holds[:2]) is None
    assert book.reserved_tokens == 400
    refused = book.try_reserve(holds[2:])
    assert refused is not None and refused[0] == "max_tokens"
    assert book.reserved_tokens == 400  # nothing of the refused request was kept


def test_settle_returns_the_unused_part_to_the_pool() -> None:
    book = ledger(max_tokens=1000)
    (hold,) = book.holds_for_request(100, [200], share_prefix=False, bill="sample")
    assert book.try_reserve([hold]) is None
    assert book.reserved_tokens == 300
    assert book.settle(hold, Usage(100, 0, 40)) == []
    assert book.reserved_tokens == 0
    assert book.spent.tokens == 140
    assert book.spent.requests == 1
    assert book.spent.cost_usd == pytest.approx((100 * 2 + 40 * 8) / 1e6)


def test_release_gives_back_a_hold_that_never_ran() -> None:
    book = ledger(max_tokens=1000)
    holds = book.holds_for_request(10, [5, 5], share_prefix=True, bill="sample")
    book.try_reserve(holds)
    for hold in holds:
        book.release(hold)
    assert (book.reserved_tokens, book.reserved_requests) == (0, 0)
    assert book.reserved_cost_usd == pytest.approx(0.0)
    assert book.spent == Spend()


def test_settle_reports_an_overrun_of_the_hold() -> None:
    book = ledger()
    (hold,) = book.holds_for_request(10, [5], share_prefix=False, bill="sample")
    book.try_reserve([hold])
    overruns = book.settle(hold, Usage(30, 0, 5))
    assert [o.limit for o in overruns] == ["max_tokens", "max_cost_usd"]
    assert overruns[0].reserved == 15 and overruns[0].actual == 35


def test_judge_tokens_are_the_verifier_line() -> None:
    spend = Spend()
    spend.add(Usage(100, 20, 10, kv_token_seconds=1e6), "verifier", PRICES, requests=1)
    assert (spend.verifier_tokens, spend.prefill_tokens, spend.decode_tokens) == (110, 0, 0)
    assert spend.cached_prefill_tokens == 20
    assert spend.verifier_usd == pytest.approx(130 * 1.0 / 1e6)
    assert spend.kv_residency_usd == pytest.approx(0.01)
    assert spend.tokens == 110


def test_judge_without_a_verifier_price_uses_token_prices() -> None:
    prices = PRICES.model_copy(update={"verifier_per_mtok": None})
    assert cost_of(Usage(100, 20, 10), "verifier", prices) == pytest.approx(
        (100 * 2 + 20 * 0.5 + 10 * 8) / 1e6
    )


def test_limits_refuse_negative_values() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        Limits(max_tokens=-1)
    with pytest.raises(ValueError, match="max_cost_usd"):
        Limits(max_cost_usd=-0.5)


def test_seconds_left_counts_earlier_segments() -> None:
    now = [100.0]
    book = Ledger(Limits(max_seconds=10), PRICES, clock=lambda: now[0], elapsed_before=4.0)
    book.start()
    now[0] = 103.0
    assert book.seconds_left() == pytest.approx(3.0)


def test_the_clock_starts_at_the_first_dispatch_not_at_model_load() -> None:
    now = [100.0]
    book = Ledger(Limits(max_seconds=10), PRICES, clock=lambda: now[0])
    now[0] = 160.0  # a minute of model loading
    assert book.seconds_left() == pytest.approx(10.0)
    book.start()
    now[0] = 161.0
    book.start()  # a second wave does not restart it
    assert book.seconds_left() == pytest.approx(9.0)


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(200, 5000),
    prompt=st.integers(1, 100),
    requests=st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 80), st.booleans(), st.floats(0, 1)),
        min_size=1,
        max_size=25,
    ),
)
def test_settled_plus_reserved_never_exceeds_the_limit(
    limit: int, prompt: int, requests: list[tuple[int, int, bool, float]]
) -> None:
    """Carve, reserve and settle in any order: the pool is never over-committed."""
    book = ledger(max_tokens=limit, max_cost_usd=limit * 5e-6, max_requests=12)
    outstanding: list[Hold] = []
    for lanes, max_out, shared, used in requests:
        holds = book.holds_for_request(prompt, [max_out] * lanes, share_prefix=shared, bill="sample")
        fit = book.fit(holds)
        holds = holds[: fit.k]
        if holds:
            assert book.try_reserve(holds) is None
            outstanding.extend(holds)
        # settle about half of what is outstanding, each lane using part of its allotment
        while len(outstanding) > 3:
            hold = outstanding.pop(0)
            actual = Usage(
                hold.usage.input_tokens, hold.usage.cached_input_tokens, int(hold.usage.output_tokens * used)
            )
            assert book.settle(hold, actual) == []
        assert book.spent.tokens + book.reserved_tokens <= limit
        assert book.spent.cost_usd + book.reserved_cost_usd <= limit * 5e-6 + 1e-12
        assert book.spent.requests + book.reserved_requests <= 12
