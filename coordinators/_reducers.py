"""The reducers: majority_vote, weighted_vote, judge_argmax, usc, any_pass (field_vote has its
own module).

Each turns a wave's lanes into one answer. The pure parts (vote fold, score parsing, argmax)
live in primitives; a reducer that needs a model (the LLM judge, usc) asks for it through
`ctx.wave`, so its calls are governed, priced on the verifier line and resumable, and a
verifier's verdicts go through `ctx.verify`, recorded as `judge.completed`. So each is a
function of what the log holds and declares `replays`: reading a run's log re-runs its reduce
there (the facade's `audit_run`) and refuses a `reduce.completed` it does not give.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from lanefold.primitives import (
    TEMPLATE_TOKENS,
    Ballot,
    ConfigError,
    JudgeCall,
    Lane,
    LaneJob,
    LoopContext,
    ReduceOptions,
    Reduction,
    Verdict,
    VoteResult,
    compile_score_regex,
    describe_answer,
    judge_argmax,
    normalize_answer,
    parse_score,
    register_reducer,
    render_judge_prompt,
    score_summary,
    vote_fold,
    vote_summary,
)

__all__ = ("AnyPass", "JudgeArgmax", "MajorityVote", "UniversalSelfConsistency", "WeightedVote", "vote")

USC_TEMPLATE = (
    "I have generated the following responses to the question: {question}\n\n{candidates}\n"
    "Evaluate these responses. Select the most consistent response based on majority "
    'consensus. Start your answer with "The most consistent response is Response X" '
    "(without quotes).\n"
)
JUDGE_TEMPLATE = (
    "Question: {question}\n\nCandidate answer:\n{candidate}\n\nIs the candidate answer "
    "correct? Reply with one line 'Score: N/10', where 10 is surely correct.\n"
)
VERIFIER_KEYS = frozenset({"verifier", "verifier_command", "verifier_timeout_s"})
_USC_CHOICE = re.compile(r"response\s*#?\s*(\d+)", re.IGNORECASE)


def vote(
    lanes: Sequence[Lane],
    *,
    tie_break: str,
    seed: int,
    weights: Mapping[int, float] | None = None,
    quorum: int = 1,
) -> VoteResult:
    """The vote over lanes: a lane that did not complete, or gave no answer, abstains;
    `weights` by lane. Fewer than `quorum` ballots name no winner (the tally stands).

    Lanes of one wave vote by lane number; lanes of several waves (a debate's rounds, say)
    by their position in `lanes`, so `winner_lane` is then a position (see `_voted`).
    """
    ballots = [
        Ballot(key, lane.answer if lane.completed else None, (weights or {}).get(key, 1.0))
        for key, lane in sorted(_ballot_keys(lanes).items())
    ]
    result = vote_fold(ballots, tie_break=tie_break, seed=seed)  # type: ignore[arg-type]
    if result.winner is not None and sum(result.counts.values()) < quorum:
        return VoteResult(None, None, result.votes, result.counts, "none", (), result.abstentions)
    return result


def _ballot_keys(lanes: Sequence[Lane]) -> dict[int, Lane]:
    if _one_wave(lanes) is not None or not lanes:
        return {lane.lane: lane for lane in lanes}
    return dict(enumerate(lanes))


def logprob_weights(lanes: Sequence[Lane]) -> dict[int, float]:
    """exp(mean token logprob) per lane that has logprobs (the others weigh 1), keyed as
    `vote` keys ballots."""
    return {
        key: math.exp(lane.logprob_mean)
        for key, lane in _ballot_keys(lanes).items()
        if lane.logprob_mean is not None
    }


def _one_wave(lanes: Sequence[Lane]) -> int | None:
    waves = {lane.wave for lane in lanes}
    return waves.pop() if len(waves) == 1 else None


def _shorten(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _example(texts: Sequence[str]) -> str:
    return f"; e.g. {_shorten(texts[0])!r}" if texts else ""


def _voted(
    name: str, lanes: Sequence[Lane], result: VoteResult, *, weighted: bool, quorum: int = 1
) -> Reduction:
    """A vote as a Reduction: its `votes` are ballot counts (integers) where every ballot
    counted one, else total weights; agreement and margin are in the vote's own terms, among
    the lanes that gave an answer. A quorum above one is kept in `detail` (an audit of the
    log votes again with it)."""
    completed = [lane for lane in lanes if lane.completed]
    winner = _ballot_keys(lanes).get(result.winner_lane) if result.winner_lane is not None else None
    agreement = margin = None
    reason = None
    ballots = sum(result.counts.values())
    if result.winner is not None:
        total = math.fsum(result.votes.values())
        ours = result.votes.get(result.winner, 0.0)
        others = [v for answer, v in result.votes.items() if answer != result.winner]
        agreement = ours / total if total > 0 else None
        margin = ours - max(others, default=0.0)  # an unopposed answer leads by its votes
    elif ballots:  # answers, but fewer than the quorum asks for
        reason = f"{ballots} of {len(lanes)} lanes answered, below the quorum of {quorum}"
    else:
        unmatched = [lane.text or "" for lane in completed if not lane.answer]
        said = next((lane for lane in completed if not lane.answer and lane.answer_error), None)
        example = f"; e.g. lane {said.lane}: {said.answer_error}" if said else _example(unmatched)
        reason = f"{result.abstentions} of {len(completed)} completed lanes gave no answer{example}"
    return Reduction(
        reducer=name,
        winner=result.winner,
        winner_lane=winner.lane if winner is not None else None,
        votes=dict(result.votes) if weighted else dict(result.counts),
        tie_break=result.tie_break,
        tied=tuple(result.tied),
        abstentions=result.abstentions,
        agreement=agreement,
        margin=margin,
        reason=reason,
        detail={"quorum": quorum} if quorum > 1 else {},
        wave=_one_wave(lanes),
        winner_wave=winner.wave if winner is not None else None,
    )


@register_reducer
class MajorityVote:
    """Self-consistency: the most agreed normalised answer wins (optionally logprob-weighted)."""

    name: ClassVar[str] = "majority_vote"
    needs_judge: ClassVar[bool] = False
    judge_keys: ClassVar[frozenset[str]] = frozenset()  # the [judge] keys it reads
    uses_model: ClassVar[bool] = False  # never samples (a re-reduction builds no backend)
    replays: ClassVar[bool] = True  # a function of the log: reading it re-runs the reduce
    needs_verifier: ClassVar[bool] = False
    summary = staticmethod(vote_summary)

    def __init__(self, options: ReduceOptions | None = None) -> None:
        self.options = options or ReduceOptions()

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        o = self.options
        weights = logprob_weights(lanes) if o.weighting == "mean_logprob" else None
        result = vote(lanes, tie_break=o.tie_break, seed=o.seed, weights=weights, quorum=o.quorum)
        return _voted(self.name, lanes, result, weighted=weights is not None, quorum=o.quorum)


@register_reducer
class WeightedVote:
    """A vote where each lane weighs its mean token probability (`weighting = "mean_logprob"`,
    the default) or its verifier score (`weighting = "verifier"`, scores below 0 count 0)."""

    name: ClassVar[str] = "weighted_vote"
    needs_judge: ClassVar[bool] = False
    judge_keys: ClassVar[frozenset[str]] = VERIFIER_KEYS
    uses_model: ClassVar[bool] = False
    replays: ClassVar[bool] = True
    needs_verifier: ClassVar[bool] = False
    verifier_weighting: ClassVar[bool] = True  # `weighting = "verifier"` needs a verifier
    summary = staticmethod(vote_summary)

    def __init__(self, options: ReduceOptions | None = None) -> None:
        self.options = options or ReduceOptions()

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        by = self.options.weighting if self.options.weighting != "none" else "mean_logprob"
        scores: dict[int, float | None] = {}
        if by == "verifier":
            verdicts = await ctx.verify(lanes)
            scores = {lane: v.score for lane, v in verdicts.items()}
            # A lane the verifier gave nothing (or less than nothing) does not vote.
            weights = {lane.lane: max(scores.get(lane.lane) or 0.0, 0.0) for lane in lanes}
            lanes = [lane if weights[lane.lane] > 0 else _abstaining(lane) for lane in lanes]
        else:
            weights = logprob_weights(lanes)
        o = self.options
        result = vote(lanes, tie_break=o.tie_break, seed=o.seed, weights=weights, quorum=o.quorum)
        reduction = _voted(self.name, lanes, result, weighted=True, quorum=o.quorum)
        detail = {**reduction.detail, "weighting": by}
        return Reduction(**{**_fields(reduction), "scores": scores, "detail": detail})


def _abstaining(lane: Lane) -> Lane:
    return Lane(
        lane.wave,
        lane.lane,
        lane.status,
        lane.text,
        None,
        lane.logprob_mean,
        lane.finish_reason,
        lane.error,
        lane.prompt,
    )


def _fields(reduction: Reduction) -> dict[str, Any]:
    return {name: getattr(reduction, name) for name in reduction.__dataclass_fields__}


@register_reducer
class JudgeArgmax:
    """Best-of-N: each candidate is scored (an LLM judge wave, or the verifier) and the best
    score wins; ties by `tie_break` (first_lane, lexicographic on the answer, random)."""

    name: ClassVar[str] = "judge_argmax"
    needs_judge: ClassVar[bool] = True
    needs_verifier: ClassVar[bool] = False  # a verifier or an LLM judge ([judge] template)
    uses_model: ClassVar[bool] = True  # the LLM judge, where no verifier is configured
    replays: ClassVar[bool] = True
    summary = staticmethod(score_summary)

    @staticmethod
    def judge_tokens(call: JudgeCall) -> tuple[int, int]:
        """An LLM judge call per candidate, each quoting it; none where a verifier judges."""
        if not call.template or call.verifier:
            return 0, 0
        return (
            call.candidates * (call.prompt_tokens + TEMPLATE_TOKENS + call.answer_tokens),
            call.candidates * call.max_tokens,
        )

    def __init__(self, options: ReduceOptions | None = None) -> None:
        self.options = options or ReduceOptions()

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        # A call or JSON value that is not valid (no answer) cannot win: only valid ones are judged.
        structured = ctx.extract.structured
        candidates = [lane for lane in lanes if lane.completed and (lane.answer or not structured)]
        keys = _candidate_keys(candidates)
        unmatched: list[str] = []
        if ctx.verifier is not None:
            verdicts = await ctx.verify(candidates)
            scores = {
                keys[id(lane)]: verdicts[lane.lane].score for lane in candidates if lane.lane in verdicts
            }
        else:
            scores, unmatched = await _llm_judge(ctx, candidates, keys)
        answers = {
            keys[id(lane)]: (normalize_answer(lane.answer) if lane.answer else None) for lane in candidates
        }
        tie_break = self.options.tie_break
        result = judge_argmax(
            scores,
            tie_break=tie_break,  # type: ignore[arg-type]
            seed=self.options.seed,
            answers=answers,
        )
        by_key = {keys[id(lane)]: lane for lane in candidates}
        winner_lane = by_key[result.winner_lane] if result.winner_lane is not None else None
        winner = (
            normalize_answer(winner_lane.answer)
            if winner_lane is not None and winner_lane.answer is not None
            else None
        )
        agreement = margin = None
        reason = None
        if winner_lane is not None:
            given = [a for a in answers.values() if a]
            if winner is not None and given:
                agreement = given.count(winner) / len(given)
            best = scores.get(result.winner_lane)  # type: ignore[arg-type]
            others = [v for key, v in scores.items() if v is not None and key != result.winner_lane]
            if best is not None and others:  # no runner-up, no lead: a score has no zero
                margin = best - max(others)
        else:
            example = unmatched or [
                lane.text or "" for lane in candidates if scores.get(keys[id(lane)]) is None
            ]
            reason = (
                f"no candidate got a score ({result.abstentions} of {len(scores)} judged "
                f"candidates abstained){_example(example)}"
            )
        return Reduction(
            reducer=self.name,
            winner=winner,
            winner_lane=winner_lane.lane if winner_lane is not None else None,
            winner_wave=winner_lane.wave if winner_lane is not None else None,
            scores=scores,
            tie_break=result.tie_break,
            tied=tuple(result.tied),
            abstentions=result.abstentions,
            agreement=agreement,
            margin=margin,
            reason=reason,
            wave=_one_wave(lanes),
        )


def _candidate_keys(candidates: Sequence[Lane]) -> dict[int, int]:
    """Each candidate's key (by its identity), as `vote` keys ballots: the lane number when
    they come from one wave, else the position."""
    return {id(lane): key for key, lane in _ballot_keys(candidates).items()}


async def _llm_judge(
    ctx: LoopContext, candidates: Sequence[Lane], keys: Mapping[int, int]
) -> tuple[dict[int, float | None], list[str]]:
    """One judge request per candidate, through the governed path; outputs without a score
    abstain. Returns the scores and the judge outputs that held none."""
    # A run's config names its judge; a re-reduction of a run that had none uses this one.
    template = ctx.judge.template or JUDGE_TEMPLATE
    pattern = compile_score_regex(ctx.judge.score_regex) if ctx.judge.score_regex else None
    jobs = [
        LaneJob(
            keys[id(lane)],
            render_judge_prompt(template, question=ctx.question, candidate=_candidate(ctx, lane)),
        )
        for lane in candidates
    ]
    judged = await ctx.wave(
        jobs,
        params=ctx.judge.params,
        purpose="judge",
        quorum=min(1, len(jobs)),
        share_prefix=False,
        extract=False,
        backend="judge",
    )
    by_key = {keys[id(lane)]: lane for lane in candidates}
    scores: dict[int, float | None] = {}
    unmatched: list[str] = []
    for out in sorted(judged, key=lambda s: s.lane):
        if out.completed:
            score = parse_score(out.text or "", pattern=pattern)
            if score is None:
                unmatched.append(out.text or "")
            detail = "" if score is not None else "no score in output"
        elif out.status == "failed":
            score, detail = None, "judge failed"
        else:
            continue
        scores[out.lane] = score
        ctx.record_verdict(by_key[out.lane], score, "llm", detail=detail, wave=out.wave)
    return scores, unmatched


def _candidate(ctx: LoopContext, lane: Lane) -> str:
    """What the judge is shown of a candidate: its text, or its call or JSON value as a person
    reads it (`describe_answer`: `get_weather(city="Paris")`) where answers are structured."""
    if ctx.extract.structured and lane.answer is not None:
        return describe_answer(lane.answer)
    return lane.text or ""


@register_reducer
class UniversalSelfConsistency:
    """Universal self-consistency (Chen et al. 2023): one more governed call shows the model
    every candidate and asks which is the most consistent; that one wins. Works where answers
    cannot be extracted and compared (free text). Falls back to the vote, and says so, when
    the choice cannot be read."""

    name: ClassVar[str] = "usc"
    needs_judge: ClassVar[bool] = False
    needs_verifier: ClassVar[bool] = False
    uses_model: ClassVar[bool] = True
    replays: ClassVar[bool] = True
    summary = staticmethod(vote_summary)

    @staticmethod
    def judge_tokens(call: JudgeCall) -> tuple[int, int]:
        """One call that quotes every candidate."""
        return (call.prompt_tokens + TEMPLATE_TOKENS + call.candidates * call.answer_tokens, call.max_tokens)

    judge_keys: ClassVar[frozenset[str]] = frozenset(
        {"backend", "temperature", "max_tokens", "stop", "usc_template"}
    )

    def __init__(self, options: ReduceOptions | None = None) -> None:
        self.options = options or ReduceOptions()

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        candidates = [lane for lane in lanes if lane.completed]
        o = self.options
        fallback = _voted(
            self.name,
            lanes,
            vote(lanes, tie_break=o.tie_break, seed=o.seed, quorum=o.quorum),
            weighted=False,
            quorum=o.quorum,
        )
        if len(candidates) < 2:  # nothing to choose between
            return fallback
        listing = "\n".join(f"Response {i}:\n{lane.text or ''}\n" for i, lane in enumerate(candidates))
        template = ctx.judge.usc_template or USC_TEMPLATE
        prompt = template.replace("{question}", ctx.question).replace("{candidates}", listing)
        (out,) = await ctx.wave(
            [prompt],
            params=ctx.judge.params,
            purpose="usc",
            bill="verifier",
            quorum=1,
            share_prefix=False,
            extract=False,
            backend="judge",
        )
        match = _USC_CHOICE.search(out.text or "")
        choice = int(match.group(1)) if match else None
        if choice is None or not 0 <= choice < len(candidates):
            # The vote's quorum stays in the detail: a reader votes again with it.
            detail = {**fallback.detail, "fallback": "majority_vote", "output": _shorten(out.text or "", 200)}
            return Reduction(**{**_fields(fallback), "detail": detail})
        chosen = candidates[choice]
        winner = normalize_answer(chosen.answer) if chosen.answer else None
        given = [normalize_answer(lane.answer) for lane in candidates if lane.answer]
        agreement = given.count(winner) / len(given) if winner and given else None
        return Reduction(
            reducer=self.name,
            winner=winner,
            winner_lane=chosen.lane,
            votes=fallback.votes,
            tie_break="none",
            abstentions=fallback.abstentions,
            agreement=agreement,
            reason=None if winner else "the chosen response has no extractable answer",
            detail={"selected": choice, "selected_lane": chosen.lane},
            wave=_one_wave(lanes),
            winner_wave=chosen.wave,
        )


@register_reducer
class AnyPass:
    """The first lane (lowest index) the verifier accepts: for tasks with an oracle, such as
    unit tests. No lane passing is no answer."""

    name: ClassVar[str] = "any_pass"
    needs_judge: ClassVar[bool] = True
    needs_verifier: ClassVar[bool] = True
    judge_keys: ClassVar[frozenset[str]] = VERIFIER_KEYS
    uses_model: ClassVar[bool] = False
    replays: ClassVar[bool] = True
    summary = staticmethod(score_summary)

    def __init__(self, options: ReduceOptions | None = None) -> None:
        self.options = options or ReduceOptions()

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        if ctx.verifier is None:
            raise ConfigError(
                "judge.verifier: any_pass needs a verifier (judge.verifier or judge.verifier_command)"
            )
        verdicts: dict[int, Verdict] = await ctx.verify(lanes)
        passing = [
            lane
            for lane in sorted(lanes, key=lambda s: s.lane)
            if lane.lane in verdicts and verdicts[lane.lane].passed
        ]
        scores = {lane: v.score for lane, v in verdicts.items()}
        judged = len(verdicts)
        if not passing:
            return Reduction(
                reducer=self.name,
                winner=None,
                winner_lane=None,
                scores=scores,
                abstentions=sum(1 for v in verdicts.values() if v.passed is None or v.error),
                reason=f"no lane passed the verifier ({judged} judged)",
                wave=_one_wave(lanes),
                detail={"passed": 0, "judged": judged},
            )
        first = passing[0]
        abstained = sum(1 for v in verdicts.values() if v.passed is None or v.error)
        return Reduction(
            reducer=self.name,
            winner=normalize_answer(first.answer) if first.answer else None,
            winner_lane=first.lane,
            winner_wave=first.wave,
            scores=scores,
            tie_break="first_lane",
            abstentions=abstained,
            agreement=len(passing) / judged,
            detail={"passed": len(passing), "judged": judged},
            wave=_one_wave(lanes),
        )
