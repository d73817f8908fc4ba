"""The facade's side of the run store: which store a command opens, and reading a run from any
store, every line checked (`fold_record`). The stores themselves are `lanefold.stores`: files on
disk (`./runs/<run_id>/events.jsonl`) by default, else the registered store serving the scheme
of `[store] url` or `--store` (`postgresql://`: PostgreSQL).

Every command reaches a run through the `Store` seam, never a path, so every store keeps one
contract: one writer per run, sequence strictly increasing, the same refusals on read.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import lanefold.stores  # noqa: F401  (the built-in stores register themselves)
from lanefold.config import DEFAULT_STORE, LoopConfig, recorded_config
from lanefold.primitives import (
    STORES,
    AnyEvent,
    AuditFinding,
    ConfigError,
    LogCorruptError,
    Pricing,
    RunNotFoundError,
    RunResult,
    RunState,
    Store,
    fold,
    loop_reducer,
    new_run_id,
    resolve_reducer,
)
from lanefold.primitives.internal import (
    ReplaySettings,
    audit_run,
    plugin_folders,
    store_for_url,
    without_plugin_imports,
)

__all__ = (
    "Store",
    "fold_readable",
    "fold_record",
    "new_run_id",
    "open_store",
    "read_run",
    "read_state",
    "run_record",
)


def open_store(url: str | None, runs_dir: str | Path = "runs", password_env: str | None = None) -> Store:
    """The store a command or Session writes to: the registered store serving `url`'s scheme
    (`postgresql://`; its password from the environment variable `password_env`, if named),
    else the default store (files under `runs_dir`). An unknown scheme is a ConfigError
    naming `store.url`."""
    cls = STORES.resolve(DEFAULT_STORE) if url is None else store_for_url(url)
    store: Store = cls.from_url(url, runs_dir=runs_dir, password_env=password_env)
    return store


def fold_record(events: list[AnyEvent], source: str, run_id: str) -> tuple[RunState, LoopConfig]:
    """A run's state and recorded config from its events, every claim checked.

    Refuses (LogCorruptError, exit 2) a line that is not the run's own or a claim that does
    not follow from the log (an answer, a bill, the reducer, the reduce, the result), naming
    the first such line, and (ConfigError) a recorded config this version cannot validate.
    The config comes from `run.started`, so the log is folded once, at the config's prices
    and with the reducer it names.
    """
    head = fold(events[:1], source=source, run_id=run_id)
    if head.started is None:
        raise ConfigError(f"{source}: the log has no run.started event")
    config = recorded_config(head, source)
    reducer = _configured_reducer(config)
    try:
        state = fold(events, config.pricing, source=source, run_id=run_id, reducer=reducer)
    except LogCorruptError as refused:
        # A claim the loop's audit refuses on an earlier line is the first wrong line (an
        # edited answer, say, that the result repeats further down).
        before = fold(
            events[: refused.line - 1], config.pricing, source=source, run_id=run_id, reducer=reducer
        )
        wrong = _audit(before, config)
        if wrong is not None and wrong[0] < refused.line:
            raise LogCorruptError(source, *wrong) from None
        raise
    wrong = _audit(state, config)
    if wrong is not None:
        raise LogCorruptError(source, *wrong)
    return state, config


def _configured_reducer(config: LoopConfig) -> str | None:
    """The reducer the config's loop names for its own reduce, by the name `reduce.completed`
    records (a `module:Class` records its class's name); "" for a loop that answers without
    one; None where the loop picks its reducers itself."""
    with plugin_folders(config.folder):
        choice = loop_reducer(config.loop_class(), config.loop_params)
        if choice is None or ":" not in choice.name:
            return None if choice is None else choice.name
        return str(resolve_reducer(choice.name).name)


def _audit(state: RunState, config: LoopConfig) -> AuditFinding | None:
    """What only the run's config and loop know (`audit_run`): its own reduce re-run over the
    lanes its loop reduced, and the loop's audit of its answers and its own records."""
    settings = ReplaySettings(
        extract=config.extract,
        seed=config.loop.seed,
        sampling=config.sampling_params(),
        judge=config.judge_settings(),
        verifier=config.judge.verifier is not None or config.judge.verifier_command is not None,
        template=config.prompt.template,
    )
    with plugin_folders(config.folder):  # a `module:Class` reducer beside the run's config
        return audit_run(config.loop_class(), config.loop_params, state, settings)


def fold_readable(events: list[AnyEvent], source: str, run_id: str) -> tuple[RunState, LoopConfig | None]:
    """`fold_record` for a reader (`tail`, `show`), which imports no plug-in: where the
    recorded config names a `module:attr` not imported here, the events are folded at the
    recorded prices, every line still checked as the run's own, and the config is None."""
    with without_plugin_imports() as skipped:
        try:
            return fold_record(events, source, run_id)
        except ConfigError:
            if not skipped:
                raise
    started = fold(events[:1], source=source, run_id=run_id).started
    assert started is not None  # fold_record refused a log without one
    try:
        pricing = Pricing.model_validate(started.config.get("pricing", {}))
    except ValidationError as exc:
        raise ConfigError(f"{source}:1: recorded config: pricing: {exc.errors()[0]['msg']}") from None
    return fold(events, pricing, source=source, run_id=run_id), None


def read_run(store: Store, run_id: str) -> tuple[list[AnyEvent], RunState, LoopConfig | None]:
    """A run's events, its state and the config it recorded (`fold_readable`): no lock, no
    plug-in imported. RunNotFoundError where the store has no such run."""
    if not store.exists(run_id):
        raise RunNotFoundError(f"{store.location(run_id)}: no run {run_id!r} in {store.describe}")
    events = list(store.reader(run_id).read())
    return (events, *fold_readable(events, store.location(run_id), run_id))


def read_state(store: Store, run_id: str) -> RunState:
    """`read_run`'s state alone."""
    return read_run(store, run_id)[1]


def resume_command(run_id: str, where: Sequence[str] = ()) -> str:
    """The command that continues `run_id`, as it can be pasted (`where`: the flags that find
    its store, `--runs-dir DIR` or `--store URL` with no password): what the CLI prints for an
    interrupted run and the view shows for an interrupted or stopped one."""
    return shlex.join(["orchestrator", "resume", run_id, *where])


def run_record(store: Store, run_id: str, state: RunState | None = None) -> dict[str, Any]:
    """What `show --json` prints of a run: a finished run's result with its reductions, else
    where it stands (interrupted, failed, unfinished) and what it has done so far; and the
    backend it ran on (`backend_record`). Read through `read_state` (every line checked),
    unless `state` is what `read_state` gave."""
    state = state if state is not None else read_state(store, run_id)
    reductions = [data.model_dump(mode="json") for _, data in sorted(state.reductions.items())]
    asked = _asked(state)
    if state.result is not None:
        result = RunResult.model_validate(state.result)
        return {
            **result.model_dump(mode="json"),
            "reductions": reductions,
            "backend": backend_record(state),
            **asked,
        }
    status = "failed" if state.failure else "interrupted" if state.interrupted else "unfinished"
    return {
        "run_id": state.run_id,
        "status": status,
        "error": state.failure.message if state.failure else None,
        "lanes_completed": sum(len(w.completed()) for w in state.waves.values()),
        "lanes_failed": sum(len(w.failed()) for w in state.waves.values()),
        "lanes_in_flight": len(state.in_flight()),
        "lanes_interrupted": sum(
            1 for w in state.waves.values() for s in w.lanes.values() if s.status == "interrupted"
        ),
        "events": store.location(run_id),
        "reductions": reductions,
        "backend": backend_record(state),
        **asked,
    }


def _asked(state: RunState) -> dict[str, Any]:
    """Who asked for a gateway's run and what for (`asked`: the model name the client asked
    for, the key's name, the request's id); nothing for a run nobody asked for so."""
    started = state.started
    if started is None:
        return {}
    found = {"model": started.model, "caller": started.caller, "request_id": started.request_id}
    found = {name: value for name, value in found.items() if value is not None}
    return {"asked": found} if found else {}


def backend_record(state: RunState) -> dict[str, Any]:
    """The backend a run ran on, as its log tells it: the name `run.started` gives, and each
    note its lanes' `lane.completed` carried as a mapping among their backend figures (the
    engine's `decode_paths`: which kernels its steps took) once per distinct value, in the order
    the lanes landed. Per-lane figures (token counts and the like) stay in the lanes' events."""
    lanes = sorted(
        (s for w in state.waves.values() for s in w.lanes.values() if s.backend),
        key=lambda s: s.landed_at or 0,
    )
    notes: dict[str, list[Any]] = {}
    for lane in lanes:
        for key, value in (lane.backend or {}).items():
            seen = notes.setdefault(key, []) if isinstance(value, dict) else None
            if seen is not None and value not in seen:
                seen.append(value)
    return {"name": state.started.backend if state.started else None, **notes}
