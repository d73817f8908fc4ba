"""A run's own reduction re-derived from its log: the reducer run again over the lanes it read.

A reducer that declares `replays = True` says its reduce is a function of what the log holds:
the candidates' answers (and logprobs), the verdicts recorded on them (`judge.completed`) and
the waves it ran itself (an LLM judge's, usc's), whose outputs are in the log too. Reading a
log then runs that reducer again, over the lanes the loop declares it reduced (`candidates`),
through a `ReplayContext`: a LoopContext that answers from the log and never samples. Its
`verify` returns the recorded verdicts, its `wave` the recorded wave (asked for with the spec
the log fingerprinted), and its `record_verdict` checks the verdict the reducer derives (a
judge's score parsed from the judge's output) against the recorded one. The replayed winner,
votes, scores, tie break, agreement, margin and detail must be what `reduce.completed`
records; else the first that differs is named on its line, as Temporal names a history the
workflow code no longer gives.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from lanefold.primitives._answers import ExtractSpec
from lanefold.primitives._backend import Backend, SamplingParams
from lanefold.primitives._context import wave_fingerprint
from lanefold.primitives._dispatch import LaneJob
from lanefold.primitives._judge import render_prompt
from lanefold.primitives._logging import get_logger
from lanefold.primitives._loop import JudgeSettings, Lane, Reducer, Reduction
from lanefold.primitives._state import RunState
from lanefold.primitives._verifier import Verdict, Verifier
from lanefold.primitives.events import Bill, bill_of

__all__ = ("ReplayContext", "ReplaySettings", "replay_reduction")

_log = get_logger("lanefold.replay")


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """What a run's config says, beside its loop's params, that re-deriving its record reads:
    the extractor, the run's seed, sampling, `[judge]`, whether it names a verifier, the prompt."""

    extract: ExtractSpec = field(default_factory=ExtractSpec)
    seed: int = 0
    sampling: SamplingParams = field(default_factory=SamplingParams)
    judge: JudgeSettings = field(default_factory=JudgeSettings)
    verifier: bool = False
    template: str = "{question}"


class _Differs(Exception):
    """What the reducer asks of the log is not there, or derives another claim than it holds."""

    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


class _RecordedVerifier:
    """Stands where the configured verifier was: its verdicts are the log's."""

    name = "recorded"

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        raise _Differs(None, "the reducer asks a verifier for a verdict the log does not hold")


class ReplayContext:
    """The LoopContext of the run's own reduction, answered from its log (see the module)."""

    def __init__(
        self, state: RunState, settings: ReplaySettings, *, first_wave: int, line: int, reduction: int = 1
    ) -> None:
        started = state.started
        self.question = started.question if started is not None else ""
        self.seed, self.sampling, self.extract = settings.seed, settings.sampling, settings.extract
        self.judge = settings.judge
        self.verifier: Verifier | None = _RecordedVerifier() if settings.verifier else None
        self.judge_backend: Backend | None = None
        self.reduction = reduction
        self.consulted = False  # whether it read verdicts or waves of its own
        self._state, self._template, self._next, self._line = state, settings.template, first_wave, line

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def budget(self) -> Any:
        raise _Differs(self._line, "the reducer reads the budget, which no log replays")

    def prompt(self, question: str | None = None) -> str:
        return render_prompt(self._template, question=self.question if question is None else question)

    async def wave(
        self,
        prompts: Sequence[str | LaneJob],
        *,
        params: SamplingParams | None = None,
        purpose: str = "sample",
        bill: Bill | None = None,
        quorum: int = 1,
        share_prefix: bool = True,
        extract: ExtractSpec | bool | None = True,
        backend: Literal["main", "judge"] = "main",
    ) -> list[Lane]:
        jobs = tuple(p if isinstance(p, LaneJob) else LaneJob(i, p) for i, p in enumerate(prompts))
        if not jobs:
            return []
        number, self._next = self._next, self._next + 1
        self.consulted = True
        recorded = self._state.waves.get(number)
        if recorded is None:
            raise _Differs(self._line, f"the reducer runs a {purpose} wave ({number}) the log does not hold")
        spec = self.extract if extract is True else None if extract is False else extract
        fingerprint = wave_fingerprint(
            purpose,
            bill or bill_of(purpose),
            jobs,
            params or self.sampling,
            quorum=quorum,
            share_prefix=share_prefix,
            extract=spec,
            backend=backend,
        )
        if recorded.info.purpose != purpose or recorded.info.fingerprint not in (None, fingerprint):
            raise _Differs(
                self._line,
                f"wave {number} ({recorded.info.purpose}) is not the {purpose} wave the reducer "
                f"asks for over these candidates (another spec: other prompts or sampling)",
            )
        return [
            Lane.of(number, recorded.lanes[job.lane], job.prompt)
            for job in jobs
            if job.lane in recorded.lanes
        ]

    async def reduce(self, lanes: Sequence[Lane], reducer: str | Reducer = "", **_: Any) -> Reduction:
        raise _Differs(self._line, "the reducer reduces again, which no log replays")

    async def verify(self, lanes: Sequence[Lane]) -> dict[int, Verdict]:
        """The recorded verdict on each completed lane (lanes of several waves, one lane number
        each, as a chain's attempts are, are answered together)."""
        self.consulted = True
        verdicts: dict[int, Verdict] = {}
        for lane in lanes:
            if not lane.completed:
                continue
            known = self._state.verdicts.get((self.reduction, lane.wave, lane.lane))
            if known is None:
                raise _Differs(
                    self._line,
                    f"reduce.completed ranks lane {lane.lane} of wave {lane.wave}, "
                    "which has no judge.completed",
                )
            verdicts[lane.lane] = Verdict(known.score, known.passed, known.detail, known.error)
        return dict(sorted(verdicts.items()))

    def record(self, noun: str, data: Mapping[str, Any], **_: Any) -> Mapping[str, Any]:
        raise _Differs(self._line, f"the reducer records loop.{noun}, which no log replays")

    def record_verdict(
        self,
        lane: Lane,
        score: float | None,
        judge: str,
        *,
        detail: str = "",
        passed: bool | None = None,
        error: str | None = None,
        wave: int | None = None,
    ) -> None:
        """The verdict the reducer derives (an LLM judge's score, parsed from the judge's
        output in the log) must be the one recorded on that lane."""
        key = (self.reduction, lane.wave, lane.lane)
        known = self._state.verdicts.get(key)
        where = f"lane {lane.lane} of wave {lane.wave}"
        if known is None:
            raise _Differs(self._line, f"the reducer judges {where}, and the log holds no verdict on it")
        derived = {"score": score, "judge": judge, "detail": detail, "passed": passed, "error": error}
        for name, value in derived.items():
            if getattr(known, name) != value:
                raise _Differs(
                    self._state.verdict_sequences.get(key, self._line),
                    f"judge.completed on {where} says {name} {_shown(getattr(known, name))}, "
                    f"the judge's output gives {_shown(value)}",
                )


