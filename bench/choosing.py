"""The simulated figures of docs/choosing-a-loop.md, printed (the tests assert them; this prints
them, with their closed forms, so the page's numbers come from a command).

    .venv/bin/python bench/choosing.py [--seeds N]

- adaptive_sample against parallel_sample: lanes used and accuracy over 200 questions whose
  accuracy is drawn from Beta(2, 1), `max_lanes = 40`, the beta rule at 0.95. Each lane's
  draws are keyed by its question and lane number, so the adaptive run's lanes are a prefix of
  the parallel run's and the two differ only in where they stop.
- sequential_refine against parallel_sample: how often 16 attempts contain the right answer
  when each later attempt copies an earlier one with probability rho = 0.6 (p = 0.1), against
  `1 - (1-p)(1-(1-rho)p)^(N-1)`; with `explore = "different_approach"` (half the copy rate).
- debate against a vote of as many calls: 3 agents, two rebuttal rounds (9 calls), p = 0.7
  with an unbiased update, and p = 0.6 with an update biased toward the right answer; each with
  its closed form (`debate_closed_form`: the majority's chance in round 0 and after the
  rebuttals, under the simulated backend's update) and the vote's, and the closed forms alone
  for a biased update at p = 0.7.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import math
import tempfile
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from typing import Any

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.primitives import MemoryEventLog, SampleRequest

QUESTION = "What is 17 * 23?"


class _PrefixBackend(SimulatedBackend):
    """Each lane's draws keyed by its question and lane number, whichever wave asks."""

    async def sample(self, request: SampleRequest) -> AsyncIterator[Any]:
        question = request.prompt.splitlines()[0]
        lanes = tuple(
            replace(
                lane,
                seed=int.from_bytes(
                    hashlib.blake2b(f"{question}:{lane.lane}".encode(), digest_size=8).digest(), "big"
                )
                >> 1,
            )
            for lane in request.lanes
        )
        async for outcome in super().sample(replace(request, lanes=lanes)):
            yield outcome


def adaptive(questions: int = 200, most: int = 40) -> None:
    backend = _PrefixBackend(SimulatedConfig(difficulty=(2.0, 1.0)))
    loops = {
        "parallel_sample": {"coordinator": "parallel_sample", "k": most},
        "adaptive_sample": {
            "coordinator": "adaptive_sample",
            "max_lanes": most,
            "window": 4,
            "rule": "beta",
            "threshold": 0.95,
        },
    }
    found = {}
    with tempfile.TemporaryDirectory() as runs:
        for name, loop in loops.items():
            config = lanefold.parse_config(
                {
                    "loop": {**loop, "max_concurrency": most},
                    "backend": {"kind": "simulated", "difficulty": [2.0, 1.0]},
                    "log": {"fsync": "never"},
                }
            )
            lanes = right = 0
            for i in range(questions):
                result = lanefold.run_sync(
                    config, f"Question {i}: {QUESTION}", runs_dir=runs, backend=backend
                )
                lanes += len(result.lanes)
                right += result.answer == "391"
            found[name] = (lanes, right / questions)
    (p_lanes, p_acc), (a_lanes, a_acc) = found["parallel_sample"], found["adaptive_sample"]
    print(
        f"adaptive_sample vs parallel_sample ({questions} questions, Beta(2, 1) accuracy, max_lanes {most}):"
    )
    print(f"  parallel_sample k={most}: {p_lanes} lanes, accuracy {p_acc:.3f}")
    print(
        f"  adaptive_sample beta 0.95: {a_lanes} lanes, accuracy {a_acc:.3f}  "
        f"({p_lanes / a_lanes:.2f}x fewer lanes)"
    )


def chain_coverage(p: float, rho: float, n: int) -> float:
    return 1 - (1 - p) * (1 - (1 - rho) * p) ** (n - 1)


