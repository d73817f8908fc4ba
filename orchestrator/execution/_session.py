"""The Session: many runs on backends built (and models loaded) once.

    async with orchestrator.Session(config) as session:
        result = await session.run("What is 17 * 23?")
        async for result in session.run_many(questions, concurrency=8):
            ...

A Session closes what it built and never what it was given. Runs in flight at once share its
backends (on the engine their lanes decode in the same batches) and its limiter.
`orchestrator.run`, `resume` and the CLI are a Session of one run.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

import anyio
import sniffio

from lanefold.config import VERSION, LoopConfig, config_hash, load_config, preflight
from lanefold.coordinators import CommandVerifier, as_verifier
from lanefold.execution._executor import Executor, WorkerSpec, distribute, portable_hooks, resolve_executor
from lanefold.execution._fleet_budget import (
    StandingPools,
    budget_store,
    close_pools,
    open_pools,
    recorded_pools,
    refuse_if_spent,
    run_pools,
)
from lanefold.execution._held_log import HeldLog
from lanefold.execution._reduce import reduce_run
from lanefold.execution._runner import (
    Observer,
    build_backend,
    check_calls,
    check_question,
    close,
    drive,
    lanefold_error,
    load,
    question_of,
    recorded_failure,
    run_tools,
    set_fsync,
    source_of,
)
from lanefold.execution._store import Store, fold_record, open_store, read_state
from lanefold.primitives import (
    Backend,
    ChatMessage,
    ConfigError,
    EventLog,
    ExtractSpec,
    Hook,
    LanefoldError,
    Ledger,
    RunResult,
    RunState,
    StoreError,
    ToolSpec,
    Verifier,
)
from lanefold.primitives.events import (
    RunResumed,
    RunResumedData,
    RunStarted,
    RunStartedData,
    recorded_turn,
    turn_message,
)
from lanefold.primitives.internal import HookRunner, Recorder, check_sendable, failed_result, plugin_folders

__all__ = ("Session", "resume", "resume_sync", "run", "run_sync")

T = TypeVar("T")
P = ParamSpec("P")
Errors = Literal["raise", "return"]
VerifierLike = Verifier | Callable[..., Any] | str | Sequence[str]


@dataclass(frozen=True, slots=True)
class _Origin:
    """What a run is started with beyond its question (see `Session.run`)."""

    config: LoopConfig | None = None
    conversation: tuple[ChatMessage, ...] | None = None
    caller: str | None = None
    request_sha256: str | None = None
    pools: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str | None = None
    turns_after: tuple[ChatMessage, ...] = ()
    model: str | None = None
    request_id: str | None = None
    trace_context: dict[str, str] | None = None


class Session:
    """Runs questions through one config's loop on backends it builds once.

    `config` is a LoopConfig or a path to one (default: the embedded defaults). `backend`,
    `judge_backend` and `limiter` replace what the config would build and are never closed
    here; `verifier` (a callable, `module:function`, a command argv or a Verifier) replaces the
    config's. A run resumed here whose recorded backend differs from the session's gets one
    built for it, kept (for later runs of that backend) until the session closes. With an
    `executor` ("ray" or a RayExecutor) `run_many` sends its questions to workers, each holding
    a Session of this config on this store; `run` and `resume` still run here. `store` (a
    `postgresql://` URL or a Store) is where runs are recorded; None: the config's `[store]
    url` if it has one, else files under `runs_dir`. `hooks` watch every run, resume and
    reduction of this session (beside the `[[hooks]]` of the run's config; see docs/hooks.md);
    they stay on this machine (an executor's workers build only the config's).
    `standing_pools`: the runs of this session share one segment of each named budget they
    spend from, opened at the first run that needs it and closed with the session (what a
    server wants: docs/budget.md), instead of a segment each.
    """

    def __init__(
        self,
        config: LoopConfig | str | Path | None = None,
        *,
        backend: Backend | None = None,
        judge_backend: Backend | None = None,
        limiter: anyio.CapacityLimiter | None = None,
        runs_dir: str | Path = "runs",
        verifier: VerifierLike | None = None,
        executor: Executor | str | None = None,
        store: str | Store | None = None,
        hooks: Sequence[Hook] = (),
        standing_pools: bool = False,
    ) -> None:
        self.source = "<config>"
        self.hooks = list(hooks)
        if config is not None and not isinstance(config, LoopConfig):
            self.source, config = str(config), load_config(config)
        self._config = config
        self.store = _store_of(store, config, runs_dir)
        self.limiter = limiter
        self._given = (backend, judge_backend)
        self._verifier = verifier  # made a Verifier with each config's timeout, when used
        self._built: dict[str, Backend] = {}  # backend config JSON -> what this session built
        # What is worked out once for a config object a server or an eval gives run after run
        # (frozen: the same object says the same): preflighted configs, backend sections' keys.
        self._seen: _Seen = _Seen()
        self._loaded: set[int] = set()
        self._lock = anyio.Lock()
        self.executor = resolve_executor(executor)  # None: run_many runs here
        # A server's runs share one segment of each budget (see `StandingPools`).
        self.standing = StandingPools() if standing_pools else None
        if config is not None:
            preflight(config, self.source, verifier_given=verifier is not None)

    @property
    def config(self) -> LoopConfig:
        """The config new runs use (the embedded defaults when none was given)."""
        if self._config is None:
            self._config = LoopConfig()
        return self._config

    async def __aenter__(self) -> Session:
        if self._config is not None and self.executor is None:  # the model loads now
            await self.backends_for(self._config)
        await self._load_given()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the standing segments of budgets, if any, and the backends this session built
        (never the ones it was given)."""
        if self.standing is not None:
            await self.standing.aclose()
        built, self._built = list(self._built.values()), {}
        await close(built)

    # -- backends ---------------------------------------------------------------------------------

    async def backends_for(self, config: LoopConfig) -> tuple[Backend, Backend | None]:
        given, given_judge = self._given
        backend = given or await self._build(config.backend)
        judge = given_judge
        if judge is None and config.judge.backend is not None:
            judge = await self._build(config.judge.backend)
        return backend, judge

    async def _build(self, section: Any) -> Backend:
        key = self._seen.get(section, "key")
        if key is None:
            key = self._seen.put(section, "key", section.model_dump_json())
        async with self._lock:  # two runs starting at once build (and load) one backend
            backend = self._built.get(key)
            if backend is None:
                backend = self._built[key] = build_backend(section)
            if id(backend) not in self._loaded:
                await load(backend)  # model loading is not sampling time (max_seconds)
                self._loaded.add(id(backend))
        return backend

    async def _load_given(self) -> None:
        for backend in self._given:
            if backend is not None and id(backend) not in self._loaded:
                await load(backend)
                self._loaded.add(id(backend))

    def verifier_for(self, config: LoopConfig) -> Verifier | None:
        """The session's verifier, else the one the config names."""
        judge = config.judge
        given = self._verifier if self._verifier is not None else judge.verifier
        if given is not None:
            with plugin_folders(config.folder):  # `module:function` beside the config first
                return as_verifier(
                    given, timeout_s=judge.verifier_timeout_s, max_concurrency=config.loop.max_concurrency
                )
        if judge.verifier_command is not None:
            return CommandVerifier(
                judge.verifier_command,
                timeout_s=judge.verifier_timeout_s,
                max_concurrency=config.loop.max_concurrency,
            )
        return None

    # -- runs -------------------------------------------------------------------------------------

    async def run(
        self,
        question: str,
        *,
        run_id: str | None = None,
        resume: bool = False,
        seed: int | None = None,
        errors: Errors = "raise",
        observer: Observer | None = None,
        log: EventLog | None = None,
        stop_reason: Callable[[], str] = lambda: "cancelled",
        config: LoopConfig | None = None,
        conversation: Sequence[tuple[str, str] | ChatMessage] | None = None,
        caller: str | None = None,
        request_sha256: str | None = None,
        pools: Sequence[str] = (),
        tools: Sequence[Mapping[str, Any] | ToolSpec] | None = None,
        tool_choice: str | None = None,
        turns_after: Sequence[ChatMessage] = (),
        model: str | None = None,
        request_id: str | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run the loop on one question; its log lands in the store (by default
        `runs_dir/<run_id>/events.jsonl`). `seed` is this run's loop seed (default: the
        config's `loop.seed`), recorded with its config like any other key.

        `config` runs this question under another config than the session's (its backends
        built once too, and shared with every config naming the same). `conversation` makes
        the run a chat's: its turns before the question, (role, content) each or a
        `ChatMessage` (an assistant's `tool_calls`, a tool's result; empty: none), which every
        sampled lane sends ahead of its prompt, the prompt as the user's turn,
        through the backend's chat template (a config whose `[prompt] form` is "raw" refuses
        turns, ConfigError, before anything is recorded). `caller` and `request_sha256` are
        recorded with the run (who asked, and a digest of what they sent), and so are `model` and
        `request_id` (the model name they asked for and their request's id: `list --model/--caller`
        filter on them). `pools` names budgets
        in the store this run spends from as well as its own limits and its config's `[budget]
        shared` (a gateway key's `key:<name>`): they are recorded in its `run.started` and every
        later segment (resume, a retry, a re-reduction) spends from them too. A run none of them
        could fund is refused (BudgetExhaustedError) without being recorded, and the refusal is
        counted on the budget that refused. `tools` (OpenAI's `tools` list, bare functions or
        `ToolSpec`s) and `tool_choice` ("auto", "required", "none" or a tool's name) are the
        run's: recorded in its `run.started`, sent with every sampled lane, and what an
        `[extract] method = "tool_call"` answer calls (that method needs them). A turn of
        `conversation` may be a `ChatMessage` with an assistant's `tool_calls` or a tool's
        result; `turns_after` are a chat's turns after its question (an agent's calls and their
        results since the user asked), sent after the prompt in every sampled lane.
        `trace_context` is the W3C trace context the run continues (`traceparent` and
        `tracestate` header text, as a gateway client sent them): recorded in `run.started`, and
        the `otel` hook makes the run's spans children of that span (docs/otel.md).

        With `resume=True` a `run_id` the store already holds is resumed instead (a finished
        run returns its recorded result, sampling nothing); it must hold this question. With
        `errors="return"` a run that fails comes back as a result with `status="failed"` and
        its `error`, instead of raising (misuse of the call still raises). Cancelling the
        call records the run as interrupted (resumable) and re-raises.
        """
        check_question(question)
        _check_errors(errors)
        given = run_tools(tools, tool_choice)
        run_id = self.store.check_id(run_id) if run_id is not None else self.store.new_id()
        try:
            if resume and log is None and self.store.exists(run_id):
                return await self._go_on(run_id, question, observer, stop_reason, trace_context)
            started = _Origin(
                config,
                None if conversation is None else tuple(map(turn_message, conversation)),
                caller,
                request_sha256,
                tuple(pools),
                given,
                tool_choice,
                tuple(turns_after),
                model,
                request_id,
                dict(trace_context) if trace_context else None,
            )
            return await self._start(question, run_id, observer, log, stop_reason, seed, started)
        except LanefoldError as exc:
            if errors == "raise" or type(exc) in (ConfigError, StoreError):  # every run's, not this one's
                raise
            return self._failed(run_id, question, exc)

    async def _start(
        self,
        question: str,
        run_id: str,
        observer: Observer | None,
        log: EventLog | None,
        stop_reason: Callable[[], str],
        seed: int | None = None,
        origin: _Origin | None = None,
    ) -> RunResult:
        origin = origin or _Origin()
        if origin.config is not None and self._seen.get(origin.config, "preflight") is None:
            preflight(origin.config, "config", verifier_given=self._verifier is not None)
            self._seen.put(origin.config, "preflight", True)
        config = (origin.config or self.config).with_seed(seed)
        # refused before any record
        check_sendable(config.prompt_form(), (*(origin.conversation or ()), *origin.turns_after))
        check_calls(config.extract, origin.tools)
        backend, judge_backend = await self.backends_for(config)
        await self._load_given()
        names = run_pools(config, origin.pools)
        # A budget that does not exist, or one already spent, is refused before the run exists.
        pool = await open_pools(self.store, names, run_id, standing=self.standing)
        held: HeldLog | None = None
        try:
            await refuse_if_spent(self.store, pool, "the run was not started")
            runner = self.hook_runner(config, run_id)
            if pool is not None:  # recorded once its first wave is funded, its log made then
                fsync = config.log.fsync
                if log is None:
                    store = self.store
                    log = held = HeldLog(
                        lambda: store.create_log(run_id, fsync), location=store.location(run_id), fsync=fsync
                    )
                else:
                    log = held = HeldLog.over(log)
            elif log is None:  # a folder, a lock file and a draft on files: never on the loop
                log = await anyio.to_thread.run_sync(self.store.create_log, run_id, config.log.fsync)
            async with runner:
                recorder = Recorder(
                    log, run_id, RunState(pricing=config.pricing), observer=runner.tapping(observer)
                )
                try:  # the run's first line: forced down in a worker thread
                    await recorder.emit_first(
                        RunStarted,
                        RunStartedData(
                            config=config.recorded(),
                            config_hash=config_hash(config),
                            question=question,
                            coordinator=config.loop.coordinator,
                            backend=backend.name,
                            library_version=VERSION,
                            config_dir=config.folder or self._config_dir(),
                            conversation=None
                            if origin.conversation is None
                            else [recorded_turn(m) for m in origin.conversation],
                            turns_after=[recorded_turn(m) for m in origin.turns_after] or None,
                            caller=origin.caller,
                            request_sha256=origin.request_sha256,
                            model=origin.model,
                            request_id=origin.request_id,
                            pools=list(names) or None,
                            tools=[tool.to_openai() for tool in origin.tools] or None,
                            tool_choice=origin.tool_choice,
                            trace_context=origin.trace_context,
                        ),
                    )
                except BaseException:
                    log.close()
                    raise
                ledger = Ledger(limits=config.budget, pricing=config.pricing, shared=pool)
                result = await drive(
                    config,
                    question,
                    recorder,
                    ledger,
                    backend,
                    judge_backend,
                    limiter=self.limiter,
                    verifier=self.verifier_for(config),
                    stop_reason=stop_reason,
                )
                await runner.end(result)
                return result
        finally:
            await close_pools(pool)
            if held is not None and held.refused_by is not None:  # not a run: a refusal
                await anyio.to_thread.run_sync(budget_store(self.store).note_refusal, held.refused_by)

    async def _go_on(
        self,
        run_id: str,
        question: str,
        observer: Observer | None,
        stop_reason: Callable[[], str],
        trace_context: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Resume `run_id`, which must be a run of `question` (an id reused for another
        question is a mistake to name, not a run to continue)."""
        recorded = read_state(self.store, run_id)
        if recorded.started is not None and recorded.started.question != question:
            raise ConfigError(
                f"run_id {run_id!r}: the store holds a run of another question "
                f"({_clip(recorded.started.question)}); choose another id"
            )
        return await self.resume(
            run_id, observer=observer, stop_reason=stop_reason, trace_context=trace_context
        )

    def worker_spec(self) -> WorkerSpec:
        """What workers need to run this session's questions as it would, by value."""
        given = [
            name
            for name, value in zip(
                ("backend", "judge_backend", "limiter"), (*self._given, self.limiter), strict=True
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"executor: a Session given {', '.join(given)} cannot send it to "
                f"workers; name the backend in the config instead"
            )
        config = self.config
        paths = [str(Path.cwd())]
        if config.folder is not None:
            paths.insert(0, config.folder)
        return WorkerSpec(
            config=config.model_dump(mode="json"),
            source=(self.source if self.source == "<config>" else str(Path(self.source).resolve())),
            store=self.store.portable(),  # files: the same folder, whatever a worker's directory
            verifier=self._verifier,
            hooks=portable_hooks(self.hooks),
            paths=tuple(dict.fromkeys(paths)),
            folder=config.folder,
        )

    def _failed(self, run_id: str, question: str, error: LanefoldError) -> RunResult:
        """`error` as a failed run's result, with what its log (if any) says it spent."""
        state = None
        with contextlib.suppress(LanefoldError, OSError):
            if self.store.exists(run_id):
                state = read_state(self.store, run_id)
        events = self.store.location(run_id) if state is not None else None
        return failed_result(run_id, question, error, state, events)

    def _config_dir(self) -> str:
        """Where the run's `module:attr` plug-ins were looked up first: the config file's
        folder, else the working directory (resume looks there again)."""
        return self.config.folder or str(Path.cwd().resolve())

    async def run_many(
        self,
        questions: Iterable[str],
        *,
        concurrency: int = 8,
        run_ids: Sequence[str] | None = None,
        resume: bool = False,
        errors: Errors = "raise",
    ) -> AsyncGenerator[RunResult, None]:
        """Run every question, up to `concurrency` at once; results in completion order.

        Each result's `index` is its question's position. `resume=True`: an id in `run_ids`
        that the store holds is resumed (a finished run gives its recorded result, sampling
        nothing), so the same call after a crash finishes the batch. `errors="return"`: a run
        that fails is a result with `status="failed"` and the batch goes on; with "raise"
        (the default) the first failure raises here. Either way, the runs still in flight
        when the batch stops early are interrupted (recorded, resumable).
        """
        if concurrency < 1:
            raise ConfigError(f"concurrency: must be at least 1, got {concurrency}")
        _check_errors(errors)
        todo = list(enumerate(questions))
        if run_ids is not None and len(run_ids) != len(todo):
            raise ConfigError(f"run_ids: {len(run_ids)} ids for {len(todo)} questions")
        if run_ids is not None and len(set(run_ids)) != len(run_ids):
            raise ConfigError("run_ids: two questions share a run id")
        for _, question in todo:
            check_question(question)
        if self.executor is not None:  # each worker holds its own Session and backend
            async with contextlib.aclosing(
                distribute(
                    self.executor,
                    self.worker_spec(),
                    [q for _, q in todo],
                    store=self.store,
                    failed=self._failed,
                    concurrency=concurrency,
                    run_ids=run_ids,
                    resume=resume,
                    errors=errors,
                )
            ) as remote:
                async for result in remote:
                    yield result
            return
        send, receive = anyio.create_memory_object_stream[RunResult](concurrency)
        queue = iter(todo)
        stopped = False

        async def worker() -> None:
            for index, question in queue:  # shared: each question taken by one worker
                result = await self.run(
                    question, run_id=run_ids[index] if run_ids else None, resume=resume, errors=errors
                )
                await send.send(result.model_copy(update={"index": index}))

        async def produce() -> None:
            async with send:
                async with anyio.create_task_group() as workers:
                    for _ in range(min(concurrency, len(todo))):
                        workers.start_soon(worker)

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                async with receive:
                    async for result in receive:
                        try:
                            yield result
                        except GeneratorExit:  # the caller stopped early (break, aclose)
                            stopped = True
                            tg.cancel_scope.cancel()  # runs in flight record their interrupt
                            break
        except BaseExceptionGroup as group:
            if stopped or not group.subgroup(Exception):
                raise
            raise lanefold_error(group) from None

    async def resume(
        self,
        run_id: str,
        *,
        observer: Observer | None = None,
        log: EventLog | None = None,
        stop_reason: Callable[[], str] = lambda: "cancelled",
        trace_context: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Continue a run from its log. A finished run returns its recorded result.

        Completed lanes are kept; lanes in flight at a crash are charged their hold and, with
        the lanes an interrupt cut off, dispatched again. Another process writing the run
        raises RunInUseError before anything is touched. The rest of the run spends from the
        budgets its `run.started` names (`pools`); one of them spent refuses the resume
        (BudgetExhaustedError) before anything is recorded, and one the store does not keep
        is a ConfigError. `trace_context` (W3C header text, as `run`'s) is the trace this
        segment continues; without it, the one `run.started` recorded, if any.
        """
        if log is None:
            # A finished run needs no writer (nor a writable disk): its record stands as read.
            peek = read_state(self.store, run_id)
            if peek.result is not None:
                return RunResult.model_validate(peek.result)
            if peek.failure is not None:
                raise recorded_failure(peek)
            log = self.store.open_for_resume(run_id)
        async with contextlib.AsyncExitStack() as hooks:  # the session's and the config's
            pool = None
            try:
                # Read again under the lock: another writer may have moved on since the peek.
                state, config = fold_record(list(log.read()), source_of(log), run_id)
                if state.result is not None:
                    log.close()
                    return RunResult.model_validate(state.result)
                if state.failure is not None:
                    log.close()
                    raise recorded_failure(state)
                set_fsync(log, config)
                backend, judge_backend = await self.backends_for(config)
                await self._load_given()
                names = recorded_pools(state, config)
                pool = await open_pools(
                    self.store, names, state.run_id or run_id, recorded=True, standing=self.standing
                )
                await refuse_if_spent(self.store, pool, f"run {state.run_id or run_id} was not resumed")
                runner = await hooks.enter_async_context(self.hook_runner(config, state.run_id or run_id))
                recorder = Recorder(log, state.run_id or run_id, state, observer=runner.tapping(observer))
                torn = log.torn_tail
                recorder.emit(
                    RunResumed,
                    RunResumedData(
                        resumed_after_sequence=state.last_sequence,
                        in_flight=[(wave, lane.lane) for wave, lane in state.in_flight()],
                        torn_tail_bytes=torn.bytes if torn else 0,
                        torn_tail_line=torn.line if torn else None,
                        active_seconds_before=state.active_seconds(),
                        trace_context=(
                            dict(trace_context)
                            if trace_context
                            else (state.started.trace_context if state.started else None)
                        ),
                    ),
                )
            except BaseException:
                log.close()
                await close_pools(pool)
                raise
            ledger = Ledger(
                limits=config.budget,
                pricing=config.pricing,
                spent=copy.deepcopy(state.spend),
                elapsed_before=state.active_seconds_before,
                shared=pool,
            )
            try:
                result = await drive(
                    config,
                    question_of(state),
                    recorder,
                    ledger,
                    backend,
                    judge_backend,
                    limiter=self.limiter,
                    verifier=self.verifier_for(config),
                    stop_reason=stop_reason,
                )
            finally:
                await close_pools(pool)
            await runner.end(result)
            return result

    async def reduce(
        self,
        run_id: str,
        *,
        reducer: str,
        extract: ExtractSpec | None = None,
        observer: Observer | None = None,
        stop_reason: Callable[[], str] = lambda: "cancelled",
    ) -> RunResult:
        """Reduce a finished run's lanes again with `reducer`, without sampling.

        Appends `reduce.started` and `reduce.completed` (the next reduction number) under
        the run's lock; a judge or usc reducer runs only its own governed wave. Returns the
        result as this reduction gives it (the run's recorded result is left as it was).
        """
        return await reduce_run(
            self, run_id, reducer=reducer, extract=extract, observer=observer, stop_reason=stop_reason
        )

    def hook_runner(self, config: LoopConfig, run_id: str) -> HookRunner:
        """The runner of this session's hooks and the `[[hooks]]` of `config` for one run."""
        return HookRunner([*self.hooks, *config.build_hooks()], run_id)


def _check_errors(errors: str) -> None:
    if errors not in ("raise", "return"):
        raise ConfigError(f"errors: {errors!r} is not 'raise' or 'return'")


def _clip(text: str, width: int = 60) -> str:
    line = " ".join(text.split())
    return repr(line if len(line) <= width else line[: width - 3] + "...")


def _store_of(store: str | Store | None, config: LoopConfig | None, runs_dir: str | Path) -> Store:
    if store is not None and not isinstance(store, str):
        return store
    section = config.store if config is not None else None
    url = store if store is not None else section.url if section is not None else None
    return open_store(url, runs_dir, section.password_env if section is not None else None)


async def run(
    config: LoopConfig | str | Path,
    question: str,
    *,
    runs_dir: str | Path = "runs",
    run_id: str | None = None,
    backend: Backend | None = None,
    judge_backend: Backend | None = None,
    limiter: anyio.CapacityLimiter | None = None,
    observer: Observer | None = None,
    log: EventLog | None = None,
    verifier: VerifierLike | None = None,
    store: str | Store | None = None,
    hooks: Sequence[Hook] = (),
    tools: Sequence[Mapping[str, Any] | ToolSpec] | None = None,
    tool_choice: str | None = None,
) -> RunResult:
    """Run a loop on one question (a Session of one run).

    `backend`, `judge_backend`, `limiter` (shared across runs) and `log` (any EventLog) replace
    what the config would build; what is given is never closed here. `observer` sees every
    event as it is recorded, inline; `hooks` see them through queues and can never fail or
    stall the run (docs/hooks.md). `tools` and `tool_choice` are the run's (`Session.run`).
    Cancelling the call records the run as interrupted (resumable) and re-raises the
    cancellation.
    """
    check_question(question)
    async with Session(
        config,
        backend=backend,
        judge_backend=judge_backend,
        limiter=limiter,
        runs_dir=runs_dir,
        verifier=verifier,
        store=store,
        hooks=hooks,
    ) as session:
        return await session.run(
            question, run_id=run_id, observer=observer, log=log, tools=tools, tool_choice=tool_choice
        )


async def resume(
    run_id: str,
    *,
    runs_dir: str | Path = "runs",
    backend: Backend | None = None,
    judge_backend: Backend | None = None,
    limiter: anyio.CapacityLimiter | None = None,
    observer: Observer | None = None,
    log: EventLog | None = None,
    verifier: VerifierLike | None = None,
    store: str | Store | None = None,
    hooks: Sequence[Hook] = (),
) -> RunResult:
    """Continue a run from its log (a Session of one resume). A finished run returns its
    recorded result, calling nothing; its backends are built from the recorded config."""
    # No config: the session builds what the run's recorded config names, when it needs it.
    async with Session(
        backend=backend,
        judge_backend=judge_backend,
        limiter=limiter,
        runs_dir=runs_dir,
        verifier=verifier,
        store=store,
        hooks=hooks,
    ) as session:
        return await session.resume(run_id, observer=observer, log=log)


def _sync(call: Callable[[], Awaitable[T]]) -> T:
    """Run `call` to the end from synchronous code, even where an event loop already runs in
    this thread (a notebook): then on a fresh loop in a worker thread."""
    try:
        sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return anyio.run(call)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lanefold-sync") as pool:
        return pool.submit(anyio.run, call).result()


def _blocking(call: Callable[P, Awaitable[T]], name: str, doc: str) -> Callable[P, T]:
    """`call` for synchronous code, with its very parameters: one place says them, so a type
    checker holds `run_sync` to what `run` takes."""

    def blocking(*args: P.args, **kwargs: P.kwargs) -> T:
        return _sync(functools.partial(call, *args, **kwargs))

    blocking.__name__ = blocking.__qualname__ = name
    blocking.__doc__ = doc
    blocking.__wrapped__ = call  # type: ignore[attr-defined]  # inspect.signature shows call's
    return blocking


run_sync = _blocking(
    run, "run_sync", "`run` for scripts and notebooks (works inside a running event loop too)."
)
"""`run` for scripts and notebooks (works inside a running event loop too)."""
resume_sync = _blocking(resume, "resume_sync", "`resume` for scripts and notebooks.")
"""`resume` for scripts and notebooks."""


class _Seen:
    """What was worked out for an object, by its identity, for the last `keep` objects (each
    kept alive while remembered, so that its id is not another's)."""

    def __init__(self, keep: int = 512) -> None:
        self.keep = keep
        self._found: dict[tuple[int, str], tuple[object, Any]] = {}

    def get(self, of: object, what: str) -> Any:
        found = self._found.get((id(of), what))
        return found[1] if found is not None and found[0] is of else None

    def put(self, of: object, what: str, value: Any) -> Any:
        if len(self._found) >= self.keep:
            del self._found[next(iter(self._found))]  # the oldest
        self._found[(id(of), what)] = (of, value)
        return value
