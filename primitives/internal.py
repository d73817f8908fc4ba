"""The governed core the facade drives, not for extenders: it may change in any release.

A loop reaches all of it through its `LoopContext`; a backend, store, reducer or hook never needs
it (`tests/test_surface.py` holds the plug-in packages to that). `lanefold.primitives` holds what
extenders use. Here besides the dispatch path and its recorder: the readers of what a plug-in
declares (`backend_*`, `cost_shape`, `fit_params`, `audit_run`, ...), which give a plug-in that
declares nothing its defaults, and the plumbing of the registries (`import_object`,
`plugin_folders`, `build_hook`, ...). A name here that `lanefold.primitives` exported before is
still found there until 0.3, with a DeprecationWarning.
"""

from __future__ import annotations

from lanefold.primitives._audit import audit_run, reduced_lanes, reread_lanes, run_extract
from lanefold.primitives._backend import closing
from lanefold.primitives._backend_spec import (
    PROMPT_FORMS,
    backend_build_errors,
    backend_deprecated,
    backend_gpus,
    backend_preflight,
    backend_prompt_forms,
    backend_prompt_tokens,
    backend_sharing,
)
from lanefold.primitives._budget import cost_of
from lanefold.primitives._context import RunBudget, RunContext, wave_fingerprint
from lanefold.primitives._declared import (
    cost_shape,
    extract_methods,
    extract_mismatch,
    fit_params,
    pooled_lanes,
    scores_line,
    stopped_for_budget,
    tally,
)
from lanefold.primitives._dispatch import (
    Dispatcher,
    RetryPolicy,
    WaveSpec,
    check_sendable,
    lane_seed,
    request_size,
)
from lanefold.primitives._hooks import HookRunner, build_hook, hook_params
from lanefold.primitives._judge import render_prompt
from lanefold.primitives._keystore import key_budget_name, rate_levels
from lanefold.primitives._nesting import nests_deeper
from lanefold.primitives._offload import serving
from lanefold.primitives._record import Recorder
from lanefold.primitives._registry import (
    import_object,
    loop_names,
    plugin_folders,
    reducer_names,
    resolve_loop,
    store_for_url,
    without_plugin_imports,
)
from lanefold.primitives._replay import ReplaySettings
from lanefold.primitives._result import failed_result, result_from_state
from lanefold.primitives._secrets import secret_header
from lanefold.primitives._shape import shape_waves
from lanefold.primitives._since import at_most, reading_a_record
from lanefold.primitives._state import apply
from lanefold.primitives._vote import logprob_weight

__all__ = (
    "PROMPT_FORMS",
    "Dispatcher",
    "HookRunner",
    "Recorder",
    "ReplaySettings",
    "RetryPolicy",
    "RunBudget",
    "RunContext",
    "WaveSpec",
    "apply",
    "at_most",
    "audit_run",
    "backend_build_errors",
    "backend_deprecated",
    "backend_gpus",
    "backend_preflight",
    "backend_prompt_forms",
    "backend_prompt_tokens",
    "backend_sharing",
    "build_hook",
    "check_sendable",
    "closing",
    "cost_of",
    "cost_shape",
    "extract_methods",
    "extract_mismatch",
    "failed_result",
    "fit_params",
    "hook_params",
    "import_object",
    "key_budget_name",
    "lane_seed",
    "logprob_weight",
    "loop_names",
    "nests_deeper",
    "plugin_folders",
    "pooled_lanes",
    "rate_levels",
    "reading_a_record",
    "reduced_lanes",
    "reducer_names",
    "render_prompt",
    "request_size",
    "reread_lanes",
    "resolve_loop",
    "result_from_state",
    "run_extract",
    "scores_line",
    "secret_header",
    "serving",
    "shape_waves",
    "stopped_for_budget",
    "store_for_url",
    "tally",
    "wave_fingerprint",
    "without_plugin_imports",
)
