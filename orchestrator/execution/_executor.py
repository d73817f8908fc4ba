"""Where a Session's questions run: in this process (the default) or on a pool of workers.

    executor = orchestrator.RayExecutor(workers=4)           # or address="auto" to join one
    async with orchestrator.Session(config, executor=executor) as session:
        async for result in session.run_many(questions):
            ...

An executor takes jobs (a question, its run id, its seed) and gives back outcomes (the run's
result or its error) in completion order. A worker builds one Session from the driver's
config, by value, on the same store, and runs each job through the same governed path; a job
whose run already has a log resumes it, so a job handed again after its worker died keeps the
lanes that worker completed. The default, `executor=None` ("local"), is the Session's own
in-process path, untouched.

Executors are a registry kind (`EXECUTORS`, `@register_executor("name")`, entry points
`lanefold.executors`): a name resolves to an Executor or to what makes one from its options;
"local" makes None (this process), "ray" is `RayExecutor`, and `module:attr` names your own.
"""

from __future__ import annotations

import inspect
import logging
import pickle
import sys
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lanefold.config import DEFAULT_EXECUTOR, LoopConfig, parse_config
from lanefold.execution._store import Store, read_state
from lanefold.primitives import (
    EXECUTORS,
    ConfigError,
    Hook,
    LanefoldError,
    RunResult,
    StoreError,
    ToolSpec,
    register_executor,
)

log = logging.getLogger("lanefold.executor")

__all__ = (
    "Executor",
    "Job",
    "JobOutcome",
    "WorkerSpec",
    "distribute",
    "import_paths",
    "local",
    "portable_hooks",
    "resolve_executor",
)


