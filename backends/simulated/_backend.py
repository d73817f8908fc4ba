"""The simulated backend: a known answer distribution, latency and fault injection.

Everything it does is a function of the lane's seed (itself derived from run seed, wave and
lane) and the attempt number, so a re-dispatched lane says the same thing, and a fault on one
attempt need not repeat on the next. Each lane of a request lands after its own latency.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from typing import Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, model_validator

from primitives import (
    BackendError,
    BackendTimeoutError,
    LaneFailure,
    LaneOutcome,
    LaneRequest,
    RateLimitError,
    Sample,
    SampleRequest,
    ServerError,
    Usage,
)

__all__ = ("SimulatedBackend", "SimulatedConfig")

_OPENERS = (
    "Let me work through this step by step.",
    "First, restate the problem in simpler terms.",
    "Breaking the question into parts helps here.",
    "A quick estimate first, then the exact value.",
)
_ANSWER_IN_PROMPT = re.compile(r"Answer:\s*(.+)")


class SimulatedConfig(BaseModel):
    """`[backend] kind = "simulated"`: what the simulated sampler says, how fast, how often it fails."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["simulated"] = "simulated"
    answer: str = "391"
    accuracy: float = Field(0.6, ge=0, le=1)
    distractors: list[str] = ["381", "401", "293"]
    latency_ms: tuple[float, float] = (0.0, 0.0)
    failure_rate: float = Field(0.0, ge=0, le=1)
    prompt_tokens: int = Field(64, ge=0)
    output_tokens: int = Field(48, ge=1)
    shares_prefix: bool = True
    judge_accuracy: float = Field(0.9, ge=0, le=1)
    judge_output_tokens: int = Field(16, ge=1)
    lanes_per_request: int | None = Field(None, ge=1)
    call_log: str | None = None  # append "wave lane attempt" per lane attempt (tests count calls)

    @model_validator(mode="after")
    def _check(self) -> SimulatedConfig:
        low, high = self.latency_ms
        if low < 0 or high < low:
            raise ValueError("latency_ms must be [min, max] with 0 <= min <= max")
        if self.accuracy < 1 and not self.distractors:
            raise ValueError("distractors must not be empty when accuracy < 1")
        return self


class SimulatedBackend:
    """Deterministic sampler and judge. Reports its prompt tokens before dispatch."""

    def __init__(self, config: SimulatedConfig | None = None) -> None:
        self.config = config or SimulatedConfig()
        self.requests = 0  # backend calls made, for tests
        self.lane_attempts = 0
        self.faults: list[tuple[int, int, int, str]] = []  # (wave, lane, attempt, error class)

    @property
    def name(self) -> str:
        return "simulated"

    @property
    def max_lanes_per_request(self) -> int | None:
        return self.config.lanes_per_request

    @property
    def shares_prefix(self) -> bool:
        return self.config.shares_prefix

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return self.config.prompt_tokens

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        """Each lane lands after its own latency (drawn from its seed and attempt)."""
        cfg = self.config
        self.requests += 1
        self.lane_attempts += len(request.lanes)
        if cfg.call_log:
            async with await anyio.open_file(cfg.call_log, "a") as fh:
                await fh.write("".join(f"{request.wave} {lane.lane} {lane.attempt}\n"
                                       for lane in request.lanes))
        fault_rngs = [random.Random(f"{lane.seed}:{lane.attempt}") for lane in request.lanes]
        low, high = cfg.latency_ms
        delays = [rng.uniform(low, high) for rng in fault_rngs]
        waited = 0.0
        if not any(delays):
            await anyio.lowlevel.checkpoint()
        for i in sorted(range(len(request.lanes)), key=lambda i: (delays[i], i)):
            if delays[i] > waited:
                await anyio.sleep((delays[i] - waited) / 1000)
                waited = delays[i]
            yield self._outcome(request, i, fault_rngs[i])

    def _outcome(self, request: SampleRequest, i: int, rng: random.Random) -> LaneOutcome:
        cfg, lane = self.config, request.lanes[i]
        if rng.random() < cfg.failure_rate:
            fault = _fault(rng)
            self.faults.append((request.wave, lane.lane, lane.attempt, type(fault).__name__))
            return LaneFailure(lane.lane, fault)
        shared = request.share_prefix and i > 0
        usage_in = (0, cfg.prompt_tokens) if shared else (cfg.prompt_tokens, 0)
        if request.purpose == "judge":
            text, produced = self._judge(request.prompt, lane), cfg.judge_output_tokens
        else:
            text, produced = self._answer(lane), cfg.output_tokens
        return self._sample(lane, text, usage_in, produced)

    def _answer(self, lane: LaneRequest) -> str:
        cfg = self.config
        rng = random.Random(lane.seed)
        correct = rng.random() < cfg.accuracy
        answer = cfg.answer if correct else rng.choice(cfg.distractors)
        return f"{rng.choice(_OPENERS)} Working it through gives {answer}.\nAnswer: {answer}"

    def _judge(self, prompt: str, lane: LaneRequest) -> str:
        cfg = self.config
        rng = random.Random(lane.seed)
        found = _ANSWER_IN_PROMPT.findall(prompt)
        candidate = found[-1].strip().rstrip(".").lower() if found else ""
        correct = candidate == cfg.answer.strip().lower()
        if rng.random() >= cfg.judge_accuracy:
            correct = not correct
        score = rng.randint(7, 10) if correct else rng.randint(1, 4)
        return f"The candidate's final answer is {'right' if correct else 'wrong'}.\nScore: {score}/10"

    def _sample(self, lane: LaneRequest, text: str, usage_in: tuple[int, int],
                produced: int) -> Sample:
        finish = "stop"
        if produced > lane.max_tokens:
            # Cut short by its allotment: the text loses its tail, as a real model's would.
            keep = max(1, len(text) * lane.max_tokens // produced)
            text, produced, finish = text[:keep], lane.max_tokens, "length"
        usage = Usage(input_tokens=usage_in[0], cached_input_tokens=usage_in[1],
                      output_tokens=produced)
        return Sample(lane=lane.lane, text=text, finish_reason=finish, usage=usage)

    async def aclose(self) -> None:
        pass


def _fault(rng: random.Random) -> BackendError:
    kind = rng.randrange(3)
    if kind == 0:
        return RateLimitError("simulated rate limit (429)", retry_after=rng.uniform(0.0, 0.05))
    if kind == 1:
        return ServerError("simulated server error (503)")
    return BackendTimeoutError("simulated timeout")
