"""The view's pages as HTML, from a store's records: escaped text, inline SVG, no template engine."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from lanefold.primitives import AnyEvent, BudgetView, RunState, RunSummary, describe_answer

__all__ = (
    "budgets_page",
    "error_page",
    "eval_page",
    "evals_page",
    "lane_state",
    "login_page",
    "run_page",
    "runs_page",
    "runs_rows",
    "waves_html",
)

_e = html.escape

# A lane's state in the page (`data-state`) by its state in the fold.
_STATES = {
    "pending": "dispatched",
    "dispatched": "dispatched",
    "completed": "landed",
    "failed": "failed",
    "interrupted": "interrupted",
}


def lane_state(status: str) -> str:
    """The page's word for a lane's fold status: dispatched, landed, failed or interrupted."""
    return _STATES.get(status, "dispatched")


def _page(title: str, body: str, *, live: str | None = None) -> str:
    data = f' data-live="{_e(live)}"' if live else ""
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)} · lanefold</title>"
        '<link rel=stylesheet href="/static/view.css"><script defer src="/static/view.js"></script>'
        f"</head><body{data}><nav><a href='/'>runs</a> <a href='/evals'>evals</a> "
        "<a href='/budgets'>budgets</a></nav>"
        f"<main><h1>{_e(title)}</h1>{body}</main></body></html>\n"
    )


def error_page(title: str, line: str) -> str:
    """A refusal as the CLI words it: one line."""
    return _page(title, f"<p class=error>{_e(line)}</p>")


def login_page(wrong: bool) -> str:
    """The form that asks for the view's API key (kept in a cookie)."""
    note = "<p class=error>wrong key</p>" if wrong else ""
    return _page(
        "API key",
        f"{note}<form method=post action='/login'><label>key "
        "<input type=password name=key autofocus></label> <button>open</button></form>",
    )


def _duration(s: RunSummary) -> str:
    return f"{(s.ended - s.started).total_seconds():.2f} s" if s.ended else ""


def runs_rows(found: Iterable[RunSummary]) -> str:
    """The runs table's rows (also what the list's live updates swap in)."""
    rows = []
    for s in found:
        agreement = s.agreement
        rows.append(
            f"<tr data-run='{_e(s.run_id)}' data-status='{_e(s.status)}'>"
            f"<td><a href='/runs/{quote(s.run_id)}'>{_e(s.run_id)}</a></td><td>{_e(s.loop)}</td>"
            f"<td class=status>{_e(s.status)}</td><td>{_e(describe_answer(s.answer or ''))}</td>"
            f"<td>{'' if agreement is None else f'{agreement:.2f}'}</td><td>{s.lanes}</td>"
            f"<td>{s.tokens}</td><td>${s.cost_usd:.6f}</td>"
            f"<td>{s.started.isoformat(timespec='seconds')}</td><td>{_duration(s)}</td></tr>"
        )
    return "".join(rows)


def runs_page(
    found: Sequence[RunSummary],
    filters: dict[str, str],
    *,
    page: int,
    more: bool,
    evals: Sequence[str],
) -> str:
    """The runs list, newest first, one page of it, with its filters and pager."""
    fields = "".join(
        f"<label>{name} <input name={name} value='{_e(filters.get(name, ''))}'></label> "
        for name in ("status", "loop", "eval", "since")
    )
    pager = []
    if page > 0:
        pager.append(f"<a rel=prev href='/?{urlencode({**filters, 'page': page - 1})}'>newer</a>")
    if more:
        pager.append(f"<a rel=next href='/?{urlencode({**filters, 'page': page + 1})}'>older</a>")
    eval_links = " ".join(f"<a href='/evals/{quote(e)}'>{_e(e)}</a>" for e in evals)
    head = "".join(
        f"<th>{h}</th>"
        for h in ("id", "loop", "status", "answer", "agreement", "lanes", "tokens", "cost", "started", "took")
    )
    body = (
        f"<form class=filters>{fields}<button>filter</button></form>"
        f"<table id=runs><thead><tr>{head}</tr></thead><tbody>{runs_rows(found)}</tbody></table>"
        f"<p class=pager>{' '.join(pager)}</p>" + (f"<h2>evals</h2><p>{eval_links}</p>" if evals else "")
    )
    live = "/live/runs" if page == 0 else None
    return _page("runs", body, live=f"{live}?{urlencode(filters)}" if live else None)


