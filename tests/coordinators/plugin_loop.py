"""A loop that lives outside the library, as a user's would: `coordinator = "plugin_loop:CritiqueLoop"`.

critique: a wave of drafts, a note of what they said, a second wave whose prompts quote the
drafts' answers, majority vote over the second wave. Tests copy this file next to a config
(the CLI puts the config's folder on sys.path) and may edit `CRITIQUE` in the copy to change
what wave 2 asks for.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from lanefold import LoopContext, Outcome

CRITIQUE = "Earlier drafts answered: {answers}. Check them, then end with 'Answer: <answer>'."


class CritiqueParams(BaseModel):
    """`[loop]` keys of critique."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    drafts: int = Field(3, ge=1)
    critics: int = Field(5, ge=1)


class CritiqueLoop:
    """Draft, note, critique, vote."""

    name: ClassVar[str] = "critique"
    Params: ClassVar[type[BaseModel]] = CritiqueParams

    def __init__(self, params: CritiqueParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        p = self.params
        drafts = await ctx.wave([ctx.prompt(question)] * p.drafts, purpose="sample")
        answers = [lane.answer for lane in drafts if lane.completed and lane.answer is not None]
        ctx.record("drafted", {"answers": answers, "completed": len(answers)}, wave=drafts[0].wave)
        critique = ctx.prompt(question) + "\n" + CRITIQUE.format(answers=", ".join(answers))
        critics = await ctx.wave([critique] * p.critics, purpose="sample")
        reduction = await ctx.reduce(critics, "majority_vote")
        winner = next((lane for lane in critics if lane.lane == reduction.winner_lane), None)
        return Outcome(
            answer=reduction.winner,
            winner_lane=reduction.winner_lane,
            winner_text=winner.text if winner is not None else None,
            winner_wave=winner.wave if winner is not None else None,
            agreement=reduction.agreement,
            margin=reduction.margin,
            reduction=reduction,
            detail={"drafts": answers, "critique_wave": critics[0].wave},
        )
