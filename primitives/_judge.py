"""Best-of-N judging as pure functions: render the judge's prompt, read its score, take argmax.

The score is read from the judge's OWN output only. The candidate is pasted into the judge's
prompt, never into what is parsed, so a candidate that writes "Score: 10/10" cannot grade
itself. An output with no score marker is an abstention, recorded, never a zero.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from primitives._errors import ConfigError

__all__ = (
    "JudgeResult",
    "JudgeTieBreak",
    "judge_argmax",
    "parse_score",
    "render_judge_prompt",
    "render_prompt",
)

JudgeTieBreak = Literal["first_lane", "random"]

_NUM = r"-?\d+(?:\.\d+)?|-?\.\d+"
_DENOMINATOR = rf"(?:\s*(?:/|out\s+of)\s*(?P<den>{_NUM}))?"
# `Score: 7/10`, `**Score:** 7`, `score = 8.5`, and JSON `"score": 7` or `"score": "7"`.
# `\b` keeps `final_score` or `underscore` from counting; the separator is required so that
# prose such as "a score of 3 would be harsh" is not read as a verdict.
_LABELLED = re.compile(
    rf"""(?<![\w])["']?score["']?\**\s*[:=]\s*\**\s*["']?(?P<num>{_NUM})["']?{_DENOMINATOR}""",
    re.IGNORECASE,
)
# `[[7]]` or `[[7/10]]`, the MT-Bench judge's verdict format.
_BRACKETED = re.compile(rf"\[\[\s*(?P<num>{_NUM}){_DENOMINATOR}\s*\]\]", re.IGNORECASE)
_SLOT = re.compile(r"\{(question|candidate)\}")


@dataclass(frozen=True, slots=True)
class JudgeResult:
    """The outcome of judge argmax. `tie_break` is the rule that decided, or `"none"` when the
    best score was not tied; `tied` lists the tied lanes in ascending order."""

    winner_lane: int | None
    best_score: float | None
    tie_break: str
    tied: tuple[int, ...]
    abstentions: int


def parse_score(judge_output: str, *, scale: float = 10.0) -> float | None:
    """The score in a judge's output on [0, scale], or None (an abstention).

    Reads `Score: 7/10`, `Score: 7`, `score = 8.5`, `[[7]]` and JSON `{"score": 7}`. The LAST
    such marker counts, as the verdict follows the reasoning; if it is out of range or has a
    zero denominator the output abstains rather than falling back to an earlier marker.
    A fraction is rescaled to `scale` (`4/5` on 10 is 8). Pass only the judge's output, never
    a prompt or candidate.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"scale must be a positive finite number, got {scale!r}")
    last: re.Match[str] | None = None
    for pattern in (_LABELLED, _BRACKETED):
        for match in pattern.finditer(judge_output):
            if last is None or match.start() > last.start():
                last = match
    if last is None:
        return None
    numerator = float(last.group("num"))
    denominator = last.group("den")
    if denominator is None:
        score = numerator
    else:
        den = float(denominator)
        if den <= 0:
            return None
        score = numerator * scale / den  # multiply first: 17 * 10 / 20 is exactly 8.5
    if not (0.0 <= score <= scale):
        return None
    return score


def judge_argmax(
    scores: Mapping[int, float | None],
    *,
    tie_break: JudgeTieBreak = "first_lane",
    seed: int = 0,
) -> JudgeResult:
    """The lane with the highest score; None scores (and NaN) abstain.

    Ties go by `tie_break`: `"first_lane"` the lowest lane index; `"random"` a
    `random.Random(seed)` choice among the sorted tied lanes. Depends on the mapping's contents,
    never its order. No scores at all gives winner None.
    """
    if tie_break not in ("first_lane", "random"):
        raise ConfigError(f"unknown tie_break {tie_break!r}: use first_lane or random")
    scored = {
        lane: float(score)
        for lane, score in scores.items()
        if score is not None and not math.isnan(score)
    }
    abstentions = len(scores) - len(scored)
    if not scored:
        return JudgeResult(None, None, "none", (), abstentions)
    best = max(scored.values())
    tied = tuple(
        sorted(lane for lane, score in scored.items() if score == best or math.isclose(score, best))
    )
    if len(tied) == 1:
        return JudgeResult(tied[0], scored[tied[0]], "none", (), abstentions)
    winner = tied[0] if tie_break == "first_lane" else random.Random(seed).choice(tied)
    return JudgeResult(winner, scored[winner], tie_break, tied, abstentions)


def render_prompt(template: str, *, question: str) -> str:
    """`template` with each `{question}` replaced; every other brace is literal text.

    Not `str.format`: a question holding `{` or `}` (code, JSON, LaTeX) must pass unharmed.
    """
    return _render(template, {"question": question})


def render_judge_prompt(template: str, *, question: str, candidate: str) -> str:
    """`template` with `{question}` and `{candidate}` replaced in one pass.

    One pass means a candidate that contains the text `{question}` stays as written; other
    braces in the template or the values are literal, so JSON examples in a template are safe.
    """
    return _render(template, {"question": question, "candidate": candidate})


def _render(template: str, values: Mapping[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        name = match.group(1)
        return values[name] if name in values else match.group(0)

    return _SLOT.sub(substitute, template)
