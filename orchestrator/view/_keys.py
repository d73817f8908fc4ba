"""The keys pages: every gateway key the store keeps, and one key's limits, spend, refusals,
last use, spend over time and runs.

A key's figures are `key_report`'s, the same function `orchestrator keys show` prints and `GET
/v1/usage` answers, so the three never disagree; its runs are the runs search with `caller` set
to its name. A key's hash is never read into a page: only its name and what `key_report` says.
"""

from __future__ import annotations

import time
from typing import Any

from lanefold.primitives import KeyStore, Store
from lanefold.serve import key_report
from lanefold.view._charts import spend_bars
from lanefold.view._search import RunSearch

__all__ = ("KEY_RUNS", "key_context", "keys_context")

KEY_RUNS = 500  # a key's latest runs its page reads for its spend over time (and lists 50 of)
_LISTED = 50


def keys_context(store: Store) -> dict[str, Any]:
    """What keys.html is drawn from: each key's report, or a note where the store keeps none."""
    if not isinstance(store, KeyStore):
        note = f"{store.describe} keeps no gateway keys (the files and PostgreSQL stores do)"
        return {"note": note, "keys": []}
    now = time.time()
    return {"note": None, "keys": [key_report(store, key, now) for key in store.list_keys()]}


def key_context(store: Store, name: str) -> dict[str, Any] | None:
    """What key.html is drawn from, or None where the store keeps no key `name`."""
    found = store.read_key(name) if isinstance(store, KeyStore) else None
    if found is None:
        return None
    runs = RunSearch(caller=name).runs(store, KEY_RUNS)
    unit, bars = spend_bars(runs)
    report = key_report(store, found, time.time())
    limits, left = report["limits"], report["remaining"]
    rows = [
        ("tokens a minute", limits["tpm"]),
        ("tokens left this minute", left["tokens_this_minute"]),
        ("requests a minute", limits["rpm"]),
        ("requests left this minute", left["requests_this_minute"]),
        ("requests at once", limits["max_concurrency"]),
    ]
    return {
        "report": report,
        "rates": [(what, "no limit" if value is None else value) for what, value in rows],
        "runs": runs[:_LISTED],
        "more": len(runs) > _LISTED,
        "unit": unit,
        "bars": bars,
    }
