"""The view's templates: Jinja2 with autoescape on every template, so a value placed in a page
is escaped unless a template says otherwise (and a test refuses `|safe` and `Markup`).

`pages` renders whole pages (starlette's `Jinja2Templates`); `part` renders one of the
components a live feed swaps into an open page, from the same macros the page was drawn with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.templating import Jinja2Templates

from lanefold.evaluate import readable
from lanefold.primitives import AnyEvent, RunState, RunSummary, describe_answer
from lanefold.view._charts import tally
from lanefold.view._waterfall import waterfall
from lanefold.view._words import lane_error, lane_state, money, run_status, why

__all__ = ("eval_parts", "live_parts", "pages", "run_context", "runs_rows")

_env = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True,  # every template, whatever its name: nothing reaches a page unescaped
    undefined=StrictUndefined,  # a misspelt name is an error, not an empty cell
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters.update(
    answer=describe_answer, money=money, lane_state=lane_state, lane_error=lane_error, spend=readable
)
pages = Jinja2Templates(env=_env)


def _macro(name: str, template: str = "components.html") -> Callable[..., str]:
    """A macro of `template`, as the live feeds call it (its output already escaped)."""
    return cast(Callable[..., str], getattr(_env.get_template(template).module, name))


def _winner_text(state: RunState) -> str:
    """The winning lane's text as the fold finds it (a judge's wave numbers its lanes as the
    candidates' do: the lane number alone is not the winner)."""
    if state.reduce is None:
        return ""
    won = state.winner()
    if won is None and state.reduce.winner_lane is not None:
        reduced = state.reduction_waves.get(1)
        won = state.winning_lane(state.reduce.winner_lane, state.reduce.winner_wave, reduced)
    return (won[1].text if won is not None else None) or ""


def run_context(
    run_id: str, events: Sequence[AnyEvent], state: RunState, where: Sequence[str], *, cut_off: bool
) -> dict[str, object]:
    """What run.html is drawn from (`cut_off`: unfinished with no writer, as a kill leaves it)."""
    live = not state.finished and f"/live/runs/{quote(run_id)}?after={state.last_sequence}"
    config = json.dumps(state.started.config, indent=2) if state.started is not None else ""
    return {
        "title": f"run {run_id}",
        "live": live or None,
        "status": run_status(state, cut_off),
        "state": state,
        "events": events,
        "tally": tally(state),
        "falls": waterfall(events),
        "won": _winner_text(state),
        "why": why(state, where, cut_off=cut_off),
        "config": config,
    }


def live_parts(
    state: RunState, every: Sequence[AnyEvent], new: Sequence[AnyEvent], where: Sequence[str]
) -> dict[str, str]:
    """What a live run page swaps in as lanes land (`every`: the run's events so far, for its
    waterfall; `timeline`: rows to append, of `new`)."""
    return {
        "waterfall": str(_macro("waterfall")(waterfall(every))),
        "waves": str(_macro("waves")(state)),
        "votes": str(_macro("votes")(tally(state))),
        "status": run_status(state),
        "outcome": str(_macro("outcome")(state, _winner_text(state), why(state, where))),
        "timeline": str(_macro("timeline")(new)),
    }


def runs_rows(found: Sequence[RunSummary]) -> str:
    """The runs table's rows (what the list's live updates swap in)."""
    return str(_macro("runs_rows")(found))


def eval_parts(context: Mapping[str, Any]) -> dict[str, str]:
    """What a live eval page swaps in as questions land, by element id (`context`: what
    eval.html is drawn from)."""
    return {
        "eval-progress": str(_macro("progress", "eval_parts.html")(context["figures"])),
        "score-filter": str(
            _macro("score_filter", "eval_parts.html")(context["eval_id"], context["score"], context["counts"])
        ),
        "question-rows": str(_macro("rows", "eval_parts.html")(context["rows"])),
        "eval-curve": str(_macro("curve", "eval_parts.html")(context["curve"])),
    }