def _shown(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 120 else text[:119] + "…"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _claims(reduction: Reduction, waves: list[int]) -> dict[str, Any]:
    """A reduction as `reduce.completed` records it (JSON's forms: lists, string keys)."""
    return {
        "reducer": reduction.reducer,
        "winner": reduction.winner,
        "winner_lane": reduction.winner_lane,
        "winner_wave": reduction.winner_wave if len(waves) > 1 else None,
        "votes": dict(reduction.votes),
        "scores": dict(reduction.scores),
        "tie_break": reduction.tie_break,
        "tied": json.loads(json.dumps(list(reduction.tied), default=str)),
        "abstentions": reduction.abstentions,
        "agreement": _finite(reduction.agreement),
        "margin": _finite(reduction.margin),
        "detail": json.loads(json.dumps(dict(reduction.detail), default=str)),
    }


def replay_reduction(
    state: RunState,
    reducer: Reducer,
    candidates: Sequence[Lane],
    settings: ReplaySettings,
    *,
    reduction: int = 1,
) -> tuple[int, str] | None:
    """A `reduce.completed` (the run's own, or re-reduction `reduction`), re-derived by
    `reducer` over `candidates` (the lanes it reduced, from the log): (its line, what
    differs), or None where it follows (or the log holds no such reduce yet)."""
    recorded, line = state.reductions.get(reduction), state.reduction_sequences.get(reduction)
    if recorded is None or line is None:
        return None
    waves = sorted({lane.wave for lane in candidates})
    read = state.reduction_waves.get(reduction, [])
    if reduction == 1 and read != waves:  # a re-reduction's are its reduce.started's, checked
        return line, f"reduce.completed reads waves {read}, the loop reduces waves {waves}"
    opened = state.reductions_started.get(reduction)
    first = opened.first_wave if opened is not None else max(waves, default=0) + 1
    ctx = ReplayContext(state, settings, first_wave=first, line=line, reduction=reduction)
    running = reducer.reduce(ctx, list(candidates))
    try:
        running.send(None)
    except StopIteration as done:
        replayed: Reduction = done.value
    except _Differs as differs:
        return differs.line or line, differs.message
    except Exception as exc:  # a reducer that cannot read this log: its reduce is not the log's
        return line, f"reduce.completed cannot be re-derived from the log ({type(exc).__name__}: {exc})"
    else:  # it awaited something that does not answer at once: it is not a function of the log
        running.close()
        _log.warning("reducer_not_replayed", reducer=recorded.reducer, why="it awaits more than the log")
        return None
    got = _claims(replayed, waves)
    basis = "the lanes' answers" + (" and verdicts" if ctx.consulted else "")
    for name, value in got.items():
        held = getattr(recorded, name)
        if name in ("votes", "scores", "detail"):
            held = dict(held)
        if held != value:
            return (
                line,
                f"reduce.completed does not follow from {basis}: it says {name} = {_shown(held)}, "
                f"{replayed.reducer} over them gives {_shown(value)}",
            )
    return None