def waves_html(state: RunState) -> str:
    """Each wave a row of lanes, each lane's element carrying data-lane, data-wave, data-state."""
    rows = []
    for number, wave in sorted(state.waves.items()):
        lanes = []
        for lane_no, lane in sorted(wave.lanes.items()):
            tokens = lane.usage.input_tokens + lane.usage.output_tokens if lane.usage else 0
            # a call or a JSON value as a person reads it; no answer: why, where the extractor says
            shown = (
                describe_answer(lane.answer)
                if lane.answer is not None
                else f"no answer: {lane.answer_error}"
                if lane.answer_error
                else (lane.error or "")
            )
            lanes.append(
                f"<div class=lane data-lane='{lane_no}' data-wave='{number}' "
                f"data-state='{lane_state(lane.status)}' title='{_e(lane.text or '')}'>"
                f"<b>{lane_no}</b> <span class=tokens>{tokens}</span> "
                f"<span class=answer>{_e(shown)}</span></div>"
            )
        rows.append(f"<div class=wave data-wave='{number}'><h3>wave {number}</h3>{''.join(lanes)}</div>")
    return "".join(rows)


def votes_html(state: RunState) -> str:
    """The vote tally as bars: the reduce's votes, else the landed lanes' answers so far."""
    votes: dict[str, float] = {}
    if state.reduce is not None and state.reduce.votes:
        votes = {k: float(v) for k, v in state.reduce.votes.items()}
    else:
        for wave in state.waves.values():
            for lane in wave.lanes.values():
                if lane.status == "completed" and lane.answer is not None:
                    votes[lane.answer] = votes.get(lane.answer, 0) + 1
    top = max(votes.values(), default=1) or 1
    bars = "".join(
        f"<div class=vote data-answer='{_e(answer)}' data-votes='{count:g}'>"
        f"<span class=label>{_e(describe_answer(answer))}</span>"
        f"<span class=bar style='width:{100 * count / top:.1f}%'></span> {count:g}</div>"
        for answer, count in sorted(votes.items(), key=lambda kv: -kv[1])
    )
    return bars or "<p>no votes yet</p>"


def live_parts(state: RunState, new: Sequence[AnyEvent]) -> dict[str, str]:
    """What a live run page swaps in as lanes land (`timeline`: rows to append, of `new`)."""
    return {
        "waves": waves_html(state),
        "votes": votes_html(state),
        "status": _status(state),
        "outcome": outcome_html(state),
        "timeline": timeline_rows(new),
    }


def _status(state: RunState, cut_off: bool = False) -> str:
    if state.result is not None:
        return str(state.result.get("status", "answered"))
    if cut_off:
        return "stopped"  # no writer and no ending recorded: a crash or a kill cut it off
    return "failed" if state.failure else "interrupted" if state.interrupted else "running"


def _table(rows: Iterable[tuple[Any, Any]], ident: str) -> str:
    cells = "".join(f"<tr><th>{_e(str(k))}</th><td>{_e(str(v))}</td></tr>" for k, v in rows)
    return f"<table id={ident}>{cells}</table>"


def run_page(
    run_id: str,
    events: Sequence[AnyEvent],
    state: RunState,
    resume_flags: list[str],
    *,
    cut_off: bool = False,
) -> str:
    """A run: waves of lanes, votes, judge scores, winner, bill, timeline, config, resume line
    (for a run interrupted, or `cut_off`: unfinished with no writer, as a kill leaves one)."""
    status = _status(state, cut_off)
    parts = [f"<p>status <b id=status>{_e(status)}</b></p>"]
    if state.started is not None:
        parts.append(f"<p class=question>{_e(state.started.question)}</p>")
    if state.interrupted is not None or cut_off:  # the command that continues it, as it can be pasted
        resume = shlex.join(["orchestrator", "resume", run_id, *resume_flags])
        parts.append(f"<pre id=resume>{_e(resume)}</pre>")
    parts.append(f"<h2>lanes</h2><div id=waves>{waves_html(state)}</div>")
    parts.append(f"<h2>votes</h2><div id=votes>{votes_html(state)}</div>")
    parts.append(f"<div id=outcome>{outcome_html(state)}</div>")
    parts.append(f"<h2>timeline</h2><table id=timeline>{timeline_rows(events)}</table>")
    if state.started is not None:
        parts.append(f"<h2>config</h2><pre id=config>{_e(json.dumps(state.started.config, indent=2))}</pre>")
    live = (
        None
        if state.result is not None or state.failure is not None
        else f"/live/runs/{quote(run_id)}?after={state.last_sequence}"
    )
    return _page(f"run {run_id}", "".join(parts), live=live)


