"""The loop gateway's reply: the response made of a run's result (its top distinct answers as
choices, each a call, a value or a lane's text; the whole run's bill as `usage`; how the answer
was reached as `lanefold`), and the 422 a run without an answer is told as."""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

from lanefold.execution import LaneResult, RunResult
from lanefold.primitives import RunState, normalize_answer
from lanefold.serve._gateway_tools import reply_message
from lanefold.serve._gateway_wire import Ask
from lanefold.serve._guard import HTTPError

__all__ = ("NoAnswer", "response_body")


def _usage(result: RunResult) -> dict[str, Any]:
    """The whole run's bill in OpenAI's shape: every lane's prompt (cached prefill in
    `cached_tokens`) and output; a judge's tokens count as completion tokens."""
    u = result.usage
    prompt = u.prefill_tokens + u.cached_prefill_tokens
    completion = u.decode_tokens + u.verifier_tokens + u.cut_off_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": u.cached_prefill_tokens},
    }


def _choices(result: RunResult, state: RunState | None, n: int) -> list[tuple[str | None, str, str | None]]:
    """(answer, text, finish_reason) of the top `n` distinct answers: the winner first, then by votes
    (or by score), each from its first lane that gave it."""
    texts: dict[tuple[int, int], tuple[str | None, str | None]] = {}
    if state is not None:
        for wave_no, wave in sorted(state.waves.items()):
            for lane_no, lane_state in sorted(wave.lanes.items()):
                texts[(wave_no, lane_no)] = (lane_state.text, lane_state.finish_reason)
    winner_finish = next(
        (
            lane.finish_reason
            for lane in reversed(result.lanes)
            if lane.lane == result.winner_lane and result.winner_wave in (None, lane.wave)
        ),
        "stop",
    )
    chosen: list[tuple[str | None, str, str | None]] = [
        (result.answer, result.winner_text or "", winner_finish or "stop")
    ]
    if n == 1 or result.answer is None:
        return chosen
    if result.votes:
        ranked = sorted(result.votes, key=lambda a: -float(result.votes[a]))
    else:
        by_answer: dict[str, float] = {}
        for scored in result.lanes:
            if scored.answer is not None and scored.score is not None:
                by_answer[scored.answer] = max(by_answer.get(scored.answer, -math.inf), scored.score)
        ranked = sorted(by_answer, key=lambda a: -by_answer[a])
    for answer in ranked:
        if len(chosen) >= n:
            break
        if answer == result.answer:
            continue
        lane = next((x for x in result.lanes if x.answer == answer and x.status == "completed"), None)
        if lane is None:
            continue
        text, finish = texts.get((lane.wave, lane.lane), (None, None))
        if text is not None:
            chosen.append((answer, text, finish or "stop"))
    return chosen


class NoAnswer(HTTPError):
    """A run that ended without an answer, as the client hears it: 422 with `code` and `type`
    `no_answer`, the run's reason in the message, and the reply's `lanefold` object inside
    `error` (where the SDKs hand it on, as the exception's `body`). Never retried: the same
    request samples the same lanes."""

    def __init__(self, lanefold: dict[str, Any]) -> None:
        super().__init__(
            422,
            f"the loop gave no answer: {lanefold['reason']}",
            kind="no_answer",
            code="no_answer",
            headers={"x-lanefold-run-id": lanefold["run_id"], "x-should-retry": "false"},
        )
        self.lanefold = lanefold

    def error(self) -> dict[str, Any]:
        """The `error` object of the response body (and of a stream's error event)."""
        return {
            "message": str(self),
            "type": self.kind,
            "param": None,
            "code": self.code,
            "lanefold": self.lanefold,
        }

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.error()}, status_code=self.status, headers=self.headers)


def response_body(ask: Ask, result: RunResult, state: RunState | None, created: int) -> dict[str, Any]:
    """The reply to `ask` from its run's result (and, for more than one choice or a run
    without an answer, its folded log). A run without an answer raises `NoAnswer`, unless its
    config says `[loop] on_no_answer = "best_lane"`: then the best lane's text is the one
    choice, its `finish_reason` and `lanefold.status` "no_answer"."""
    lanefold = _lanefold(ask.loop, result)
    if result.status == "no_answer":
        best = _best_lane(result, state) if _on_no_answer(state) == "best_lane" else None
        if best is None:
            raise NoAnswer(lanefold)
        lane, text = best
        lanefold["served_lane"] = {"wave": lane.wave, "lane": lane.lane}
        chosen: list[tuple[str | None, str, str | None]] = [(None, text, "no_answer")]
    else:
        chosen = _choices(result, state, ask.options.n)
    choices = []
    for i, (answer, text, finish) in enumerate(chosen):
        if ask.kind == "chat.completion":
            message, finish = reply_message(ask.answering, answer, text, finish, result.run_id, i)
            choices.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
        else:
            choices.append({"index": i, "text": text, "finish_reason": finish, "logprobs": None})
    return {
        "id": f"{'chatcmpl' if ask.kind == 'chat.completion' else 'cmpl'}-{result.run_id}",
        "object": ask.kind,
        "created": created,
        "model": ask.loop,
        "choices": choices,
        "usage": _usage(result),
        "lanefold": lanefold,
    }


def _on_no_answer(state: RunState | None) -> str:
    """What the run's recorded config says to reply without an answer (a replay answers as
    the run was served, whatever the loop's file says now)."""
    config = state.started.config if state is not None and state.started is not None else {}
    loop = config.get("loop")
    return str(loop.get("on_no_answer", "error")) if isinstance(loop, dict) else "error"


def _best_lane(result: RunResult, state: RunState | None) -> tuple[LaneResult, str] | None:
    """The sampled lane to serve without an answer, and its text: one whose answer has the
    most votes (below the quorum), else the best judged, else the first that stopped on its
    own, else the first that completed; None where none completed."""

    def rank(lane: LaneResult) -> tuple[float, float, bool, int, int]:
        answer = normalize_answer(lane.answer) if lane.answer else ""
        votes = float(result.votes.get(answer, 0.0)) if answer else 0.0
        score = lane.score if lane.score is not None else -math.inf
        return (-votes, -score, lane.finish_reason != "stop", lane.wave, lane.lane)

    if state is None:
        return None
    for lane in sorted((x for x in result.lanes if x.status == "completed"), key=rank):
        wave = state.waves.get(lane.wave)
        landed = wave.lanes.get(lane.lane) if wave is not None else None
        if landed is not None and landed.text is not None:
            return lane, landed.text
    return None


def _lanefold(loop: str, result: RunResult) -> dict[str, Any]:
    return {
        "run_id": result.run_id,
        "loop": loop,
        "status": result.status,
        "reason": result.reason,
        "answer": result.answer,
        "votes": result.votes,
        "scores": {str(k): v for k, v in result.scores.items()},
        "agreement": result.agreement,
        "margin": result.margin,
        "lanes": result.lanes_completed,
        "lanes_failed": result.lanes_failed,
        "lanes_answered": result.lanes_answered,
        "resumes": result.resumes,
        "bill": {
            "usage": result.usage.model_dump(mode="json"),
            "cost": result.cost.model_dump(mode="json"),
        },
    }
