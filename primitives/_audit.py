"""The audit of a folded run: every claim its log makes that only its config and loop can check.

`audit_run` is what every reader runs after the fold (`lanefold.read_run`, and so `show`,
`tail`, `resume`, `reduce`, the view and the gateway): the run's own reduce run again over the
lanes its loop declares it read (`candidates`), each re-reduction run again over the waves its
`reduce.started` names, where their reducers declare `replays` (`primitives/_replay.py`), and
the loop's own `audit` of what only it knows. The first wrong line of any of them is the
finding. A reduce is run again with the quorum it records (`detail["quorum"]`, which a vote
keeps only above one; none: one, as every vote was before a quorum counted answers), and that
quorum must be one or the loop's own (`ReduceOptions.quorum`, its `min_quorum`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pydantic import BaseModel

from lanefold.primitives._answers import ExtractSpec, read_answer
from lanefold.primitives._declared import AuditFinding, loop_reducer, reducer_traits
from lanefold.primitives._errors import ConfigError
from lanefold.primitives._logging import get_logger
from lanefold.primitives._loop import Lane, ReduceOptions
from lanefold.primitives._registry import resolve_reducer
from lanefold.primitives._replay import ReplaySettings, replay_reduction
from lanefold.primitives._state import RunState
from lanefold.primitives._tools import parse_tools

__all__ = ("audit_run", "reduced_lanes", "reread_lanes", "run_extract")

_log = get_logger("lanefold.audit")


def reduced_lanes(loop: type[Any], params: BaseModel, state: RunState) -> list[Lane] | None:
    """The lanes the loop's own reduce read, from the log, where it declares them (its
    `candidates`: in the order it gave them to the reducer); None where it does not say."""
    declared = getattr(loop, "candidates", None)
    if declared is None:
        return None
    lanes: list[Lane] | None = declared(params, state)
    return lanes


def reread_lanes(state: RunState, waves: Sequence[int], extract: ExtractSpec | None) -> list[Lane]:
    """Every lane of `waves` as a re-reduction reads them: wave by wave, lane by lane, each
    completed lane's answer (and why there is none) read again with `extract` where one is
    given, bound to the run's tools (`run_extract`)."""
    lanes = [
        Lane.of(n, lane)
        for n in waves
        if n in state.waves
        for _, lane in sorted(state.waves[n].lanes.items())
    ]
    if extract is None:
        return lanes
    bound = run_extract(extract, state)
    return [_reread(lane, bound) if lane.completed else lane for lane in lanes]


def _reread(lane: Lane, extract: ExtractSpec) -> Lane:
    read = read_answer(lane.text or "", extract)
    return replace(lane, answer=read.answer, answer_error=read.reason)


def run_extract(extract: ExtractSpec, state: RunState) -> ExtractSpec:
    """`extract` bound to the tools the run's `run.started` records (and its `tool_choice`):
    the one rule every reader of a log reads a `tool_call` answer by, as its lanes were read."""
    started = state.started
    if started is None or not started.tools:
        return extract
    return extract.with_tools(parse_tools(started.tools, where="run.started's tools"), started.tool_choice)


def _judged(state: RunState, reduction: int, settings: ReplaySettings, wants: bool) -> ReplaySettings:
    """`settings`, saying a verifier judged where the config names one, the reducer needs
    one, or the log holds a verdict by one in this reduction (a Session's or `reduce
    --verifier`'s own verifier is in no config)."""
    judged = (
        settings.verifier
        or wants
        or any(v.judge != "llm" for key, v in state.verdicts.items() if key[0] == reduction)
    )
    return replace(settings, verifier=judged)


def _held_to(state: RunState, reduction: int, options: ReduceOptions) -> ReduceOptions | AuditFinding:
    """`options` with the quorum reduction `reduction` was held to, as it records it (see the
    module); the finding on its line where that is neither one nor the loop's."""
    recorded, line = state.reductions.get(reduction), state.reduction_sequences.get(reduction)
    if recorded is None or line is None:
        return options
    quorum = recorded.detail.get("quorum", 1)
    if type(quorum) is not int or quorum not in (1, options.quorum):
        return line, f"reduce.completed's quorum {quorum!r} is not the loop's ({options.quorum})"
    return replace(options, quorum=quorum)


def _replayed(
    state: RunState,
    reducer: type[Any],
    options: ReduceOptions,
    lanes: Sequence[Lane],
    settings: ReplaySettings,
    reduction: int,
) -> AuditFinding | None:
    """Reduction `reduction` run again by `reducer` over `lanes`, held to its recorded quorum."""
    held = _held_to(state, reduction, options)
    if isinstance(held, tuple):
        return held
    judged = _judged(state, reduction, settings, reducer_traits(reducer).wants_verifier(held.weighting))
    return replay_reduction(state, reducer(held), lanes, judged, reduction=reduction)


def _rereductions(state: RunState, options: ReduceOptions, settings: ReplaySettings) -> list[AuditFinding]:
    """Each finished re-reduction (`orchestrator reduce`) by a reducer that replays, run
    again over the lanes its `reduce.started` names, read with the extractor it names."""
    found: list[AuditFinding] = []
    for number, opened in sorted(state.reductions_started.items()):
        line = state.reduction_sequences.get(number)
        if line is None:
            continue  # under way (cut by a crash): nothing claimed yet
        try:
            reducer = resolve_reducer(opened.reducer)
            extract = ExtractSpec.model_validate(opened.extract) if opened.extract is not None else None
        except ConfigError:  # a `module:Class` this reader cannot import: not re-run here
            _log.debug("reduction_not_replayed", reduction=number, reducer=opened.reducer)
            continue
        except ValueError as exc:  # pydantic's ValidationError
            found.append((line, f"reduction {number}'s extractor is none lanefold reads ({exc})"))
            continue
        if reducer_traits(reducer).replays:
            lanes = reread_lanes(state, opened.candidate_waves, extract)
            read = replace(settings, extract=run_extract(extract, state)) if extract is not None else settings
            replayed = _replayed(state, reducer, options, lanes, read, number)
            found += [replayed] if replayed is not None else []
    return found


def audit_run(
    loop: type[Any], params: BaseModel, state: RunState, settings: ReplaySettings
) -> AuditFinding | None:
    """The first claim of a folded run's log that does not follow from it, (line, what is
    wrong), of three kinds: its own reduce re-run (`replay_reduction`, held to its recorded
    quorum), where its reducer `replays` and the loop declares its `candidates`; each
    re-reduction re-run the same way, over the waves its `reduce.started` names; and the loop's
    own `audit(params, state, *, extract, seed)`, where it declares one. None where every
    claim follows."""
    found: list[AuditFinding] = []
    settings = replace(settings, extract=run_extract(settings.extract, state))
    choice = loop_reducer(loop, params)
    options = replace(choice.options if choice is not None else ReduceOptions(), seed=settings.seed)
    if choice is not None and choice.name:
        reducer = resolve_reducer(choice.name)
        lanes = reduced_lanes(loop, params, state) if reducer_traits(reducer).replays else None
        if lanes is not None:
            replayed = _replayed(state, reducer, options, lanes, settings, 1)
            found += [replayed] if replayed is not None else []
    found += _rereductions(state, options, settings)
    declared = getattr(loop, "audit", None)
    if declared is not None:
        own: AuditFinding | None = declared(params, state, extract=settings.extract, seed=settings.seed)
        found += [own] if own is not None else []
    return min(found, key=lambda finding: finding[0], default=None)
