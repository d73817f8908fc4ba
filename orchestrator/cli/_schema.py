"""`schema`: the JSON Schema of a loop config, built from what is registered."""

from __future__ import annotations

import argparse
import json
from typing import Any

from lanefold.cli._shared import (
    Common,
    Handler,
)
from lanefold.config import (
    DEFAULT_LOOP,
    LoopConfig,
)
from lanefold.primitives import BACKENDS
from lanefold.primitives.internal import loop_names, resolve_loop

__all__ = (
    "add_commands",
    "backend_variants",
    "config_schema",
)


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Common
) -> dict[str, Handler]:
    """Add `schema` to the CLI's subcommands; the handlers by name."""
    p = sub.add_parser("schema", help="print the config JSON Schema")
    common(p, runs=False)
    return {"schema": _cmd_schema}


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0


def config_schema() -> dict[str, Any]:
    """The config's JSON Schema: `[loop]` one of each registered loop's keys, `[backend]`
    (and `[judge.backend]`) one of each registered backend's."""
    schema = LoopConfig.model_json_schema()
    defs = schema.setdefault("$defs", {})
    shared = defs.get("LoopSection", {})
    variants = []
    for name in loop_names():
        params = resolve_loop(name).Params.model_json_schema()
        defs.update(params.pop("$defs", {}))
        properties = {**shared.get("properties", {}), **params.get("properties", {})}
        properties["coordinator"] = {"const": name, "default": DEFAULT_LOOP}
        variants.append(
            {
                "title": f"[loop] of {name}",
                "type": "object",
                "properties": properties,
                "additionalProperties": False,
            }
        )
    defs["LoopSection"] = {
        "title": "LoopSection",
        "description": shared.get("description", ""),
        "oneOf": variants,
    }
    defs["BackendSection"] = {
        "title": "BackendSection",
        "oneOf": backend_variants(defs),
        "description": "a registered backend's keys, by kind",
    }
    ref = {"$ref": "#/$defs/BackendSection"}
    schema["properties"]["backend"] = ref
    judge = defs["JudgeSection"]["properties"]
    judge["backend"] = {"anyOf": [ref, {"type": "null"}], "default": None}
    return schema


def backend_variants(defs: dict[str, Any]) -> list[dict[str, Any]]:
    """One schema for each registered backend's keys (`kind` its name); its definitions are
    added to `defs`."""
    variants = []
    for name, model in BACKENDS.items():
        keys = model.model_json_schema()
        defs.update(keys.pop("$defs", {}))
        properties = {**keys.get("properties", {}), "kind": {"const": name}}
        variants.append(
            {
                "title": f"[backend] of {name}",
                "type": "object",
                "description": keys.get("description", ""),
                "properties": properties,
                "required": sorted({"kind", *keys.get("required", ())}),
                "additionalProperties": False,
            }
        )
    return variants
