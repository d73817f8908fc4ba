"""Terminal display: live progress of a run, one readable line per event, the final bill."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from lanefold.execution import RunResult
from lanefold.primitives import (
    REDUCERS,
    Reduction,
    RunState,
    describe_answer,
    reducer_traits,
    score_summary,
    vote_summary,
)
from lanefold.primitives.events import (
    AnyEvent,
    LaneCompleted,
    LaneDispatched,
    LaneFailed,
    RunCompleted,
    RunResumed,
    RunStarted,
    WaveBarrier,
    WaveStarted,
)
from lanefold.primitives.internal import scores_line, tally

__all__ = ("Progress", "describe", "result_line", "summary", "tally")


# Column widths that hold every value a valid log can carry, so `tail` lines up whatever the
# run: types up to `backend.n_unsupported`, lanes up to k = 100000, attempts up to 100.
_TYPE_WIDTH = 21
_WHERE = (("wave", 7), ("lane", 10), ("attempt", 11))


def describe(event: AnyEvent) -> str:
    """One line an operator can read: sequence, time, type, where, and the gist; the columns
    line up from one event to the next."""
    values = {"wave": event.wave, "lane": event.lane, "attempt": event.attempt}
    where = " ".join(
        ("" if values[key] is None else f"{key}={values[key]}").ljust(width) for key, width in _WHERE
    )
    stamp = f"{event.time:%H:%M:%S.%f}"[:-3]  # milliseconds
    gist = " ".join(_gist(event).splitlines())  # a multi-line error message stays one line
    return f"#{event.sequence:<6} {stamp} {event.type:<{_TYPE_WIDTH}} {where} {gist}".rstrip()


def result_line(reduction: Reduction) -> str | None:
    """The reducer's own one-line account of its result (its declared `summary`): votes or
    scores, say. A reducer not registered here (a `module:Class` a reader does not import) is
    shown by what it holds: its votes, else its scores."""
    cls = REDUCERS.get(reduction.reducer)
    if cls is not None:
        return reducer_traits(cls).summary(reduction)
    if reduction.votes:
        return vote_summary(reduction)
    return score_summary(reduction) if reduction.scores else None


def _answer(answer: object) -> str:
    """An answer in a line: a call or a JSON value as a person reads it (`describe_answer`:
    `get_weather(city="Paris")`), any other quoted (its spaces and quotes seen)."""
    if isinstance(answer, str):
        shown = describe_answer(answer)
        if shown != answer:
            return shown
    return repr(answer)


def _gist(event: AnyEvent) -> str:
    d: Any = event.data  # the payload of the event type matched below
    match event.type:
        case "run.started":
            asked = "".join(
                f", {label} {value}"
                for label, value in (("model", d.model), ("caller", d.caller), ("request", d.request_id))
                if value is not None
            )
            return f"{d.coordinator} on {d.backend}{asked}: {d.question!r}"
        case "run.resumed":
            return f"after #{d.resumed_after_sequence}, {len(d.in_flight)} in flight" + (
                f", cut {d.torn_tail_bytes} torn bytes" if d.torn_tail_bytes else ""
            )
        case "run.interrupted":
            return f"by {d.reason}, {len(d.in_flight)} lanes cut off; resume continues it"
        case "wave.started":
            return (
                f"{d.purpose} k={d.k}/{d.k_requested} reserve {d.reservation.tokens} tok "
                f"${d.reservation.cost_usd:.6f}"
            )
        case "lane.dispatched":
            return f"max_tokens={d.max_tokens} request={d.request}"
        case "lane.completed":
            said = f"answer={_answer(d.answer)}" if d.answer_error is None else f"no answer: {d.answer_error}"
            return f"{said} out={d.usage.output_tokens} tok ${d.cost_usd:.6f} {d.finish_reason}"
        case "lane.failed":
            return f"{d.error}: {d.message}{' (final)' if d.final else ' (will retry)'}"
        case "lane.interrupted":
            return f"{d.reason}: charged its hold, dispatched again on resume"
        case "wave.barrier":
            return f"completed={len(d.completed)} failed={len(d.failed)}"
        case "judge.completed":
            return f"candidate {d.candidate_lane} score={d.score} by {d.judge}"
        case "reduce.completed":
            shown = (
                tally(d.votes)
                if d.votes
                else scores_line(d.scores)
                if d.scores
                else result_line(Reduction(d.reducer, None, None)) or "no votes"
            )
            number = f"#{d.reduction} " if d.reduction != 1 else ""
            return (
                f"{number}{d.reducer} winner={_answer(d.winner)} lane={d.winner_lane} "
                f"{shown} tie_break={d.tie_break}"
            )
        case "reduce.started":
            waves = ", ".join(map(str, d.candidate_waves))
            return f"reduction #{d.reduction} by {d.reducer} of wave(s) {waves}"
        case "run.completed":
            r = d.result
            return (
                f"{r.get('status', 'answered')} answer={_answer(r.get('answer'))} "
                f"cost=${r.get('cost', {}).get('total', 0):.6f}"
            )
        case "run.failed":
            return f"{d.error}: {d.message} (exit {d.exit_code})"
        case _:  # a loop's own event, or one this version does not know: its data, shortened
            text = json.dumps(event.model_dump(mode="json", by_alias=True)["data"])
            return text if len(text) <= 160 else text[:159] + "…"


class Progress:
    """Live lanes-landed and spend on a terminal: a hook (`on_event`), so a terminal that
    draws slowly never holds up the run's lanes."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console()
        self._live = Live(console=self._console, transient=True, refresh_per_second=8)
        self.k = self.done = self.failed = 0
        self.cost = 0.0
        self.tokens = 0
        self.phase = "starting"
        self.last = ""  # the latest event the count does not show

    def __enter__(self) -> Progress:
        self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def resume_from(self, state: RunState) -> None:
        """Start from what the log holds: a resumed wave shows the lanes it already landed."""
        if state.waves:
            wave = state.waves[max(state.waves)]
            self.k, self.phase = wave.info.k, wave.info.purpose
            self.done, self.failed = len(wave.completed()), len(wave.failed())
        self.cost, self.tokens = state.spend.cost_usd, state.spend.tokens

    def on_event(self, event: AnyEvent) -> None:
        """Count the event in and redraw the line."""
        match event:  # by the event's class, as a hook is handed it
            case WaveStarted():
                self.k, self.done, self.failed = event.data.k, 0, 0
                self.phase = event.data.purpose
            case LaneCompleted():
                self.done += 1
                self.cost += event.data.cost_usd
                self.tokens += event.data.usage.input_tokens + event.data.usage.output_tokens
            case LaneFailed():
                if event.data.final:  # a retry to come is not a failed lane yet
                    self.failed += 1
            case _ if not isinstance(event, _COUNTED):  # a loop's own event, say: its line, under the count
                self.last = escape(describe(event))
        self._live.update(
            f"[bold]{self.phase}[/] lanes {self.done}/{self.k} landed"
            f"{f', {self.failed} failed' if self.failed else ''} · "
            f"{self.tokens} tokens computed · ${self.cost:.6f}" + (f"\n{self.last}" if self.last else "")
        )

    observe = on_event  # the name it had before it was a hook


