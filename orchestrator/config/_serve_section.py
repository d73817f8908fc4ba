"""`[serve]`: the upstream models the loop gateway may run a loop over, besides its own.

A loop file names one backend model (`[backend] model`); `[serve] models` lists the others the
operator allows, so the gateway serves the file as `LOOP` (its own model) and as `LOOP/MODEL`
for each listed model: the same loop with its backend's `model` set to MODEL. The list is the
operator's, written beside the loop it opens, so every entry that reads the file (`serve
--loops`, `gateway_app`, each of `serve --workers`' processes) serves the same models, and a
key cannot reach a model nobody listed. `pricing` prices a listed model where it costs other
than `[pricing]` says (a `max_cost_usd` budget then counts that model's price).

The section says how a file is served, not how a run runs: it is not part of the recorded
config, whose `[backend] model` and `[pricing]` are then those of the model that ran.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from lanefold.primitives import Pricing

__all__ = ("ServeSection",)


class ServeSection(BaseModel):
    """`[serve]`: `models`, the upstream models the gateway may serve this loop over (as
    `LOOP/MODEL`); `pricing`, a listed model's own prices (else `[pricing]`'s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[str, ...] = Field(
        (), description="upstream models the gateway serves this loop over, as LOOP/MODEL"
    )
    pricing: dict[str, Pricing] = Field(
        default_factory=dict, description="a listed model's prices, where not [pricing]'s"
    )

    @field_validator("models")
    @classmethod
    def _names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for model in value:
            if not model.strip() or model != model.strip():
                raise ValueError(f"{model!r}: a model name, without surrounding spaces")
        twice = sorted({m for m in value if value.count(m) > 1})
        if twice:
            raise ValueError(f"{twice[0]!r} is listed twice")
        return value

    @field_validator("pricing")
    @classmethod
    def _priced_listed(cls, value: dict[str, Pricing], info: ValidationInfo) -> dict[str, Pricing]:
        unlisted = sorted(set(value) - set(info.data.get("models", ())))
        if unlisted:
            raise ValueError(f"{unlisted[0]!r} is not in serve.models")
        return value