@dataclass(frozen=True, slots=True)
class Job:
    """One question for a worker: question `index` of a batch, run as `run_id`; `seed` is the
    loop seed of its run (None: the config's own); `tools` the run's (an eval item's own)."""

    index: int
    question: str
    run_id: str
    seed: int | None = None
    tools: tuple[ToolSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A job's result, or the LanefoldError its run ended with (a failed run is an outcome)."""

    job: Job
    result: RunResult | None = None
    error: LanefoldError | None = None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker needs to build its Session, by value: no path it may not have."""

    config: dict[str, Any]  # the LoopConfig as JSON
    source: str  # the config's path on the driver ("<config>" when given as an object)
    store: Store  # files under an absolute path (this machine, a shared filesystem), or
    # PostgreSQL (any machine); it travels by pickle, a PgStore with its password
    verifier: Any = None  # the Session's verifier (it travels by pickle)
    hooks: bytes = b""  # the Session's own hooks, pickled: read once the paths are in place
    paths: tuple[str, ...] = field(default=())  # import paths for `module:...` plug-ins
    folder: str | None = None  # the config's folder on the driver (LoopConfig.folder)

    def loop_config(self) -> LoopConfig:
        return parse_config(self.config, source=f"{self.source} (sent to a worker)", folder=self.folder)

    def worker_hooks(self) -> list[Hook]:
        """The driver's hooks, as this worker's own copies (after `import_paths`, so a hook's
        module beside the config is found)."""
        return list(pickle.loads(self.hooks)) if self.hooks else []


def portable_hooks(hooks: Sequence[Hook]) -> bytes:
    """`hooks` pickled for workers; a hook that does not pickle (a lambda, a closure) stays
    on the driver, said once in the log: a hook never fails a run."""
    kept = []
    for hook in hooks:
        try:
            pickle.dumps(hook)
        except Exception as exc:  # pickling raises what the object's reducer raises
            log.warning("hook %r cannot be sent to workers (%s): it sees no worker's events", hook, exc)
            continue
        kept.append(hook)
    return pickle.dumps(tuple(kept)) if kept else b""


@runtime_checkable
class Executor(Protocol):
    """Runs jobs somewhere; yields each job's outcome in completion order."""

    name: str

    def outcomes(
        self, spec: WorkerSpec, jobs: Sequence[Job], concurrency: int
    ) -> AsyncGenerator[JobOutcome, None]:
        """Every job's outcome, each exactly once, up to `concurrency` jobs in flight on each
        worker. A worker lost mid-job is replaced and its jobs handed out again (as resumes)."""
        ...


@register_executor("local")
def local() -> None:
    """This process: the Session's own in-process path (no executor)."""
    return None


# Ray's module imports the Session (its workers hold one), which imports this module: the
# name is registered here, the class imported on its first lookup.
EXECUTORS.add_lazy("ray", "lanefold.execution._ray_executor:RayExecutor")


def resolve_executor(
    executor: Executor | str | None,
    *,
    key: str = "executor",
    options: dict[str, tuple[str, Any]] | None = None,
) -> Executor | None:
    """The executor `executor` names (None: the default, this process): a registered name
    or `module:attr`, made with `options` (keyword -> (the flag or key that gave it, its
    value)), or an Executor itself. None is the in-process path. An unknown name, or an
    option the executor does not take, is a one-line ConfigError naming `key` or the flag."""
    if not isinstance(executor, str | None):
        if not isinstance(executor, Executor):
            raise ConfigError(f"{key}: {type(executor).__name__} has no outcomes() method")
        return executor
    name = DEFAULT_EXECUTOR if executor is None else executor
    found: Any = EXECUTORS.resolve(name, key=key)
    given = options or {}
    if isinstance(found, Executor) and not isinstance(found, type):  # an executor itself
        made: Any = found
        if given:
            flag = next(iter(given.values()))[0]
            raise ConfigError(f"{flag}: executor {name!r} takes no options")
    else:
        for keyword, (flag, _) in given.items():
            if not _takes(found, keyword):
                takers = [n for n in EXECUTORS.names() if _takes(EXECUTORS.get(n), keyword)]
                where = " or ".join(f"{key} {n}" for n in takers) or "another executor"
                raise ConfigError(f"{flag}: only with {where}")
        made = found(**{keyword: value for keyword, (_, value) in given.items()})
    if made is not None and not isinstance(made, Executor):
        raise ConfigError(
            f"{key}: {name!r} made a {type(made).__name__}, not an Executor (no outcomes() method)"
        )
    return made


def _takes(maker: Any, keyword: str) -> bool:
    """Whether `maker` (an executor's class or function) takes the keyword option."""
    try:
        parameters = inspect.signature(maker).parameters
    except (TypeError, ValueError):
        return False
    return keyword in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


async def distribute(
    executor: Executor,
    spec: WorkerSpec,
    questions: Sequence[str],
    *,
    store: Store,
    failed: Callable[[str, str, LanefoldError], RunResult],
    concurrency: int,
    run_ids: Sequence[str] | None,
    resume: bool = False,
    errors: str = "raise",
) -> AsyncGenerator[RunResult, None]:
    """`Session.run_many` on an executor, its workers built from `spec` on `store`: run
    ids are chosen here, so a job handed again resumes the same run. Without `resume` an id
    the store holds already is refused before any job goes out; with `errors="return"` a
    failed run is the result `failed(run_id, question, error)` makes, else it raises."""
    ids = list(run_ids) if run_ids is not None else [store.new_id() for _ in questions]
    jobs = [
        Job(index, question, store.check_id(run_id))
        for index, (question, run_id) in enumerate(zip(questions, ids, strict=True))
    ]
    if len(set(ids)) != len(ids):
        raise ConfigError("run_ids: two questions share a run id")
    if run_ids is not None:
        for job in jobs:
            if store.exists(job.run_id):
                if not resume:
                    raise ConfigError(
                        f"{store.location(job.run_id)}: a run with this "
                        f"id already exists (resume=True continues it)"
                    )
                started = read_state(store, job.run_id).started
                if started is not None and started.question != job.question:
                    raise ConfigError(
                        f"run_id {job.run_id!r}: the store holds a run of another question; choose another id"
                    )
    outcomes = executor.outcomes(spec, jobs, concurrency)
    try:
        async for outcome in outcomes:
            if outcome.error is not None:
                if errors == "raise" or type(outcome.error) in (ConfigError, StoreError):
                    raise outcome.error
                result = failed(outcome.job.run_id, outcome.job.question, outcome.error)
            else:
                assert outcome.result is not None
                result = outcome.result
            yield result.model_copy(update={"index": outcome.job.index})
    finally:
        await outcomes.aclose()


def import_paths(paths: Sequence[str]) -> None:
    """Put the driver's plug-in folders on this worker's path (same machine or shared disk)."""
    for path in reversed(paths):
        if path not in sys.path and Path(path).is_dir():
            sys.path.insert(0, path)
