"""A loop config: its file or mapping read and checked into a `LoopConfig`, the facade's
defaults (named here once), and the checks `validate` and `run` make before anything runs.

Nothing here runs a loop; the execution folder does, from what this folder gives it.
"""

from __future__ import annotations

from lanefold.config._defaults import (
    DEFAULT_BACKEND_KIND,
    DEFAULT_EXECUTOR,
    DEFAULT_LOOP,
    DEFAULT_STORE,
    OTEL_HOOK,
    VOTE_REDUCER,
)
from lanefold.config._loop_config import (
    MAX_CONFIG_BYTES,
    MAX_NESTING,
    VERSION,
    LoopConfig,
    backend_errors,
    backend_preflight_errors,
    config_errors,
    config_hash,
    describe_errors,
    load_backend_config,
    load_config,
    parse_config,
    preflight,
    read_table,
    recorded_config,
)
from lanefold.primitives.internal import nests_deeper

__all__ = (
    "DEFAULT_BACKEND_KIND",
    "DEFAULT_EXECUTOR",
    "DEFAULT_LOOP",
    "DEFAULT_STORE",
    "MAX_CONFIG_BYTES",
    "MAX_NESTING",
    "OTEL_HOOK",
    "VERSION",
    "VOTE_REDUCER",
    "LoopConfig",
    "backend_errors",
    "backend_preflight_errors",
    "config_errors",
    "config_hash",
    "describe_errors",
    "load_backend_config",
    "load_config",
    "nests_deeper",
    "parse_config",
    "preflight",
    "read_table",
    "recorded_config",
)
