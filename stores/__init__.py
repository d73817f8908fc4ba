"""Where runs live, peers of the backends: `files` (JSON Lines under a folder, the embedded
default) and `postgres` (every machine's runs, and shared budgets, in one database).

Each implements `lanefold.primitives.Store`; `postgres` also `BudgetStore`. Arrows point down:
stores import `lanefold.primitives` only.
"""

from lanefold.stores import files, postgres

__all__ = ("files", "postgres")