# What the count shows (or needs no line of its own): any other event is shown under it.
_COUNTED = (
    WaveStarted,
    LaneDispatched,
    LaneCompleted,
    LaneFailed,
    WaveBarrier,
    RunStarted,
    RunCompleted,
    RunResumed,
)


def summary(result: RunResult, console: Console | None = None) -> None:
    """The answer, the tally and the bill, for a person."""
    console = console or Console()
    # Answers and lane texts are model output: escaped, so `[b]` in one is not markup.
    if result.status == "no_answer":
        console.print(f"[bold]no answer[/]: {escape(result.reason or '')}", soft_wrap=True)
    else:
        console.print(
            f"[bold]answer[/]: {escape(_answer(result.answer))}  (lane "
            f"{result.winner_lane}, {result.reducer}, tie-break {result.tie_break})",
            soft_wrap=True,
        )
    line = result_line(
        Reduction(
            result.reducer or "",
            result.answer,
            result.winner_lane,
            votes=result.votes,
            scores=result.scores,
            agreement=result.agreement,
            margin=result.margin,
        )
    )
    if line is not None:
        console.print(escape(line), soft_wrap=True)
    if result.outcome:  # the loop's own account
        text = json.dumps(result.outcome)
        console.print(
            f"outcome: {escape(text if len(text) <= 200 else text[:199] + '…')}",
            soft_wrap=True,
            highlight=False,
        )
    ran = result.lanes_completed + result.lanes_failed
    console.print(
        f"lanes: {result.lanes_completed} completed, {result.lanes_failed} failed"
        f" · {result.lanes_answered} of {ran} lanes answered"
        f"{f', resumed {result.resumes}x' if result.resumes else ''}"
        f" · {result.elapsed_s:.2f} s"
    )
    bill = Table(title="bill", show_edge=False)
    for column in ("line", "tokens", "USD"):
        bill.add_column(column, justify="right" if column != "line" else "left")
    u, c = result.usage, result.cost
    bill.add_row("prefill", str(u.prefill_tokens), f"{c.prefill:.6f}")
    bill.add_row("cached prefill", str(u.cached_prefill_tokens), f"{c.cached_prefill:.6f}")
    bill.add_row("decode", str(u.decode_tokens), f"{c.decode:.6f}")
    bill.add_row("kv residency", f"{u.kv_token_seconds:.1f} tok·s", f"{c.kv_residency:.6f}")
    bill.add_row("verifier", str(u.verifier_tokens), f"{c.verifier:.6f}")
    if u.cut_off_tokens or c.cut_off:
        bill.add_row("cut off (holds charged)", str(u.cut_off_tokens), f"{c.cut_off:.6f}")
    bill.add_row("[bold]total[/]", "", f"[bold]{c.total:.6f}[/]")
    console.print(bill)
    # One line whatever the terminal's width: a path is copied, not read.
    console.print(
        f"run {result.run_id}" + (f" · log {result.events}" if result.events else ""),
        soft_wrap=True,
        highlight=False,
        markup=False,
    )
