"""What `fit` chose and why, as `compare.json` and `sweep.json` keep it.

A fitted config's record says the budget it was fitted to, the keys its loop's `fit` set, what
those params are expected to pay and the per-question limit written for them, every params the
fit priced on its way there (so why k = 27 and not 28 can be read back), and the pilot figures
the prices came from. Greedy decoding (one lane at temperature 0) is never fitted: its record
says so.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from lanefold.evaluate._pilot import Rates

__all__ = ("FitRecord", "PilotFigures", "Priced", "differing")


class PilotFigures(BaseModel):
    """What a pilot measured, per question of `questions` (the eval `eval_id`): its mean paid
    (`mean_paid`, in the budget's unit), the first prompt as the fit counts it
    (`prompt_tokens`), how the backend took its waves (`lanes_per_request`, `within_request`:
    a request's lanes share its prefill; `across_requests`: a cross-request prefix cache, as
    declared), what it measured of them (`prefix_reuse`: the share of a prompt sent again that
    was not computed again, `reuse_measured`: whether the pilot sent one again;
    `prefill_scale`, `prompt_scale`, `growth_scale`: what was computed and seen against the
    model), the spend per lane and per judged candidate, and where each question stopped
    (`stops`: lanes run, null where it ran the whole path)."""

    model_config = ConfigDict(frozen=True)

    eval_id: str
    questions: int
    mean_paid: float
    prompt_tokens: int
    lanes_per_request: int
    within_request: bool
    across_requests: bool | None
    prefix_reuse: float
    reuse_measured: bool
    prefill_scale: float
    prompt_scale: float
    growth_scale: float
    decode_per_lane: float
    cut_off_per_lane: float
    kv_usd_per_lane: float
    judge_per_candidate: float
    judge_usd_per_candidate: float
    stops: list[int | None]

    @classmethod
    def of(cls, rates: Rates, eval_id: str, mean_paid: float) -> PilotFigures:
        return cls(
            eval_id=eval_id,
            questions=len(rates.stops),
            mean_paid=mean_paid,
            prompt_tokens=rates.prompt_tokens,
            lanes_per_request=rates.serving.size,
            within_request=rates.serving.within,
            across_requests=rates.serving.across,
            prefix_reuse=rates.reuse,
            reuse_measured=rates.reuse_measured,
            prefill_scale=rates.prefill,
            prompt_scale=rates.base,
            growth_scale=rates.growth,
            decode_per_lane=rates.decode,
            cut_off_per_lane=rates.cut_off,
            kv_usd_per_lane=rates.kv_usd,
            judge_per_candidate=rates.judge,
            judge_usd_per_candidate=rates.judge_usd,
            stops=list(rates.stops),
        )


class Priced(BaseModel):
    """One params the fit priced: the keys where it differs from the config's, and what it
    was expected to pay a question (null: not known)."""

    model_config = ConfigDict(frozen=True)

    keys: dict[str, Any]
    expected: float | None


class FitRecord(BaseModel):
    """What `fit` chose for a config at `budget` (in `unit`): `keys` (what it set; `{}` where it
    kept the config's), `expected` (what those params are expected to pay a question, null
    where no pilot priced them), `limit` (the per-question limit written into `[budget]`; null
    under lanes, or where greedy), `priced` (every params the fit priced, in order), `pilot`
    (the figures the prices came from; null without a pilot). `greedy`: one lane at
    temperature 0, never fitted: run as configured, at its own spend."""

    model_config = ConfigDict(frozen=True)

    unit: str
    budget: float
    keys: dict[str, Any] = {}
    expected: float | None = None
    limit: float | None = None
    greedy: bool = False
    priced: list[Priced] = []
    pilot: PilotFigures | None = None


def differing(params: BaseModel, base: BaseModel) -> dict[str, Any]:
    """The keys where `params` differs from `base`, as JSON values."""
    mine, theirs = params.model_dump(mode="json"), base.model_dump(mode="json")
    return {key: value for key, value in mine.items() if theirs.get(key) != value}
