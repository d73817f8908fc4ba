"""The surface lanefold promises: `lanefold.primitives` holds what an extender implements or calls,
`lanefold.primitives.internal` what only the facade drives, each list pinned here (changing one
is a deliberate act, made here and in CHANGELOG.md), and a name moved from one to the other still
found where it was, with a warning, for one minor release (docs/deprecations.md)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import lanefold.primitives as primitives
from lanefold.primitives import internal

ROOT = Path(__file__).resolve().parent.parent
PLUG_IN_FOLDERS = ("backends", "coordinators", "stores")

# What an extender implements or calls (protocols, events, errors, registries and their
# decorators, the pure functions a plug-in needs): `lanefold.primitives.__all__`, pinned.
PRIMITIVES_PUBLIC = frozenset(
    {
        "KeyRate",
        "KeyRecord",
        "KeyStore",
        "RateVerdict",
        "StoredKey",
        "check_key_name",
        "give_rate",
        "take_rate",
        "untaken",
        "use_only",
        "UsesInFlight",
        "Allowance",
        "AnswerRead",
        "AnyEvent",
        "AuditFinding",
        "AuthenticationError",
        "BACKENDS",
        "Backend",
        "BackendError",
        "BackendSpec",
        "BackendTimeoutError",
        "BadResponseError",
        "Ballot",
        "Budget",
        "BudgetExhaustedError",
        "BudgetStore",
        "BudgetTooSmallError",
        "BudgetUnit",
        "BudgetView",
        "CallableVerifier",
        "ChatMessage",
        "Coalesced",
        "ConfigError",
        "ContextLengthError",
        "ContextWindow",
        "CostBreakdown",
        "CostShape",
        "END_TIMEOUT_S",
        "END_TYPES",
        "EXECUTORS",
        "EndHook",
        "EvalRecord",
        "Event",
        "EventHook",
        "EventLog",
        "ExtractMethod",
        "ExtractSpec",
        "FRAME_TOKENS",
        "FsyncPolicy",
        "HOOKS",
        "Hold",
        "Hook",
        "JudgeCall",
        "JudgeResult",
        "JudgeSettings",
        "JudgeTieBreak",
        "LOOPS",
        "Lane",
        "LaneFailure",
        "LaneJob",
        "LaneOutcome",
        "LaneRequest",
        "LaneResult",
        "LaneState",
        "LaneTokens",
        "LanefoldError",
        "Ledger",
        "Limits",
        "Loadable",
        "LogCorruptError",
        "LogTooNewError",
        "LogWriteError",
        "Loop",
        "LoopContext",
        "MAX_LANE_TOKENS",
        "MemoryEventLog",
        "MessageToolCall",
        "NonDeterminismError",
        "NotOfKindError",
        "Outcome",
        "PluginImportError",
        "PluginNotImportedError",
        "PrefixSharing",
        "Pricing",
        "PromptForm",
        "QUEUE_LIMIT",
        "QuorumNotMetError",
        "REDUCERS",
        "RateLimitError",
        "ReduceOptions",
        "Reducer",
        "ReducerChoice",
        "ReducerTraits",
        "Reduction",
        "Refusal",
        "Registry",
        "Remaining",
        "RequestRejectedError",
        "Room",
        "RunError",
        "RunFailure",
        "RunInUseError",
        "RunNotFoundError",
        "RunResult",
        "RunState",
        "RunStatus",
        "RunSummary",
        "STORES",
        "STRUCTURED_METHODS",
        "Sample",
        "SampleRequest",
        "SamplingParams",
        "ServerError",
        "SharedPool",
        "Spend",
        "Store",
        "StoreError",
        "StreamingBackend",
        "TEMPLATE_TOKENS",
        "TOOL_CHOICES",
        "TextDelta",
        "ToolCall",
        "ToolSpec",
        "TornTail",
        "Usage",
        "UsageBreakdown",
        "VERIFIERS",
        "Verdict",
        "Verifier",
        "VerifierFn",
        "VoteResult",
        "VoteTieBreak",
        "WaveShape",
        "WaveState",
        "call_arguments",
        "canonical_json",
        "check_budget_name",
        "check_headers",
        "check_headers_env",
        "check_next_sequence",
        "check_tool_choice",
        "check_verifier_limits",
        "coalesced_flushes",
        "coalesced_reservations",
        "compile_score_regex",
        "describe_answer",
        "estimate_prompt_tokens",
        "extract_answer",
        "fill_defaults",
        "flatten_chat",
        "flush_pending",
        "fold",
        "get_logger",
        "hash_config",
        "headers_from_env",
        "import_verifier",
        "judge_argmax",
        "largest_within",
        "loop_reducer",
        "new_run_id",
        "normalize_answer",
        "offload",
        "offered_tools",
        "one_line",
        "os_failure",
        "parse_event",
        "parse_score",
        "parse_tools",
        "read_answer",
        "read_event",
        "read_secret",
        "readable_number",
        "redact_url",
        "reducer_traits",
        "register_backend",
        "register_executor",
        "register_hook",
        "register_loop",
        "register_reducer",
        "register_store",
        "register_verifier",
        "render_judge_prompt",
        "resolve_reducer",
        "sample_all",
        "score_summary",
        "select_runs",
        "reserve_in_turn",
        "short_of_room",
        "summarize_run",
        "text_prompt",
        "tool_choice_in_effect",
        "tool_prompt",
        "tool_turns",
        "tools_schema",
        "validate_run_id",
        "vote_fold",
        "vote_summary",
    }
)

# What only the facade drives: `lanefold.primitives.internal.__all__`, pinned. It may change in
# any release; a name that was in `lanefold.primitives` warns there until 0.3 (MOVED_TO_INTERNAL).
PRIMITIVES_INTERNAL = frozenset(
    {
        "key_budget_name",
        "rate_levels",
        "Dispatcher",
        "HookRunner",
        "PROMPT_FORMS",
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
        "lane_seed",
        "logprob_weight",
        "loop_names",
        "nests_deeper",
        "plugin_folders",
        "pooled_lanes",
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
        "serving",
        "secret_header",
        "shape_waves",
        "stopped_for_budget",
        "store_for_url",
        "tally",
        "wave_fingerprint",
        "without_plugin_imports",
    }
)

# Names `lanefold.primitives` exported before 0.2's cut: found there still, with a warning, until 0.3.
MOVED_TO_INTERNAL = frozenset(
    {
        "Dispatcher",
        "HookRunner",
        "PROMPT_FORMS",
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
        "closing",
        "cost_of",
        "cost_shape",
        "fit_params",
        "hook_params",
        "import_object",
        "lane_seed",
        "logprob_weight",
        "loop_names",
        "plugin_folders",
        "pooled_lanes",
        "reading_a_record",
        "reduced_lanes",
        "reducer_names",
        "render_prompt",
        "request_size",
        "reread_lanes",
        "resolve_loop",
        "scores_line",
        "secret_header",
        "shape_waves",
        "stopped_for_budget",
        "store_for_url",
        "tally",
        "wave_fingerprint",
        "without_plugin_imports",
    }
)


def test_the_primitives_public_names_are_pinned() -> None:
    assert sorted(set(primitives.__all__) - PRIMITIVES_PUBLIC) == []  # added: pin it here
    assert sorted(PRIMITIVES_PUBLIC - set(primitives.__all__)) == []  # gone: say so in CHANGELOG.md
    assert len(primitives.__all__) == len(PRIMITIVES_PUBLIC)


def test_the_primitives_internal_names_are_pinned() -> None:
    assert set(internal.__all__) == PRIMITIVES_INTERNAL
    assert len(internal.__all__) == len(PRIMITIVES_INTERNAL)
    assert not PRIMITIVES_PUBLIC & PRIMITIVES_INTERNAL  # each name has one home


@pytest.mark.parametrize("name", sorted(MOVED_TO_INTERNAL))
def test_a_name_moved_to_internal_warns_where_it_was_and_is_the_same_object(name: str) -> None:
    assert name in PRIMITIVES_INTERNAL and name not in PRIMITIVES_PUBLIC
    with pytest.warns(
        DeprecationWarning,
        match=rf"lanefold\.primitives\.{name} is internal: import it "
        rf"from lanefold\.primitives\.internal \(it goes from lanefold\.primitives in 0\.3\)",
    ):
        found = getattr(primitives, name)
    assert found is getattr(internal, name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="NoSuchName"):
            _ = primitives.NoSuchName  # type: ignore[attr-defined]


def _internal_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        if "lanefold.primitives.internal" in names:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


@pytest.mark.parametrize("folder", PLUG_IN_FOLDERS)
def test_plug_in_packages_need_only_the_public_names(folder: str) -> None:
    """A backend, a store, a loop or a reducer is written from `lanefold.primitives`' public
    names alone: what the built-ins need, an extender's package may need too."""
    wrong = sorted(line for path in (ROOT / folder).rglob("*.py") for line in _internal_imports(path))
    assert wrong == []


