"""Best-of-N judging as pure functions: render the judge's prompt, read its score, take argmax.

The score is read from the judge's OWN output only. The candidate is pasted into the judge's
prompt, never into what is parsed, so a candidate that writes "Score: 10/10" cannot grade
itself. An output with no score marker is an abstention, recorded, never a zero.
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from lanefold.primitives._errors import ConfigError

__all__ = (
    "JudgeResult",
    "JudgeTieBreak",
    "compile_score_regex",
    "judge_argmax",
    "parse_score",
    "render_judge_prompt",
    "render_prompt",
)

JudgeTieBreak = Literal["first_lane", "lexicographic", "random"]
"""How judge + argmax picks among the candidates with the top score (the loop's `tie_break`)."""
_TIE_BREAKS: tuple[str, ...] = get_args(JudgeTieBreak)

_NUM = r"-?\d+(?:\.\d+)?|-?\.\d+"
_DENOMINATOR = rf"(?:\s*(?:/|out\s+of)\s*(?P<den>{_NUM}))?"
# `Score: 7/10`, `**Rating:** 7`, `grade = 8.5`, and JSON `"score": 7` or `"score": "7"`.
# The lookbehind keeps `final_score` or `underscore` from counting; the separator is required
# so that prose such as "a score of 3 would be harsh" is not read as a verdict.
_LABELLED = re.compile(
    rf"""(?<![\w])["']?(?:score|rating|grade)["']?\**\s*[:=]\s*\**\s*["']?(?P<num>{_NUM})["']?"""
    rf"{_DENOMINATOR}",
    re.IGNORECASE,
)
# `[[7]]` or `[[7/10]]`, the MT-Bench judge's verdict format.
_BRACKETED = re.compile(rf"\[\[\s*(?P<num>{_NUM}){_DENOMINATOR}\s*\]\]", re.IGNORECASE)
# ` 7` or ` 8/10.` as the whole start of the output: the completion of a template that ends in
# `Score:`, whose label is in the prompt rather than the output.
_LEADING = re.compile(rf"\A\s*\**\s*(?P<num>{_NUM}){_DENOMINATOR}(?=\Z|\s|[.,;:!?)\]*\"'])", re.IGNORECASE)
# A bare `8/10` in running text; not one piece of a date or path such as `1/2/2024`.
_UNSIGNED = r"\d+(?:\.\d+)?"
_BARE_FRACTION = re.compile(rf"(?<![\w./])(?P<num>{_UNSIGNED})/(?P<den>{_UNSIGNED})(?![\w/%]|\.\d)")
_STRICT_NUMBER = re.compile(rf"\s*(?:{_NUM})\s*")
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


def parse_score(
    judge_output: str, *, scale: float = 10.0, pattern: str | re.Pattern[str] | None = None
) -> float | None:
    """The score in a judge's output on [0, scale], or None (an abstention).

    Reads `Score: 7/10`, `Rating: 7`, `grade = 8.5`, `[[7]]` and JSON `{"score": 7}`; the LAST
    such marker counts, as the verdict follows the reasoning. With no marker, a number or
    fraction opening the output (` 7`, ` 8/10.`: the completion of a prompt ending in
    `Score:`) counts, else the last bare fraction (`... so 8/10`). The marker chosen decides:
    out of range or a zero denominator abstains rather than falling back to another one.
    A fraction is rescaled to `scale` (`4/5` on 10 is 8).

    `pattern` (a config's `score_regex`) replaces all of that: its last match counts, read
    from the group `num` (else group 1) over an optional group `den`. Pass only the judge's
    output, never a prompt or candidate.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"scale must be a positive finite number, got {scale!r}")
    if pattern is not None:
        return _parse_with(_checked(pattern), judge_output, scale)
    match = _last(_LABELLED, judge_output)
    bracketed = _last(_BRACKETED, judge_output)
    if match is None or (bracketed is not None and bracketed.start() > match.start()):
        match = bracketed
    if match is None:
        match = _LEADING.match(judge_output) or _last(_BARE_FRACTION, judge_output)
    if match is None:
        return None
    return _scaled(match.group("num"), match.group("den"), scale)


def compile_score_regex(text: str) -> re.Pattern[str]:
    """A config's `score_regex` compiled, or a ConfigError saying why it cannot read a score:
    it must compile and capture the number in a group (`num`, else the first)."""
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise ConfigError(f"judge.score_regex: {text!r} is not a valid regular expression: {exc}") from None
    return _checked(pattern)


def _checked(pattern: str | re.Pattern[str]) -> re.Pattern[str]:
    if isinstance(pattern, str):
        return compile_score_regex(pattern)
    if pattern.groups == 0:
        raise ConfigError(
            f"judge.score_regex: {pattern.pattern!r} has no group: capture the score as (?P<num>...) or (...)"
        )
    if "num" not in pattern.groupindex and pattern.groupindex.get("den") == 1:
        raise ConfigError(
            f"judge.score_regex: {pattern.pattern!r}: group 1 is the denominator; "
            "name the score's group (?P<num>...)"
        )
    return pattern


def _parse_with(pattern: re.Pattern[str], judge_output: str, scale: float) -> float | None:
    match = _last(pattern, judge_output)
    if match is None:
        return None
    numerator = match.group("num") if "num" in pattern.groupindex else match.group(1)
    denominator = match.group("den") if "den" in pattern.groupindex else None
    if numerator is None or not _STRICT_NUMBER.fullmatch(numerator):
        return None
    if denominator is not None and not _STRICT_NUMBER.fullmatch(denominator):
        return None
    return _scaled(numerator, denominator, scale)


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = deque(pattern.finditer(text), maxlen=1)  # keeps only the last match
    return found[0] if found else None


def _scaled(numerator: str, denominator: str | None, scale: float) -> float | None:
    """`numerator` (over `denominator`, rescaled to `scale`) if it lies on [0, scale]."""
    if denominator is None:
        score = float(numerator)
    else:
        den = float(denominator)
        if den <= 0:
            return None
        score = float(numerator) * scale / den  # multiply first: 17 * 10 / 20 is exactly 8.5
    if not (0.0 <= score <= scale):
        return None
    return score


def judge_argmax(
    scores: Mapping[int, float | None],
    *,
    tie_break: JudgeTieBreak = "first_lane",
    seed: int = 0,
    answers: Mapping[int, str | None] | None = None,
) -> JudgeResult:
    """The lane with the highest score; None scores (and NaN) abstain.

    Ties go by `tie_break`: `"first_lane"` the lowest lane index; `"lexicographic"` the lane
    whose answer in `answers` is smallest as given (None or missing last), then the lowest
    lane, so the pick depends on what was answered rather than on lane order; `"random"` a
    `random.Random(seed)` choice among the sorted tied lanes. Depends on the mappings'
    contents, never their order. No scores at all gives winner None.
    """
    if tie_break not in _TIE_BREAKS:
        raise ConfigError(f"unknown tie_break {tie_break!r}: use first_lane, lexicographic or random")
    scored = {
        lane: float(score) for lane, score in scores.items() if score is not None and not math.isnan(score)
    }
    abstentions = len(scores) - len(scored)
    if not scored:
        return JudgeResult(None, None, "none", (), abstentions)
    best = max(scored.values())
    tied = tuple(sorted(lane for lane, score in scored.items() if score == best or math.isclose(score, best)))
    if len(tied) == 1:
        return JudgeResult(tied[0], scored[tied[0]], "none", (), abstentions)
    if tie_break == "first_lane":
        winner = tied[0]
    elif tie_break == "lexicographic":
        given = answers or {}
        winner = min(tied, key=lambda lane: (given.get(lane) is None, given.get(lane) or "", lane))
    else:
        winner = random.Random(seed).choice(tied)
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
