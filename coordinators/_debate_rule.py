"""debate's keys, its rebuttal prompt and its stopping rule, as pure functions of the answers.

The loop (`_debate.py`) asks `decide` after each round and records what it says, with each
agent's answer (`answers_of`), their `agreement` and whether they are `unanimous`; the audit
of a log asks the same functions again over the lanes the log holds. One rule, read by both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from lanefold.coordinators._reducer_keys import ReducerKeys
from lanefold.primitives import Lane, normalize_answer

__all__ = (
    "REVISE",
    "DebateParams",
    "Stop",
    "Visibility",
    "agreement",
    "answers_of",
    "debate_prompt",
    "decide",
    "unanimous",
    "visible_peers",
)

Visibility = Literal["all", "neighbours"]
Stop = Literal["rounds", "agreed", "budget"]

REVISE = (
    "Using the other agents' answers as additional information, check your previous "
    "answer and give an updated one. End with 'Answer: <answer>'."
)


class DebateParams(ReducerKeys):
    """`[loop]` keys of debate."""

    agents: int = Field(3, ge=2, le=64, description="lanes per round, one per agent")
    rounds: int = Field(
        1, ge=0, le=32, description="rebuttal rounds after the first answers (Du et al.'s '2 rounds' is 1)"
    )
    visibility: Visibility = Field(
        "all", description="whose answers an agent sees: every other agent's, or its two ring neighbours'"
    )
    early_exit: bool = Field(True, description="stop once every agent gives the same answer")
    instruction: str = Field(
        REVISE, min_length=1, description="the rebuttal prompt's last line: what to do with the answers shown"
    )
    reducer: str = Field("majority_vote", description="a registered reducer for the final round")


def visible_peers(agent: int, agents: int, visibility: Visibility) -> list[int]:
    """The agents whose answers `agent` sees: every other one, or its ring neighbours."""
    if visibility == "all":
        return [peer for peer in range(agents) if peer != agent]
    return sorted({(agent - 1) % agents, (agent + 1) % agents})  # two agents: one neighbour


def debate_prompt(
    question: str, previous: str | None, peers: Mapping[int, str], *, instruction: str = REVISE
) -> str:
    """A rebuttal prompt: the question on the first line, the agent's previous answer, one
    line per peer (`Agent N answered: Y`, N counted from 1), then the instruction to revise."""
    lines = [f"Question: {' '.join(question.split())}"]
    if previous is not None:
        lines.append(f"Your previous answer: {one_line(previous)}")
    lines += [f"Agent {peer + 1} answered: {one_line(answer)}" for peer, answer in sorted(peers.items())]
    lines.append(instruction)
    return "\n".join(lines)  # no newline after it: a completion model continues "Answer:"


def one_line(answer: str) -> str:
    """An answer on one line, as a rebuttal prompt quotes it."""
    return " ".join(answer.split())


def decide(params: DebateParams, round_: int, latest: Mapping[int, str]) -> Stop | None:
    """What ends the debate after round `round_`, where something does."""
    if round_ == params.rounds:
        return "rounds"
    if params.early_exit and unanimous(latest, params.agents):
        return "agreed"
    return None


def answers_of(lanes: Sequence[Lane], agents: int) -> list[str | None]:
    """Each agent's answer in one round (None: its lane failed, was cut, or said nothing)."""
    by_agent: dict[int, str | None] = {lane.lane: lane.answer if lane.completed else None for lane in lanes}
    return [by_agent.get(agent) for agent in range(agents)]


def agreement(answers: Sequence[str | None]) -> float | None:
    """The leading answer's share of the agents that answered."""
    counts = Counter(normalize_answer(a) for a in answers if a is not None)
    counts.pop("", None)
    total = sum(counts.values())
    return max(counts.values()) / total if total else None


def unanimous(latest: Mapping[int, str], agents: int) -> bool:
    """Every agent has an answer and all of them normalise to the same one."""
    normal = {normalize_answer(latest[agent]) for agent in range(agents) if agent in latest}
    return len(latest) >= agents and len(normal) == 1 and "" not in normal
