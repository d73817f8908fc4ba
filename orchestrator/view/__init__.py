"""`orchestrator view`: a read-only web page over the store, where lanes land live.

`create_app` builds the starlette app over a `Store` (runs, a run's waves of lanes, evals,
shared budgets; server-sent events fed by the store's follow); `view` serves it with uvicorn,
loopback by default. Every script and style is served from this package: nothing is fetched
from the internet. The app is imported only when a view starts, so the command line starts
without the serve extra installed. `RunSearch` is the runs search, the page's and
`orchestrator list`'s alike: a filter means the same wherever it is asked.
"""

from __future__ import annotations

from lanefold.view._run import view
from lanefold.view._search import RunSearch
from lanefold.view._words import lane_state

__all__ = ("RunSearch", "lane_state", "view")
