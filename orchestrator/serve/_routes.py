"""`LOOP/MODEL`: a served loop over one of the upstream models its `[serve] models` lists.

`vote/gpt-4o-mini` is the loop `vote` with its backend's `model` set to `gpt-4o-mini` (and
`[pricing]` that model's, where `[serve.pricing]` prices it): a config of its own, checked and
preflighted when the gateway starts like any served loop, so its recorded config (and hash)
says which model ran. A key whose `loops` name `vote` may call every `vote/MODEL`; a key may
instead name `vote/gpt-4o-mini` alone. A model a loop does not list is a 404 naming those the
key may call.
"""

from __future__ import annotations

from collections.abc import Mapping

from lanefold.config import LoopConfig, parse_config, preflight
from lanefold.serve._keys import GatewayKey

__all__ = ("loop_of", "model_not_found", "over_model", "served_models")

# No HTTP here (starlette is the `serve` extra, and the command line imports this module through
# `lanefold.serve` wherever it runs): the gateway turns `model_not_found`'s words into its 404.


def loop_of(name: str) -> str:
    """The loop a served name stands for: `vote` of `vote/gpt-4o-mini` (a model may hold `/`)."""
    return name.partition("/")[0]


def over_model(config: LoopConfig, model: str) -> LoopConfig:
    """`config` run over `model`: its backend's `model` and, where listed, that model's prices."""
    raw = config.model_dump(mode="json")
    raw["backend"]["model"] = model
    priced = config.serve.pricing.get(model)
    if priced is not None:
        raw["pricing"] = priced.model_dump(mode="json")
    return parse_config(raw, source=f"serve.models: {model!r}", folder=config.folder)


def served_models(
    loops: Mapping[str, LoopConfig], sources: Mapping[str, str] | None = None
) -> dict[str, LoopConfig]:
    """Every name served, name -> config: each loop, then `LOOP/MODEL` for each model its
    `[serve] models` lists (names already there are kept: reading a result again adds
    nothing). `sources` (loop -> its file): preflight each (an engine's model on disk) as
    `serve` does at start, an error naming the file and the model."""
    served = dict(loops)
    for name, config in loops.items():
        if "/" in name:
            continue
        for model in config.serve.models:
            combined = f"{name}/{model}"
            if combined not in served:
                served[combined] = over_model(config, model)
                if sources is not None:
                    preflight(served[combined], f"{sources.get(name, name)}: serve.models {model!r}")
    return served


def model_not_found(name: object, loops: Mapping[str, LoopConfig], key: GatewayKey | None) -> str:
    """What the 404 `model_not_found` for `name` says; where it is `LOOP/MODEL` of a served
    loop, it names the models of that loop the key may call."""
    message = f"model {name!r} not found"
    if isinstance(name, str) and "/" in name:
        loop = loop_of(name)
        allowed = [n for n in loops if "/" in n and loop_of(n) == loop and (key is None or key.may_call(n))]
        if loop in loops and (key is None or key.may_call(loop) or allowed):
            message += f": loop {loop!r} serves " + (
                ", ".join(allowed) if allowed else "no other model ([serve] models lists none)"
            )
    return message
