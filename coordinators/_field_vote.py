"""field_vote: a vote field by field over JSON objects and tool calls.

Lanes that agree on most of an answer lose a whole-answer vote to a split: three calls of
`get_weather` with the city right and the unit split 1-1-1 have no majority call, yet a majority
on every argument. So each field is voted on its own, among the lanes whose answer is valid
(the extractor's: a structured lane has an answer exactly where it is valid). For calls the
function's name is voted first and then each argument among the lanes calling the winner.

A field a lane lacks counts as missing; a field goes into the winner when more lanes have it
than lack it. Ties go by `tie_break` as in the vote. The assembled answer is read again by the
run's extractor: a combination the schema refuses (say, fields that exclude each other) falls
back to the whole-answer majority vote, and says so. Everything is recorded in the reduction's
`detail["fields"]`: each field's votes, missing count, winner and tie.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from lanefold.coordinators._reducers import _ballot_keys, _one_wave, _voted, vote
from lanefold.primitives import (
    Ballot,
    Lane,
    LoopContext,
    ReduceOptions,
    Reduction,
    canonical_json,
    read_answer,
    register_reducer,
    vote_fold,
    vote_summary,
)

__all__ = ("FieldVote",)


def _exact(answer: str) -> str:
    return answer  # a field's value is canonical JSON already: compared as it is


@register_reducer
class FieldVote:
    """Each field of a JSON object (each argument of a call, once its name is voted) by
    majority among the valid lanes; the winner is the object of the winning fields."""

    name: ClassVar[str] = "field_vote"
    needs_judge: ClassVar[bool] = False
    judge_keys: ClassVar[frozenset[str]] = frozenset()
    uses_model: ClassVar[bool] = False
    replays: ClassVar[bool] = True
    needs_verifier: ClassVar[bool] = False
    extract_methods: ClassVar[frozenset[str]] = frozenset({"json", "tool_call"})
    summary = staticmethod(vote_summary)

    def __init__(self, options: ReduceOptions | None = None) -> None:
        self.options = options or ReduceOptions()

    async def reduce(self, ctx: LoopContext, lanes: Sequence[Lane]) -> Reduction:
        o = self.options
        whole = vote(lanes, tie_break=o.tie_break, seed=o.seed, quorum=o.quorum)
        fallback = _voted(self.name, lanes, whole, weighted=False, quorum=o.quorum)
        calls = ctx.extract.resolved_method == "tool_call"
        keys = _ballot_keys(lanes)
        parsed = {key: _parsed(lane) for key, lane in sorted(keys.items()) if lane.completed}
        objects = {key: value for key, value in parsed.items() if isinstance(value, dict)}
        if whole.winner is None or not objects:  # nothing to vote on, or below the quorum
            return fallback
        detail: dict[str, Any] = {"fields": {}}
        if o.quorum > 1:
            detail["quorum"] = o.quorum
        ties: list[str] = []
        if calls:
            names = {key: value["name"] for key, value in objects.items()}
            named = self._field(names, {}, len(names), "name", detail, ties)
            voters = {key: objects[key]["arguments"] for key, name in names.items() if name == named}
            arguments = self._fields(voters, "arguments.", detail, ties)
            assembled: dict[str, Any] = {"name": named, "arguments": arguments}
        else:
            voters = objects
            assembled = self._fields(voters, "", detail, ties)
        winner = canonical_json(assembled)
        read = read_answer(winner, ctx.extract)
        if read.answer is None:  # the fields together are not a valid answer
            detail = {**fallback.detail, "fallback": "majority_vote", "invalid": read.reason}
            return Reduction(**{**_as_dict(fallback), "detail": detail})
        winner = read.answer
        lane = _nearest(keys, parsed, winner)
        answered = [key for key in objects if keys[key].answer is not None]
        same = sum(1 for key in answered if keys[key].answer == winner)
        return Reduction(
            reducer=self.name,
            winner=winner,
            winner_lane=lane.lane,
            winner_wave=lane.wave,
            votes=dict(whole.counts),
            tie_break=o.tie_break if ties else "none",
            tied=tuple(ties),
            abstentions=whole.abstentions,
            agreement=same / len(answered) if answered else None,
            margin=None,
            detail=detail,
            wave=_one_wave(lanes),
        )

    def _fields(
        self, voters: Mapping[int, Any], prefix: str, detail: dict[str, Any], ties: list[str]
    ) -> dict[str, Any]:
        """The object of each field's winner among `voters` (lane key -> its object)."""
        objects = {key: value for key, value in voters.items() if isinstance(value, dict)}
        chosen: dict[str, Any] = {}
        for field in sorted({name for value in objects.values() for name in value}):
            having = {key: value[field] for key, value in objects.items() if field in value}
            winner = self._field(having, objects, len(objects), prefix + field, detail, ties)
            if winner is not _ABSENT:
                chosen[field] = winner
        return chosen

    def _field(
        self,
        having: Mapping[int, Any],
        objects: Mapping[int, Any],
        voters: int,
        path: str,
        detail: dict[str, Any],
        ties: list[str],
    ) -> Any:
        """One field's vote: its winning value, or `_ABSENT` where most voters lack it."""
        ballots = [Ballot(key, canonical_json(value)) for key, value in sorted(having.items())]
        o = self.options
        result = vote_fold(ballots, tie_break=o.tie_break, seed=o.seed, normalize=_exact)  # type: ignore[arg-type]
        missing = voters - len(having)
        kept = len(having) > missing and result.winner is not None
        detail["fields"][path] = {
            "votes": dict(result.counts),
            "missing": missing,
            "winner": result.winner if kept else None,
            **({"tied": list(result.tied)} if result.tied else {}),
        }
        if result.tied:
            ties.append(path)
        if not kept or result.winner is None:
            return _ABSENT
        return json.loads(result.winner)


class _Absent:
    """A field most voting lanes lack: left out of the winner."""


_ABSENT: Any = _Absent()


def _parsed(lane: Lane) -> Any:
    if lane.answer is None:
        return None
    try:
        return json.loads(lane.answer)
    except ValueError:
        return None


def _nearest(keys: Mapping[int, Lane], parsed: Mapping[int, Any], winner: str) -> Lane:
    """The lane that answered `winner`, else the one agreeing with it on most fields (the
    lowest key on a tie): the winner's text is that lane's."""
    target = json.loads(winner)
    flat_target = _flat(target)

    def agreement(key: int) -> tuple[int, int]:
        value = parsed.get(key)
        if keys[key].answer == winner:
            return (-(10**9), key)
        flat = _flat(value) if isinstance(value, dict) else {}
        return (-sum(1 for k, v in flat_target.items() if flat.get(k) == v), key)

    best = min((key for key, value in parsed.items() if isinstance(value, dict)), key=agreement)
    return keys[best]


def _flat(value: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, item in value.items():
        if isinstance(item, dict) and prefix == "" and key == "arguments":
            flat.update(_flat(item, "arguments."))
        else:
            flat[prefix + key] = canonical_json(item)
    return flat


def _as_dict(reduction: Reduction) -> dict[str, Any]:
    return {name: getattr(reduction, name) for name in reduction.__dataclass_fields__}
