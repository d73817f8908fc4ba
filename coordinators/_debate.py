"""debate: agents answer, then revise for `rounds` rounds seeing each other's latest answers.

Round 0 is one wave of `agents` lanes on the config's prompt; each later round (a *rebuttal*)
is one wave of `agents` lanes, each with its own prompt: the question on the first line, the
agent's previous answer, one line per visible peer, and an instruction to revise. The final
round is reduced by any registered reducer. So a debate makes exactly `agents x (rounds + 1)`
calls, fewer where every agent agrees early (`early_exit`) or the budget cannot fund a round.
Du et al. (2023) count rounds including the first answer: their "2 rounds" is `rounds = 1`.

Each round is recorded (`loop.debate.round`) with what the agents answered and what the loop
decided next; a resumed run reads that decision back from the log instead of deciding again.
Its keys, prompt and rule are in `_debate_rule.py`, read by the loop and its audit alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from pydantic import BaseModel

from lanefold.coordinators._audit import (
    answers,
    candidate_lanes,
    claims,
    earliest,
    outcome,
    records,
    reduced_status,
    waves_of,
)
from lanefold.coordinators._debate_rule import (
    REVISE,
    DebateParams,
    agreement,
    answers_of,
    debate_prompt,
    decide,
    unanimous,
    visible_peers,
)
from lanefold.coordinators._parallel_sample import outcome_of
from lanefold.primitives import (
    FRAME_TOKENS,
    TEMPLATE_TOKENS,
    Allowance,
    AuditFinding,
    BudgetTooSmallError,
    CostShape,
    ExtractSpec,
    Lane,
    LaneJob,
    LoopContext,
    Outcome,
    ReducerChoice,
    RunState,
    WaveShape,
    largest_within,
    readable_number,
    register_loop,
)

__all__ = ("REVISE", "Debate", "DebateParams", "debate_prompt", "visible_peers")


@register_loop
class Debate:
    """Multi-agent debate (Du et al. 2023): answer, see the others' answers, revise, vote."""

    name: ClassVar[str] = "debate"
    Params: ClassVar[type[BaseModel]] = DebateParams

    def __init__(self, params: DebateParams | None = None) -> None:
        self.params = params or DebateParams()

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        p = self.params
        sampling = p.sampling(ctx.sampling)
        latest: dict[int, str] = {}  # agent -> its latest answer
        history: list[list[str | None]] = []
        lanes = await ctx.wave([ctx.prompt(question)] * p.agents, params=sampling, purpose="debate")
        stop: str | None = None
        dispatched = 0
        for round_ in range(p.rounds + 1):
            answers = answers_of(lanes, p.agents)
            dispatched += len(lanes)
            history.append(answers)
            latest.update({agent: a for agent, a in enumerate(answers) if a is not None})
            prompts = None
            decided = decide(p, round_, latest)
            if decided is None:
                prompts = self._prompts(question, latest)
                if not _can_fund(ctx, prompts, sampling.max_tokens):
                    decided = "budget"
            recorded = ctx.record(
                "round",
                {
                    "round": round_,
                    "answers": answers,
                    "agreement": agreement(answers),
                    "unanimous": unanimous(latest, p.agents),
                    "stop": decided,
                },
                wave=lanes[0].wave if lanes else None,
            )
            stop = recorded["stop"]  # on resume, the decision the log holds
            if stop is not None:
                break
            prompts = prompts or self._prompts(question, latest)
            lanes = await ctx.wave(
                [LaneJob(agent, prompt) for agent, prompt in prompts.items()],
                params=sampling,
                purpose="debate",
                share_prefix=False,
            )
        reduction = await ctx.reduce(lanes, p.reducer, options=p.options(ctx.seed))
        outcome = outcome_of(reduction, lanes)
        return replace(
            outcome,
            detail={
                "rounds": len(history) - 1,
                "stop": stop,
                "lanes": dispatched,
                "answers": history,
                **({"budget_stop": True} if stop == "budget" else {}),  # said only where it did
            },
        )

    @staticmethod
    def cost_shape(params: DebateParams, *, prompt_tokens: int, max_tokens: int) -> CostShape:
        """agents x (rounds + 1) lanes; each later round's prompt quotes the answers its
        agent sees; the final round's agents are the candidates."""
        quoted = max_tokens + FRAME_TOKENS  # one earlier answer, quoted in a later prompt
        seen = params.agents if params.visibility == "all" else min(params.agents, 3)
        rebuttal = prompt_tokens + TEMPLATE_TOKENS + seen * quoted
        first = WaveShape(params.agents, prompt_tokens)  # the first round's agents share one prompt
        later = WaveShape(params.agents, rebuttal, prompts=params.agents, shared=False)
        return CostShape.of([first] + [later] * params.rounds, candidates=params.agents)

    @staticmethod
    def fit(params: DebateParams, budget: Allowance) -> DebateParams:
        """Under a lane budget, agents x (rounds + 1) within it (agents first, then rounds);
        under tokens or cost, the rounds whose expected spend fills the budget with the agents
        as configured, else the most agents (2 at least) that one round of answers affords (as
        configured where its price is not known: a round the budget cannot fund is not run)."""
        if budget.unit != "lanes":
            return _fit_spend(params, budget)
        lanes = int(budget.amount)
        rounds = min(params.rounds, 1)  # a debate of rounds has one at least: else it is a vote
        agents = min(params.agents, lanes // (rounds + 1))
        if agents < 2:
            least = 2 * (rounds + 1)
            what = f"{rounds} round{'s' * (rounds != 1)}"
            raise BudgetTooSmallError(
                f"--budget: a debate of {what} needs at least {least} lanes, got {lanes}"
            )
        return params.model_copy(update={"agents": agents, "rounds": min(params.rounds, lanes // agents - 1)})

    @staticmethod
    def reducer(params: DebateParams) -> ReducerChoice:
        return params.choice()

    @staticmethod
    def candidates(params: DebateParams, state: RunState) -> list[Lane]:
        """Its reduce read the last round's lanes."""
        return candidate_lanes(state, waves_of(state, "debate")[-1:])

    @staticmethod
    def audit(
        params: DebateParams, state: RunState, *, extract: ExtractSpec, seed: int
    ) -> AuditFinding | None:
        """Each answer is the extractor's; each round's record holds its agents' answers and
        the decision its rule gives (a stop for the budget is the writer's reading of its
        ledger, taken as recorded where the rule went on); the outcome and status follow."""
        rounds = waves_of(state, "debate")
        found = answers(state, rounds, extract)
        latest: dict[int, str] = {}
        history: list[list[str | None]] = []
        dispatched, stop, wrong = 0, None, None
        for i, record in enumerate(records(state, Debate.name, "round")):
            lanes = candidate_lanes(state, rounds[i : i + 1])
            said = answers_of(lanes, params.agents)
            dispatched += len(lanes)
            history.append(said)
            latest.update({agent: a for agent, a in enumerate(said) if a is not None})
            stop = decide(params, i, latest) or ("budget" if record.data.get("stop") == "budget" else None)
            expected = {
                "round": i,
                "answers": said,
                "agreement": agreement(said),
                "unanimous": unanimous(latest, params.agents),
                "stop": stop,
            }
            wrong = claims(record.sequence, f"loop.{Debate.name}.round", record.data, expected)
            more = len(rounds) > i + 1
            if wrong is None and (not lanes or (stop is not None and more)):
                wrong = record.sequence, f"round {i}'s record, and the log holds {len(rounds)} rounds"
            if wrong is not None or stop is not None or not more:
                break
        if wrong is None and state.result is not None and len(history) != len(rounds):
            wrong = state.result_sequence or 0, f"the log holds {len(rounds)} rounds, {len(history)} recorded"
        detail = {"rounds": len(history) - 1, "stop": stop, "lanes": dispatched, "answers": history}
        told = outcome(state, detail, budget_stop=stop == "budget")
        return earliest(found, wrong, told, reduced_status(state))

    def _prompts(self, question: str, latest: Mapping[int, str]) -> dict[int, str]:
        p = self.params
        return {
            agent: debate_prompt(
                question,
                latest.get(agent),
                {
                    peer: latest[peer]
                    for peer in visible_peers(agent, p.agents, p.visibility)
                    if peer in latest
                },
                instruction=p.instruction,
            )
            for agent in range(p.agents)
        }


def _can_fund(ctx: LoopContext, prompts: Mapping[int, str], max_tokens: int) -> bool:
    """Whether the budget funds a whole rebuttal round: each lane pays its own prompt (the
    longest, to be safe) and, its prompt being its own, is a request of its own."""
    requests = ctx.budget.remaining().requests
    if requests is not None and requests < len(prompts):
        return False  # can_afford counts one request for n lanes of one prompt
    return ctx.budget.can_afford(
        len(prompts), max_tokens, share_prefix=False, prompt=max(prompts.values(), key=len)
    )


def _fit_spend(params: DebateParams, budget: Allowance) -> DebateParams:
    """agents x rounds within a token or cost budget: the rounds (one at least) that fill it
    with the agents as configured, else fewer agents (2 at least) for one round. A budget that
    cannot fund one rebuttal round of two agents is refused (BudgetTooSmallError): without a
    round a debate is a vote, and would be shown as a debate (one configured with no rounds
    may keep none)."""

    def shaped(agents: int, rounds: int) -> DebateParams:
        return params.model_copy(update={"agents": agents, "rounds": rounds})

    least = min(params.rounds, 1)
    first = budget.price(shaped(params.agents, least))
    if first is None:
        return params
    if first <= budget.amount:
        rounds = largest_within(budget, least, lambda n: shaped(params.agents, n), most=32)
        return shaped(params.agents, rounds if rounds is not None else params.rounds)
    try:
        agents = largest_within(budget, 2, lambda n: shaped(n, least), most=params.agents)
    except BudgetTooSmallError:
        two = budget.price(shaped(2, least)) or 0.0
        raise BudgetTooSmallError(
            f"--budget: {budget.amount:g} {budget.unit} a question is below a debate's least: "
            f"two agents and {least} round{'s' * (least != 1)} ({readable_number(two)} {budget.unit})"
        ) from None
    return shaped(agents if agents is not None else params.agents, least)