def outcome_html(state: RunState) -> str:
    """Judge scores, the winner and its text, the failure, the bill: what a run ends with."""
    parts = []
    if state.scores:
        parts.append("<h2>judge scores</h2>" + _table(sorted(state.scores.items()), "scores"))
    if state.reduce is not None:
        # The winning lane as the fold finds it (a judge's wave numbers its lanes as the
        # candidates' do: the lane number alone is not the winner).
        won = state.winner()
        if won is None and state.reduce.winner_lane is not None:
            reduced = state.reduction_waves.get(1)
            won = state.winning_lane(state.reduce.winner_lane, state.reduce.winner_wave, reduced)
        winner_text = (won[1].text if won is not None else None) or ""
        parts.append(
            f"<h2>winner</h2><p id=winner data-answer='{_e(str(state.reduce.winner))}'>"
            f"{_e(describe_answer(str(state.reduce.winner)))} (lane {state.reduce.winner_lane})</p>"
            f"<pre id=winner-text>{_e(winner_text)}</pre>"
        )
    if state.failure is not None:
        parts.append(f"<p class=error>{_e(state.failure.message)}</p>")
    if state.result:
        parts.append("<h2>bill</h2>" + _bill(state.result))
    return "".join(parts)


def timeline_rows(events: Iterable[AnyEvent]) -> str:
    """The event timeline's rows: sequence, time, type, wave, lane."""
    return "".join(
        f"<tr><td>{e.sequence}</td><td>{e.time.isoformat(timespec='milliseconds')}</td><td>{_e(e.type)}</td>"
        f"<td>{'' if e.wave is None else e.wave}</td><td>{'' if e.lane is None else e.lane}</td></tr>"
        for e in events
    )