def refine(seeds: int, p: float = 0.1, rho: float = 0.6, n: int = 16) -> None:
    backend = {"kind": "simulated", "accuracy": p, "copy_rate": rho}
    loops = {
        "sequential_refine": ({"coordinator": "sequential_refine", "steps": n}, chain_coverage(p, rho, n)),
        "  explore=different_approach": (
            {"coordinator": "sequential_refine", "steps": n, "explore": "different_approach"},
            chain_coverage(p, rho * SimulatedConfig().explore_copy_factor, n),
        ),
        "parallel_sample": ({"coordinator": "parallel_sample", "k": n}, 1 - (1 - p) ** n),
    }
    print(f"\ncoverage of {n} attempts (p = {p}, copy rate {rho}, {seeds} seeds): measured (closed form)")
    with tempfile.TemporaryDirectory() as runs:
        for name, (loop, closed) in loops.items():
            covered = 0
            for seed in range(seeds):
                config = lanefold.parse_config({"loop": {**loop, "seed": seed}, "backend": backend})
                result = lanefold.run_sync(config, QUESTION, runs_dir=runs, log=MemoryEventLog())
                covered += any(lane.answer == "391" for lane in result.lanes)
            print(f"  {name:<30} {covered / seeds:.3f} ({closed:.3f})")


def _vote_of(k: int, p: float) -> float:
    return sum(math.comb(k, j) * p**j * (1 - p) ** (k - j) for j in range(k // 2 + 1, k + 1))


def debate_closed_form(p: float, rounds: int, *, keep: float = 0.5, bias: float = 0.0) -> tuple[float, float]:
    """The chance that the majority of three agents is right in round 0 and after `rounds`
    rebuttals, where each agent is first right with probability p (else it gives the one
    distractor) and each round keeps its answer with probability `keep`, else adopts the right
    answer with probability `bias` when a peer has it, else a peer's at random: the simulated
    backend's debate update (`debate_keep`, `debate_bias`), as tests/coordinators/test_debate.py
    models it."""

    def product(values: Iterable[float]) -> float:
        return math.prod(values, start=1.0)

    def majority(dist: dict[tuple[int, ...], float]) -> float:
        return sum(weight for state, weight in dist.items() if sum(state) >= 2)

    dist = {s: product(p if right else 1 - p for right in s) for s in itertools.product((0, 1), repeat=3)}
    first = majority(dist)
    for _ in range(rounds):
        step: dict[tuple[int, ...], float] = {}
        for state, weight in dist.items():
            ways = []
            for agent in range(3):
                peers = [state[j] for j in range(3) if j != agent]
                toward = bias if 1 in peers else 0.0
                right = keep * state[agent] + (1 - keep) * (toward + (1 - toward) * sum(peers) / 2)
                ways.append(((1, right), (0, 1 - right)))
            for combo in itertools.product(*ways):
                key = tuple(answer for answer, _ in combo)
                step[key] = step.get(key, 0.0) + weight * product(q for _, q in combo)
        dist = step
    return first, majority(dist)


def debate(seeds: int) -> None:
    print(f"\ndebate (3 agents, 2 rebuttal rounds = 9 calls, {seeds} seeds) against a vote of 9:")
    with tempfile.TemporaryDirectory() as runs:
        for p, bias in ((0.7, 0.0), (0.6, 1.0)):
            arms = {
                "debate": {"coordinator": "debate", "agents": 3, "rounds": 2, "early_exit": False},
                "vote of 9": {"coordinator": "parallel_sample", "k": 9},
            }
            said = []
            for name, loop in arms.items():
                right = 0
                for seed in range(seeds):
                    config = lanefold.parse_config(
                        {
                            "loop": {**loop, "seed": seed},
                            "backend": {
                                "kind": "simulated",
                                "accuracy": p,
                                "debate_bias": bias,
                                "distractors": ["381"],
                            },
                        }
                    )
                    result = lanefold.run_sync(config, QUESTION, runs_dir=runs, log=MemoryEventLog())
                    right += result.answer == "391"
                said.append(f"{name} {right / seeds:.3f}")
            update = "biased toward the truth" if bias else "unbiased"
            first, after = debate_closed_form(p, 2, bias=bias)
            print(
                f"  p = {p}, {update} update: {', '.join(said)} (closed form: debate {after:.3f}, "
                f"its round-0 majority of three {first:.3f}, vote of 9 {_vote_of(9, p):.3f})"
            )
    _, after = debate_closed_form(0.7, 2, bias=1.0)
    print(
        f"  p = 0.7, biased toward the truth, closed forms only: debate {after:.3f}, "
        f"vote of 9 {_vote_of(9, 0.7):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seeds", type=int, default=300, help="runs per arm for refine and debate (300)")
    args = parser.parse_args()
    adaptive()
    refine(args.seeds)
    debate(args.seeds)


if __name__ == "__main__":
    main()
