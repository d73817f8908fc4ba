"""The facade's defaults, the one place under `orchestrator/` that names a built-in plug-in.

Everything else reaches plug-ins through the registries and what they declare (`reducer_traits`,
`lanefold.primitives.internal`'s `cost_shape` and `fit_params`, a store's `schemes`, ...), so a
plug-in takes part wherever a built-in does. `tests/test_layout.py` holds the facade to that.
"""

from __future__ import annotations

__all__ = (
    "DEFAULT_BACKEND_KIND",
    "DEFAULT_EXECUTOR",
    "DEFAULT_LOOP",
    "DEFAULT_STORE",
    "OTEL_HOOK",
    "VOTE_REDUCER",
)

DEFAULT_LOOP = "parallel_sample"  # `[loop] coordinator` when a config names none
# The reducer `curve` counts itself (majority@k over subsets of a pool, sampling nothing): the
# vote of `vote_fold`, ties to the first lane, as the built-in majority vote reduces.
VOTE_REDUCER = "majority_vote"
DEFAULT_BACKEND_KIND = "engine"  # `[backend] kind` when a config names none: the bundled model
DEFAULT_STORE = "files"  # the store a command opens without a URL (`runs_dir`)
DEFAULT_EXECUTOR = "local"  # where a Session's questions run when none is named: here
OTEL_HOOK = "otel"  # the hook `--otel-endpoint URL` adds: `[[hooks]] kind = "otel"`, endpoint = URL
