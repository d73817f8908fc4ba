"""What the simulated backend reads in a prompt: the question, earlier attempts, a debate's view.

The conventions loops write to (docs/backends.md): the question on the FIRST line; a refine
prompt's earlier attempts as lines `Answer: X` after it; a debate prompt's own answer on a line
`Your previous answer: X` and each peer's on a line `Agent N answered: Y`.
"""

from __future__ import annotations

import re

__all__ = ("debate_view", "earlier_answers", "explores", "first_line", "normalized", "question_keys")

_ANSWER_LINE = re.compile(r"^Answer:\s*(.+)$", re.MULTILINE)
_OWN_LINE = re.compile(r"^Your previous answer:\s*(.+)$", re.MULTILINE)
_PEER_LINE = re.compile(r"^Agent\s+\S+\s+answered:\s*(.+)$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"<[^<>]*>")  # "Answer: <answer>" in an instruction is not an attempt
_EXPLORE = "different approach"


def first_line(prompt: str) -> str:
    """The prompt's first line, as is: what identifies its question."""
    return prompt.partition("\n")[0]


def question_keys(prompt: str) -> tuple[str, ...]:
    """The ways `answers` may name this prompt's question: its first line, stripped, and
    stripped of a leading `Question:` label."""
    line = first_line(prompt).strip()
    bare = line.removeprefix("Question:").strip() if line.startswith("Question:") else line
    return tuple(dict.fromkeys((first_line(prompt), line, bare)))


def normalized(answer: str) -> str:
    """How two answers are compared: case, surrounding space and a final period aside."""
    return answer.strip().rstrip(".").strip().lower()


def _answers(pattern: re.Pattern[str], text: str) -> list[str]:
    found = (m.strip().rstrip(".").strip() for m in pattern.findall(text))
    return [a for a in found if a and not _PLACEHOLDER.fullmatch(a)]


def earlier_answers(prompt: str) -> list[str]:
    """Earlier attempts' answers shown in a refine prompt: `Answer: X` lines after the first."""
    return _answers(_ANSWER_LINE, prompt.partition("\n")[2])


def explores(prompt: str) -> bool:
    """Whether the prompt asks for a different approach (which lowers the copy rate)."""
    return _EXPLORE in prompt.lower()


def debate_view(prompt: str) -> tuple[str | None, list[str]]:
    """A debate prompt's (own previous answer or None in round 0, peers' answers)."""
    own = _answers(_OWN_LINE, prompt)
    return (own[-1] if own else None), _answers(_PEER_LINE, prompt)
