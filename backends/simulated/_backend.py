"""The simulated backend: a known answer distribution, latency and fault injection.

Everything it does is a function of the prompt, the lane's seed (itself derived from run seed,
wave and lane) and the attempt number, so a re-dispatched lane says the same thing, and a fault
on one attempt need not repeat on the next. Each lane of a request lands after its own latency.
By purpose: "judge" scores the last `Answer:` in its prompt; "refine" may copy an earlier
attempt; "debate" keeps its answer or adopts a peer's; `script` rules answer any purpose;
everything else samples afresh. A request that carries tools (its `tool_choice` not "none") or
a schema (a run answering with calls or JSON values) gets the answer alone as the lane's text, as
a constrained model writes it: `answer` and `distractors` are then JSON texts, and `vary_json`
spells each lane's its own way; once the history holds tools' results, `after_tool_results`
says what every lane answers next (an agent's next call, or its reply in prose).
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import AsyncIterator
from decimal import Decimal

import anyio

from lanefold.backends.simulated._config import SimulatedConfig
from lanefold.backends.simulated._json import respell
from lanefold.backends.simulated._prompt import (
    debate_view,
    earlier_answers,
    explores,
    first_line,
    normalized,
    question_keys,
)
from lanefold.primitives import (
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
    canonical_json,
    describe_answer,
)

__all__ = ("SimulatedBackend", "SimulatedConfig")

_log = logging.getLogger("lanefold.simulated")

_OPENERS = (
    "Let me work through this step by step.",
    "First, restate the problem in simpler terms.",
    "Breaking the question into parts helps here.",
    "A quick estimate first, then the exact value.",
)
_ANSWER_IN_PROMPT = re.compile(r"Answer:\s*(.+)")


class SimulatedBackend:
    """Deterministic sampler and judge. Reports its prompt tokens before dispatch."""

    def __init__(self, config: SimulatedConfig | None = None) -> None:
        self.config = config or SimulatedConfig()
        self.requests = 0  # backend calls made, for tests
        self.lane_attempts = 0
        self.faults: list[tuple[int, int, int, str]] = []  # (wave, lane, attempt, error class)
        self._unlisted: set[str] = set()  # questions asked that `answers` does not list
        self._cached: set[str] = set()  # prompts an earlier request sent (`prefix_cache`)
        self._warned = False

    @property
    def name(self) -> str:
        return "simulated"

    @property
    def max_lanes_per_request(self) -> int | None:
        return self.config.lanes_per_request

    @property
    def shares_prefix(self) -> bool:
        return self.config.shares_prefix

    def count_prompt_tokens(self, request: SampleRequest) -> int | None:
        """Exact: what `sample` bills the request's prompt, `prompt_tokens` plus
        `template_tokens` per message of a chat request and per tool it carries (a template
        renders each into the prompt)."""
        cfg = self.config
        rendered = len(request.messages) + len(request.tools) if request.messages else 0
        return cfg.prompt_tokens + cfg.template_tokens * rendered

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        """Each lane lands after its own latency (drawn from its seed and attempt)."""
        cfg = self.config
        self.requests += 1
        self.lane_attempts += len(request.lanes)
        if not self._warned:
            self._note(request)
        if cfg.call_log:
            async with await anyio.open_file(cfg.call_log, "a") as fh:
                await fh.write(
                    "".join(f"{request.wave} {lane.lane} {lane.attempt}\n" for lane in request.lanes)
                )
        fault_rngs = [random.Random(f"{lane.seed}:{lane.attempt}") for lane in request.lanes]
        cached = self._cache_hit(request)
        low, high = cfg.latency_ms
        delays = [rng.uniform(low, high) for rng in fault_rngs]
        waited = 0.0
        if not any(delays):
            await anyio.lowlevel.checkpoint()
        for i in sorted(range(len(request.lanes)), key=lambda i: (delays[i], i)):
            if delays[i] > waited:
                await anyio.sleep((delays[i] - waited) / 1000)
                waited = delays[i]
            yield self._outcome(request, i, fault_rngs[i], cached)

    def _cache_hit(self, request: SampleRequest) -> int:
        """The request's prompt tokens a prefix cache serves (an earlier request sent the same
        prompt); 0 without."""
        cfg = self.config
        if not cfg.prefix_cache:
            return 0
        if request.prompt not in self._cached:
            self._cached.add(request.prompt)
            return 0
        whole = self.count_prompt_tokens(request) or 0
        kept = whole if cfg.prefix_cache_tokens is None else cfg.prefix_cache_tokens
        return min(whole, kept)

    def _outcome(self, request: SampleRequest, i: int, rng: random.Random, cached: int) -> LaneOutcome:
        cfg, lane = self.config, request.lanes[i]
        if rng.random() < cfg.failure_rate:
            fault = _fault(rng)
            self.faults.append((request.wave, lane.lane, lane.attempt, type(fault).__name__))
            return LaneFailure(lane.lane, fault)
        shared = request.share_prefix and i > 0
        prompt = self.count_prompt_tokens(request) or 0
        if shared:
            usage_in = (0, prompt)
        else:  # the request's prompt, less what a prefix cache kept from an earlier request
            usage_in = (prompt - cached, cached)
        produced = cfg.judge_output_tokens if request.purpose == "judge" else cfg.output_tokens
        return self._sample(lane, self._text(request, lane), usage_in, produced)

    def accuracy_of(self, prompt: str) -> float:
        """The chance a fresh sample for this prompt's question is right: `accuracy`, or with
        `difficulty = [a, b]` a Beta(a, b) draw seeded by `seed` and the prompt's first line."""
        cfg = self.config
        if cfg.difficulty is None:
            return cfg.accuracy
        a, b = cfg.difficulty
        return random.Random(f"{cfg.seed}:{first_line(prompt)}").betavariate(a, b)

    def answer_of(self, prompt: str) -> str:
        """The gold answer of this prompt's question: from `answers` by its first line, else
        `answer`."""
        answers = self.config.answers
        for key in question_keys(prompt) if answers else ():
            if key in answers:
                return answers[key]
        return self.config.answer

    def _note(self, request: SampleRequest) -> None:
        """Say once, on the second question `answers` does not list, that this is no model:
        a run's first wave asks one question, so two mean a batch or a dataset."""
        answers = self.config.answers
        if (
            request.wave != 1
            or request.purpose != "sample"
            or any(key in answers for key in question_keys(request.prompt))
        ):
            return
        self._unlisted.add(first_line(request.prompt))
        if len(self._unlisted) == 2:
            self._warned = True
            self._unlisted.clear()
            _log.warning(
                "the simulated backend answers %r (its backend.answer) to every question that "
                "backend.answers does not list, whatever the question; scored against a "
                "dataset's own answers it is a test double, not a model",
                self.config.answer,
            )

    def _text(self, request: SampleRequest, lane: LaneRequest) -> str:
        prompt, purpose = request.prompt, request.purpose
        for rule in self.config.script:
            if rule.matches(purpose, prompt):
                return rule.output
        if purpose == "judge":
            return self._judge(prompt, lane)
        rng = random.Random(lane.seed)
        if purpose == "refine":
            text = self._refine(prompt, rng)
        elif purpose == "debate":
            text = self._debate(prompt, rng)
        else:
            text = self._fresh(prompt, rng)
        if request.schema is not None or (request.tools and request.tool_choice != "none"):
            answer = self._after_tools(request) or _ANSWER_IN_PROMPT.findall(text)[-1]
            return respell(answer, rng) if self.config.vary_json else answer
        return text

    def _after_tools(self, request: SampleRequest) -> str | None:
        """`after_tool_results`' answer for a request whose history holds tool results."""
        later = self.config.after_tool_results
        results = sum(1 for m in request.messages or () if m.role == "tool")
        return later[min(results, len(later)) - 1] if later and results else None

    def _fresh(self, prompt: str, rng: random.Random) -> str:
        """A fresh sample: right with the question's accuracy, else a distractor."""
        cfg, gold = self.config, self.answer_of(prompt)
        correct = rng.random() < self.accuracy_of(prompt)
        if correct:
            answer = gold
        else:  # a question's own gold is never one of its wrong answers
            wrong = cfg.distractors if gold == cfg.answer else [d for d in cfg.distractors if d != gold]
            answer = rng.choice(wrong)
        return f"{rng.choice(_OPENERS)} Working it through gives {answer}.\nAnswer: {answer}"

    def _refine(self, prompt: str, rng: random.Random) -> str:
        """Copies one earlier attempt's answer with probability `copy_rate` (times
        `explore_copy_factor` when asked for a different approach), else samples afresh."""
        cfg, earlier = self.config, earlier_answers(prompt)
        if not earlier:
            return self._fresh(prompt, rng)
        rate = cfg.copy_rate * (cfg.explore_copy_factor if explores(prompt) else 1.0)
        if rng.random() >= rate:
            return self._fresh(prompt, rng)
        answer = rng.choice(earlier)
        return f"Checking the earlier attempt again, it still gives {answer}.\nAnswer: {answer}"

    def _debate(self, prompt: str, rng: random.Random) -> str:
        """Keeps its own answer with probability `debate_keep`, else adopts a peer's: the
        right one with probability `debate_bias` when a peer has it, else one at random."""
        cfg = self.config
        own, peers = debate_view(prompt)
        if own is None:
            return self._fresh(prompt, rng)
        answer = own
        if rng.random() >= cfg.debate_keep and peers:
            gold = normalized(self.answer_of(prompt))
            right = [p for p in peers if normalized(p) == gold]
            biased = rng.random() < cfg.debate_bias
            answer = right[0] if biased and right else rng.choice(peers)
        verb = "I keep" if answer == own else "Having read the others, I now give"
        return f"{verb} {answer}.\nAnswer: {answer}"

    def _judge(self, prompt: str, lane: LaneRequest) -> str:
        cfg = self.config
        rng = random.Random(lane.seed)
        found = _ANSWER_IN_PROMPT.findall(prompt)
        candidate = found[-1].strip().rstrip(".").lower() if found else ""
        gold = self.answer_of(prompt)
        correct = candidate == gold.strip().lower()
        if not found and gold.lstrip()[:1] in ("{", "["):  # a call or a JSON object, as shown
            correct = _shown(gold) in prompt
        if rng.random() >= cfg.judge_accuracy:
            correct = not correct
        score = rng.randint(7, 10) if correct else rng.randint(1, 4)
        return f"The candidate's final answer is {'right' if correct else 'wrong'}.\nScore: {score}/10"

    def _sample(self, lane: LaneRequest, text: str, usage_in: tuple[int, int], produced: int) -> Sample:
        finish = "stop"
        if produced > lane.max_tokens:
            # Cut short by its allotment: the text loses its tail, as a real model's would.
            keep = max(1, len(text) * lane.max_tokens // produced)
            text, produced, finish = text[:keep], lane.max_tokens, "length"
        usage = Usage(input_tokens=usage_in[0], cached_input_tokens=usage_in[1], output_tokens=produced)
        return Sample(lane=lane.lane, text=text, finish_reason=finish, usage=usage)

    async def aclose(self) -> None:
        pass


def _shown(gold: str) -> str:
    """The gold answer as a judge is shown a structured candidate (`describe_answer`)."""
    try:
        return describe_answer(canonical_json(json.loads(gold, parse_float=Decimal)))
    except ValueError:
        return gold


def _fault(rng: random.Random) -> BackendError:
    kind = rng.randrange(3)
    if kind == 0:
        return RateLimitError("simulated rate limit (429)", retry_after=rng.uniform(0.0, 0.05))
    if kind == 1:
        return ServerError("simulated server error (503)")
    return BackendTimeoutError("simulated timeout")