def _bill(result: dict[str, Any]) -> str:
    cost, usage = result.get("cost") or {}, result.get("usage") or {}
    rows = "".join(
        f"<tr data-line='{_e(k)}'><th>{_e(k)}</th><td class=usd>{float(v):.8f}</td></tr>"
        for k, v in cost.items()
    )
    tokens = "".join(f"<tr data-usage='{_e(k)}'><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in usage.items())
    return f"<table id=bill>{rows}</table><table id=usage>{tokens}</table>"


def eval_page(eval_id: str, summary: dict[str, Any] | None, rows: Sequence[dict[str, Any]]) -> str:
    """An eval: accuracy with its interval, a row per question, the accuracy curve as SVG."""
    parts = []
    if summary:
        low, high = (summary.get("interval") or [None, None])[:2]
        parts.append(
            f"<p id=accuracy data-accuracy='{summary.get('accuracy')}'>accuracy "
            f"<b>{summary.get('accuracy')}</b> (95% interval {low} to {high})</p>"
        )
        parts.append(
            _table(((k, v) for k, v in summary.items() if not isinstance(v, dict | list)), "summary")
        )
    body = "".join(
        f"<tr data-correct='{str(bool(r.get('correct'))).lower()}'><td>{_e(str(r.get('id', i)))}</td>"
        f"<td>{'right' if r.get('correct') else 'wrong'}</td><td>{_e(str(r.get('agreement', '')))}</td>"
        f"<td>{_e(str(r.get('cost_usd', '')))}</td>"
        f"<td><a href='/runs/{quote(str(r.get('run_id', '')))}'>{_e(str(r.get('run_id', '')))}</a></td></tr>"
        for i, r in enumerate(rows)
    )
    parts.append(
        "<table id=questions><tr><th>question</th><th>score</th><th>agreement</th><th>spend</th>"
        f"<th>run</th></tr>{body}</table>"
    )
    parts.append("<h2>accuracy as questions land</h2>" + _curve_svg(rows))
    return _page(f"eval {eval_id}", "".join(parts))


def _curve_svg(rows: Sequence[dict[str, Any]]) -> str:
    points, right = [], 0
    for i, r in enumerate(rows, 1):
        right += bool(r.get("correct"))
        points.append((i, right / i))
    if not points:
        return "<p>no questions yet</p>"
    n = max(len(points) - 1, 1)
    path = " ".join(f"{10 + 380 * (i - 1) / n:.1f},{190 - 180 * acc:.1f}" for i, acc in points)
    return (
        "<svg id=curve viewBox='0 0 400 200' width=400 height=200 role=img>"
        "<rect x=10 y=10 width=380 height=180 class=frame /><polyline class=line points='"
        f"{path}' /></svg>"
    )


def _run_links(run_ids: Iterable[str]) -> str:
    return " ".join(f"<a href='/runs/{quote(r)}'>{_e(r)}</a>" for r in run_ids)


Point = tuple[str, float, float, float, float, bool]  # eval, accuracy, low, high, $/question, over


def evals_page(points: Sequence[Point], prefix: str) -> str:
    """Every eval (or those of one compare or sweep, by id prefix): accuracy with its interval
    against mean paid spend per question, as a table and a plot with the Pareto frontier. An
    eval that paid over 105% of the equal budget it was fitted to is marked over (`data-over`,
    a cross) and is never on the frontier."""
    frontier = _frontier(points)
    rows = "".join(
        f"<tr data-eval='{_e(e)}' data-frontier='{str(e in frontier).lower()}' "
        f"data-over='{str(over).lower()}'>"
        f"<td><a href='/evals/{quote(e)}'>{_e(e)}</a></td><td>{acc:.3f}</td><td>{low:.3f} to {high:.3f}</td>"
        f"<td>{cost:.6f}</td><td>{'over budget' if over else ''}</td></tr>"
        for e, acc, low, high, cost, over in points
    )
    form = (
        f"<form><label>id prefix <input name=prefix value='{_e(prefix)}'></label> "
        "<button>filter</button></form>"
    )
    table = (
        "<table id=evals><tr><th>eval</th><th>accuracy</th><th>95% interval</th>"
        "<th>mean $ / question</th><th>equal budget</th></tr>"
        f"{rows}</table>"
    )
    return _page("evals", form + table + "<h2>accuracy against paid spend</h2>" + _pareto_svg(points))


def _frontier(points: Sequence[Point]) -> set[str]:
    """The evals within their budget that no other within its budget beats on both: as
    accurate or more for as little or less, better on one. An eval over its budget is on no
    frontier."""
    fair = [p for p in points if not p[5]]
    return {
        e
        for e, acc, _, _, cost, _ in fair
        if not any(a >= acc and c <= cost and (a > acc or c < cost) for _, a, _, _, c, _ in fair)
    }


def _pareto_svg(points: Sequence[Point]) -> str:
    if not points:
        return "<p>no evals yet</p>"
    top = max(p[4] for p in points) or 1.0

    def x(cost: float) -> float:
        return 40 + 340 * cost / top

    def y(acc: float) -> float:
        return 190 - 180 * acc

    def mark(e: str, a: float, c: float, over: bool) -> str:
        title = f"<title>{_e(e)}: {a:.3f}, ${c:.6f}{', over budget' if over else ''}</title>"
        if over:  # a cross, never a point of the frontier
            return f"<path class=over d='M{x(c) - 4:.1f},{y(a) - 4:.1f} l8,8 m0,-8 l-8,8'>{title}</path>"
        return f"<circle cx='{x(c):.1f}' cy='{y(a):.1f}' r=4>{title}</circle>"

    marks = "".join(
        f"<line class=interval x1='{x(c):.1f}' x2='{x(c):.1f}' y1='{y(lo):.1f}' y2='{y(hi):.1f}' />"
        + mark(e, a, c, over)
        for e, a, lo, hi, c, over in points
    )
    frontier = _frontier(points)
    best = sorted((p[4], p[1]) for p in points if p[0] in frontier)
    line = " ".join(f"{x(c):.1f},{y(a):.1f}" for c, a in best)
    return (
        "<svg id=pareto viewBox='0 0 400 220' width=400 height=220 role=img>"
        "<rect x=40 y=10 width=340 height=180 class=frame />"
        f"<polyline class=line points='{line}' />{marks}"
        f"<text x=40 y=210>$0</text><text x=300 y=210>${top:.6f}</text>"
        "<text x=0 y=15>1.0</text><text x=0 y=190>0.0</text></svg>"
    )


def budgets_page(
    budgets: Sequence[BudgetView], note: str | None, spending: dict[str, list[str]] | None = None
) -> str:
    """Each named budget: limit, spent, held, left, the run segments holding part of it, the
    requests it refused, and the recent runs spending from it."""
    if note:
        return _page("budgets", f"<p>{_e(note)}</p>")
    rows = []
    for b in budgets:
        left = "" if b.max_tokens is None else b.max_tokens - b.spent_tokens - b.held_tokens
        left_usd = (
            "" if b.max_cost_usd is None else f"{b.max_cost_usd - b.spent_cost_usd - b.held_cost_usd:.6f}"
        )
        rows.append(
            f"<tr data-budget='{_e(b.name)}'><td>{_e(b.name)}</td><td>{b.max_tokens}</td>"
            f"<td>{b.spent_tokens}</td>"
            f"<td>{b.held_tokens}</td><td class=left>{left}</td><td>{b.max_cost_usd}</td>"
            f"<td>{b.spent_cost_usd:.6f}</td><td>{b.held_cost_usd:.6f}</td><td>{left_usd}</td>"
            f"<td>{b.holders}</td><td class=refused>{b.refusals}</td>"
            f"<td class=runs>{_run_links((spending or {}).get(b.name, []))}</td></tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "name",
            "max tokens",
            "spent",
            "held",
            "left",
            "max $",
            "spent $",
            "held $",
            "left $",
            "holders",
            "refused",
            "runs",
        )
    )
    return _page("budgets", f"<table id=budgets><tr>{head}</tr>{''.join(rows)}</table>")
