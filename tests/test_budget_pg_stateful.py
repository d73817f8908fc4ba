"""tests/test_budget_stateful.py's machine on the PostgreSQL store: the gateway's keys, a fleet's
`[budget] shared`, runs and their kills, retries and CLI resumes in one real database; every
budget within its limits and equal to the fold of its runs after every step."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from test_budget_stateful import NIGHTLY, BudgetMachine

from lanefold.primitives import BudgetView
from lanefold.stores.postgres import PgDatabase, connect_budgets, read_budget

pytestmark = pytest.mark.slow


class PgBudgetMachine(BudgetMachine):
    def view(self, name: str) -> BudgetView | None:
        """As the store reads it, on one connection kept for the machine (a connection each
        would cost more than the steps)."""
        if not hasattr(self, "conn"):
            assert self.url is not None
            self.conn = connect_budgets(PgDatabase(self.url))
            self.exits.callback(self.conn.close)
        return read_budget(self.conn, name)


def test_budget_state_machine_on_postgresql(pg_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(PgBudgetMachine, "url", pg_url)
    run_state_machine_as_test(
        PgBudgetMachine,
        settings=settings(
            max_examples=1000 if NIGHTLY else 100,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
