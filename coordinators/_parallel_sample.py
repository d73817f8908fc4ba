"""parallel-sample: SAMPLE one governed wave of K lanes -> barrier -> REDUCE.

The reducer is a majority vote over extracted answers (self-consistency) or an argmax over
judge scores (best-of-N), where the judge is a second governed wave through the same dispatch
path and budget, priced as verifier, or a Python verifier that scores without an LLM.
Every step reads its inputs from the run state, so a resumed run picks up where the log ends.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from primitives import (
    Ballot,
    ConfigError,
    ExtractSpec,
    JudgeResult,
    Sample,
    SamplingParams,
    VoteResult,
    extract_answer,
    judge_argmax,
    normalize_answer,
    parse_score,
    render_judge_prompt,
    render_prompt,
    vote_fold,
)
from primitives._dispatch import Dispatcher, LaneJob, WaveSpec
from primitives._events import (
    JudgeCompleted,
    JudgeCompletedData,
    ReduceCompleted,
    ReduceCompletedData,
)
from primitives._state import LaneState, WaveState

__all__ = ("LoopOutcome", "ParallelSample", "Verifier")

TieBreak = Literal["first_lane", "lexicographic", "random"]
Weighting = Literal["none", "mean_logprob"]
_ANY_NUMBER = ExtractSpec()
_JUDGE_PARAMS = SamplingParams(temperature=0.0, max_tokens=64)

SAMPLE_WAVE = 1
JUDGE_WAVE = 2

# (question, candidate text, extracted answer) -> score; sync or async.
Verifier = Callable[[str, str, str | None], float | Awaitable[float | None] | None]


@dataclass(frozen=True, slots=True)
class LoopOutcome:
    """What a loop decided; the runner adds the bill and the run's identity.

    `status` is "answered" or "no_answer" (no lane gave an extractable answer, or no candidate
    got a score), with `reason` saying why. `agreement` is the winner's share of the answered
    lanes; `margin` the winner's lead over the runner-up (in votes, an unopposed answer leading
    by its own; or in judge score, None when no other candidate was scored).
    """

    answer: str | None
    winner_lane: int | None
    reducer: str
    votes: dict[str, float]
    scores: dict[int, float | None]
    tie_break: str
    lanes_completed: int
    lanes_failed: int
    texts: dict[int, str] = field(default_factory=dict)
    status: Literal["answered", "no_answer"] = "answered"
    reason: str | None = None
    winner_text: str | None = None
    agreement: float | None = None
    margin: float | None = None


@dataclass(frozen=True, slots=True)
class ParallelSample:
    """The parallel-sample loop, configured. `run` drives it through a Dispatcher."""

    k: int
    template: str
    params: SamplingParams
    extract: ExtractSpec = _ANY_NUMBER
    reducer: Literal["majority_vote", "judge_argmax"] = "majority_vote"
    min_quorum: int = 1
    tie_break: TieBreak = "first_lane"
    weighting: Weighting = "none"
    seed: int = 0
    judge_template: str | None = None
    judge_params: SamplingParams = _JUDGE_PARAMS
    verifier: Verifier | None = None
    verifier_name: str | None = None

    name = "parallel_sample"

    def __post_init__(self) -> None:
        if self.reducer == "judge_argmax" and self.verifier is None and not self.judge_template:
            raise ConfigError("judge.template: judge_argmax needs a judge template or a verifier")
        if self.min_quorum > self.k:
            raise ConfigError(f"loop.min_quorum: {self.min_quorum} is more than k = {self.k}")

    async def run(self, dispatcher: Dispatcher, question: str,
                  judge: Dispatcher | None = None) -> LoopOutcome:
        """SAMPLE -> barrier -> REDUCE, resuming from whatever the run state already holds."""
        prompt = render_prompt(self.template, question=question)
        wave = await dispatcher.run_wave(WaveSpec(
            SAMPLE_WAVE, "sample", tuple(LaneJob(i, prompt) for i in range(self.k)), self.params,
            min_quorum=self.min_quorum, share_prefix=True, annotate=self._extract))
        if self.reducer == "majority_vote":
            return self._vote(dispatcher, wave)
        return await self._judge(judge or dispatcher, question, wave)

    def _extract(self, sample: Sample) -> str | None:
        return extract_answer(sample.text, self.extract)

    # -- majority vote ----------------------------------------------------------------------------

    def _vote(self, dispatcher: Dispatcher, wave: WaveState) -> LoopOutcome:
        result = vote(wave, tie_break=self.tie_break, weighting=self.weighting, seed=self.seed)
        data = ReduceCompletedData(
            reducer="majority_vote", winner=result.winner, winner_lane=result.winner_lane,
            votes=dict(result.votes), tie_break=result.tie_break, tied=list(result.tied),
            abstentions=result.abstentions)
        self._record_reduce(dispatcher, data)
        return self._outcome(data, wave)

    # -- judge + argmax ---------------------------------------------------------------------------

    async def _judge(self, dispatcher: Dispatcher, question: str, wave: WaveState) -> LoopOutcome:
        state = dispatcher.recorder.state
        candidates = wave.completed()
        if self.verifier is not None:
            for lane in candidates:
                if lane.lane not in state.scores:
                    score, detail = await self._verify(question, lane)
                    self._record_score(dispatcher, lane.lane, score,
                                       self.verifier_name or "verifier", detail)
        else:
            assert self.judge_template is not None
            jobs = tuple(LaneJob(lane.lane, render_judge_prompt(
                self.judge_template, question=question, candidate=lane.text or ""))
                for lane in candidates)
            judged = await dispatcher.run_wave(WaveSpec(
                JUDGE_WAVE, "judge", jobs, self.judge_params, min_quorum=min(1, len(jobs)),
                share_prefix=False))
            for lane in sorted(judged.lanes.values(), key=lambda s: s.lane):
                if lane.lane in state.scores:
                    continue
                if lane.status == "completed":
                    score = parse_score(lane.text or "")
                    self._record_score(dispatcher, lane.lane, score, "llm",
                                       detail="" if score is not None else "no score in output")
                elif lane.final:
                    self._record_score(dispatcher, lane.lane, None, "llm", detail="judge failed")
        judge_wave = state.waves.get(JUDGE_WAVE)
        unmatched = [s.text or "" for s in judge_wave.completed()
                     if parse_score(s.text or "") is None] if judge_wave is not None else []
        scores = {lane: state.scores.get(lane) for lane in sorted(state.scores)}
        result = judge_winner(scores, tie_break=self.tie_break, seed=self.seed)
        winner = None
        if result.winner_lane is not None:
            raw = wave.lanes[result.winner_lane].answer
            winner = normalize_answer(raw) if raw is not None else None
        data = ReduceCompletedData(
            reducer="judge_argmax", winner=winner, winner_lane=result.winner_lane, scores=scores,
            tie_break=result.tie_break, tied=list(result.tied), abstentions=result.abstentions)
        self._record_reduce(dispatcher, data)
        return self._outcome(data, wave, unmatched)

    async def _verify(self, question: str, lane: LaneState) -> tuple[float | None, str]:
        """Call the Python verifier; one that raises or returns a non-number abstains."""
        assert self.verifier is not None
        try:
            score = self.verifier(question, lane.text or "", lane.answer)
            if inspect.isawaitable(score):
                score = await score
        except Exception as exc:  # a user's verifier may fail in any way: record it, go on
            return None, f"verifier raised {type(exc).__name__}: {exc}"
        if score is None:
            return None, "verifier gave no score"
        if isinstance(score, bool) or not isinstance(score, int | float) or math.isnan(score):
            return None, f"verifier returned {score!r}, not a number"
        return float(score), ""

    def _record_score(self, dispatcher: Dispatcher, lane: int, score: float | None, judge: str,
                      detail: str = "") -> None:
        dispatcher.recorder.emit(JudgeCompleted, JudgeCompletedData(
            candidate_lane=lane, score=score, judge=judge, detail=detail),
            wave=JUDGE_WAVE, lane=lane)

    # -- reduce -----------------------------------------------------------------------------------

    def _record_reduce(self, dispatcher: Dispatcher, data: ReduceCompletedData) -> None:
        if dispatcher.recorder.state.reduce is None:
            dispatcher.recorder.emit(ReduceCompleted, data)  # made durable with the run's end

    def _outcome(self, data: ReduceCompletedData, wave: WaveState,
                 unmatched: list[str] | None = None) -> LoopOutcome:
        completed = wave.completed()
        winner = wave.lanes.get(data.winner_lane) if data.winner_lane is not None else None
        agreement = margin = None
        if data.reducer == "majority_vote" and data.winner is not None:
            total = math.fsum(data.votes.values())
            ours = data.votes.get(data.winner, 0.0)
            others = [v for answer, v in data.votes.items() if answer != data.winner]
            agreement = ours / total if total > 0 else None
            margin = ours - max(others, default=0.0)  # an unopposed answer leads by its votes
        elif data.reducer == "judge_argmax" and data.winner_lane is not None:
            answers = [a for a in (normalize_answer(s.answer) for s in completed
                                   if s.answer is not None) if a]
            if data.winner is not None and answers:
                agreement = answers.count(data.winner) / len(answers)
            best = data.scores.get(data.winner_lane)
            others = [v for lane, v in data.scores.items()
                      if v is not None and lane != data.winner_lane]
            if best is not None and others:  # no runner-up, no lead: a score has no zero
                margin = best - max(others)
        answered = data.winner_lane is not None
        if not answered and not unmatched:
            # Lanes with no extractable answer; or, with no judge output to show (a Python
            # verifier), the candidates left unscored.
            unmatched = [s.text or "" for s in completed
                         if (not s.answer if data.reducer == "majority_vote"
                             else data.scores.get(s.lane) is None)]
        return LoopOutcome(
            answer=data.winner, winner_lane=data.winner_lane, reducer=data.reducer,
            votes=dict(data.votes), scores=dict(data.scores), tie_break=data.tie_break,
            lanes_completed=len(completed), lanes_failed=len(wave.failed()),
            texts={lane.lane: lane.text or "" for lane in completed},
            status="answered" if answered else "no_answer",
            reason=None if answered else _why_no_answer(data, len(completed), unmatched or []),
            winner_text=winner.text if winner is not None else None,
            agreement=agreement, margin=margin)


def vote(wave: WaveState, *, tie_break: TieBreak, weighting: Weighting, seed: int) -> VoteResult:
    """The majority vote over a wave's lanes (a lane that did not complete abstains), each
    weighted by exp(mean token logprob) under `mean_logprob`."""
    ballots = [Ballot(s.lane, s.answer if s.status == "completed" else None,
                      math.exp(s.logprob_mean) if weighting == "mean_logprob"
                      and s.logprob_mean is not None else 1.0)
               for _, s in sorted(wave.lanes.items())]
    return vote_fold(ballots, tie_break=tie_break, seed=seed)


def judge_winner(scores: dict[int, float | None], *, tie_break: TieBreak,
                 seed: int) -> JudgeResult:
    """The judges' argmax; ties go to the first lane unless the tie-break is random."""
    return judge_argmax(scores, tie_break="random" if tie_break == "random" else "first_lane",
                        seed=seed)


def _why_no_answer(data: ReduceCompletedData, completed: int, unmatched: list[str]) -> str:
    """How many lanes abstained, and a shortened example of what did not match."""
    example = f"; e.g. {_shorten(unmatched[0])!r}" if unmatched else ""
    if data.reducer == "judge_argmax":
        return (f"no candidate got a score ({data.abstentions} of {len(data.scores)} judged "
                f"candidates abstained){example}")
    return f"{data.abstentions} of {completed} completed lanes gave no answer{example}"


def _shorten(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