# -- built-ins register once: by the import of their module, never by an entry point of ours ----

BUILT_INS = {
    "loop": ["adaptive_sample", "debate", "parallel_sample", "plan_verify_replan", "sequential_refine"],
    "reducer": ["any_pass", "field_vote", "judge_argmax", "majority_vote", "usc", "weighted_vote"],
    "backend": ["engine", "openai", "simulated"],
    "store": ["files", "postgres"],
    "executor": ["local", "ray"],
    "hook": ["otel"],
    "scorer": ["bfcl", "exact", "humaneval", "numeric"],
    "verifier": ["command", "schema_valid"],
}
# What the facade imports where it resolves each kind; installed metadata is hidden from it.
BY_IMPORT_ALONE = """
import importlib.metadata as metadata, json
metadata.entry_points = lambda **_: metadata.EntryPoints(())
import lanefold.config, lanefold.evaluate, lanefold.execution
from lanefold.primitives import BACKENDS, EXECUTORS, HOOKS, LOOPS, REDUCERS, STORES, VERIFIERS
from lanefold.evaluate import SCORERS
kinds = (LOOPS, REDUCERS, BACKENDS, STORES, EXECUTORS, HOOKS, SCORERS, VERIFIERS)
print(json.dumps({kind.kind: kind.names() for kind in kinds}))
"""


def test_the_built_ins_register_by_the_import_of_their_modules_alone() -> None:
    """Without any installed entry point, each built-in is known once the facade is imported:
    registered by its own module (a decorator, or a lazy import where its module is heavy).
    On main the `otel` hook was known only through the package's entry point."""
    done = subprocess.run(
        [sys.executable, "-c", BY_IMPORT_ALONE], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == BUILT_INS


def test_no_entry_point_of_ours_registers_a_built_in_again() -> None:
    """One way per built-in: the imports above. An entry point in our own pyproject.toml would
    register each a second time (on main, every loop, reducer, backend, store and executor)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    ours = {
        group: names
        for group, names in project.get("entry-points", {}).items()
        if group.startswith("lanefold.")
    }
    assert ours == {}
