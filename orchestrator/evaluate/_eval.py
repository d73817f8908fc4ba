"""Evaluating a loop on a dataset: every question one governed run, all through one Session.

    items = load_dataset("questions.jsonl")
    summary = await run_eval("loop.toml", items, eval_id="gsm-k8", concurrency=8)

Question i is the run `<eval_id>-<i>`, run with the config's seed plus i (a seed-keyed sampler
would otherwise draw the same numbers for every question, which ties the questions' outcomes
together). The Session loads the model once; up to `concurrency` questions are in flight and on
the engine their lanes share batches. The eval is resumable as the runs are: calling it again
with the same id skips questions already recorded, records runs that finished without being
recorded (a crash between the two), resumes interrupted runs and starts the rest. A run that
fails (budget, quorum, backend) is a row with status "failed", not the end of the eval.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shlex
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import anyio

from lanefold.config import VERSION, LoopConfig, config_hash
from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._eval_records import (
    COST_LINES,
    RUN_IDS,
    TOKEN_LINES,
    EvalManifest,
    EvalSummary,
    FittedBudget,
    QuestionResult,
    append_result,
    as_json,
    check_eval_id,
    csv_table,
    read_manifest,
    read_results,
    read_summary,
    summarize,
)
from lanefold.evaluate._item import Item
from lanefold.evaluate._scorer import Score, Scorer
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.execution import (
    Executor,
    Job,
    JobSession,
    RunResult,
    Store,
    check_question,
    lanefold_error,
    new_run_id,
    read_state,
)
from lanefold.primitives import (
    Backend,
    BudgetExhaustedError,
    ConfigError,
    EvalRecord,
    Hook,
    LanefoldError,
    LogCorruptError,
    RunInUseError,
    RunState,
    redact_url,
    validate_run_id,
)
from lanefold.primitives.internal import plugin_folders, stopped_for_budget

__all__ = ("OnResult", "OnStart", "questions_hash", "read_manifest", "resume_hint", "run_eval", "scored_row")

OnStart = Callable[[int, Sequence[QuestionResult]], None]
OnResult = Callable[[QuestionResult], None]


def questions_hash(items: Sequence[Item]) -> str:
    """A digest of the questions, their gold and their tools (items without tools hash as
    they did before items carried any)."""
    digest = hashlib.sha256()
    for item in items:
        tools = [[tool.to_openai() for tool in item.tools]] if item.tools else []
        digest.update(json.dumps([item.index, item.question, item.answer, *tools], sort_keys=True).encode())
    return digest.hexdigest()


def _seed(config: LoopConfig, index: int) -> int:
    """Question `index`'s loop seed: its own, so questions are independent draws."""
    return config.loop.seed + index


async def run_eval(
    config: LoopConfig | str | Path,
    items: Sequence[Item],
    *,
    eval_id: str | None = None,
    runs_dir: str | Path = "runs",
    concurrency: int = 8,
    scorer: Scorer | str | None = None,
    dataset: DatasetSpec | None = None,
    backend: Backend | None = None,
    judge_backend: Backend | None = None,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
    stop_reason: Callable[[], str] = lambda: "cancelled",
    clock: Callable[[], float] = time.monotonic,
    store: str | Store | None = None,
    executor: Executor | str | None = None,
    hooks: Sequence[Hook] = (),
    fitted_to: FittedBudget | None = None,
) -> EvalSummary:
    """Run (or continue) the eval `eval_id` of `config` on `items`; return its summary.

    `scorer` is a Scorer or a `--scorer` spec (None: by the items). `dataset` is what the
    manifest records (so `orchestrator eval --resume` can load the items again). `backend`
    and `judge_backend` replace what the config would build (and are not closed here).
    `on_start(total, rows already recorded)` and `on_result(row)` feed a progress display.
    Everything is checked before the eval's record is created; cancelling the call
    interrupts the runs in flight (recorded, resumable) and re-raises. `store` (a URL or a
    Store; default the config's `[store] url`, else files under `runs_dir`) is where the
    questions' runs are recorded, and the eval's own record beside them (files:
    `runs_dir/<eval_id>/`; PostgreSQL: its eval tables).
    `executor` ("ray" or a RayExecutor) runs the questions on workers, up to `concurrency` on
    each, on the same store; their results are scored and recorded here. `hooks` (beside
    the config's `[[hooks]]`) see every question's run (docs/hooks.md). `fitted_to`, the
    equal budget a compare or sweep fitted `config` to, is recorded in the manifest.
    """
    started = clock()
    if concurrency < 1:
        raise ConfigError(f"--concurrency: must be at least 1, got {concurrency}")
    if not items:
        raise ConfigError("--dataset: no questions to evaluate")
    dataset = dataset or DatasetSpec()
    eval_id = validate_run_id(eval_id) if eval_id is not None else new_run_id()
    indexes = [item.index for item in items]
    if len(set(indexes)) != len(indexes):
        raise ConfigError("--dataset: two items share an index")
    validate_run_id(RUN_IDS.format(eval_id=eval_id, index=max(indexes)))
    for item in items:
        try:
            check_question(item.question)
        except ConfigError as exc:
            raise ConfigError(f"{item.source or f'item {item.index}'}: {exc}") from None
    chosen = scorer if scorer is not None and not isinstance(scorer, str) else None
    if chosen is None:  # a `module:function` scorer is looked up beside the config first
        folder = config.folder if isinstance(config, LoopConfig) else Path(config).parent
        with plugin_folders(folder):
            chosen = resolve_scorer(scorer if isinstance(scorer, str) else None, items)
    else:
        chosen.check(items)
    session = JobSession(
        config,
        runs_dir=runs_dir,
        backend=backend,
        judge_backend=judge_backend,
        verifier=chosen.verifier(items),
        store=store,
        executor=executor,
        hooks=hooks,
    )
    _check_calls(session.config, items)
    record = session.store.eval_record(eval_id)
    if not record.exists():
        check_eval_id(eval_id)  # a new eval; one named otherwise before this rule goes on
    manifest = EvalManifest(
        eval_id=eval_id,
        created=datetime.now(UTC),
        config_path=None if isinstance(config, LoopConfig) else str(config),
        config=session.config.model_dump(mode="json"),
        config_hash=config_hash(session.config),
        dataset=dataset.spec,
        question_field=dataset.question_field,
        answer_field=dataset.answer_field,
        scorer=chosen.name,
        limit=dataset.limit,
        questions=len(items),
        questions_hash=questions_hash(items),
        library_version=VERSION,
        run_ids=RUN_IDS,
        fitted_to=fitted_to,
    )
    if record.is_run():
        raise ConfigError(f"{record.location}: is a run's, not an eval's: choose another --eval-id")
    held = contextlib.ExitStack()
    try:
        held.enter_context(record.hold())  # creates the eval's folder (files): all is checked
    except RunInUseError as exc:
        raise ConfigError(
            f"eval {eval_id} is being run by another process (pid {exc.pid or 'unknown'})"
        ) from None
    with held:
        hint = resume_hint(eval_id, runs_dir, store if store is not None else session.config.store.url)
        manifest = _check_manifest(record, manifest, items, hint)
        eval_ = _Eval(session, chosen, record, manifest, {item.index: item for item in items}, stop_reason)
        await eval_.run(concurrency, on_start, on_result)
        rows = [eval_.rows[index] for index in sorted(eval_.rows)]
        before = 0.0
        with contextlib.suppress(ConfigError):
            ended = read_summary(record)
            before = ended.wall_s if ended is not None else 0.0
        summary = summarize(
            rows,
            eval_id=eval_id,
            config=manifest.config_path or "<config>",
            loop=session.config.loop.coordinator,
            dataset=manifest.dataset,
            scorer=chosen.name,
            wall_s=before + clock() - started,
            results=record.results_location,
        )
        record.write_summary(as_json(summary), table=csv_table(rows))
        return summary


def _check_calls(config: LoopConfig, items: Sequence[Item]) -> None:
    """Questions that carry tools (BFCL's) are answered by a call: a config whose `[extract]`
    reads anything else would score every answer wrong, so it is refused before anything runs."""
    with_tools = next((item for item in items if item.tools), None)
    if with_tools is None:
        return
    method = config.extract.resolved_method
    if method != "tool_call":
        raise ConfigError(
            f"{with_tools.source or f'item {with_tools.index}'}: its question is answered by a call "
            f'of its tools, and the config extracts {method!r}: set [extract] method = "tool_call"'
        )


def resume_hint(eval_id: str, runs_dir: str | Path, store: str | Store | None) -> str:
    """The command that continues the eval, as it can be pasted: its runs folder and store."""
    hint = f"orchestrator eval --resume {eval_id}"
    if Path(runs_dir) != Path("runs"):
        hint += f" --runs-dir {shlex.quote(str(runs_dir))}"
    if store is not None:
        hint += f" --store {redact_url(store) if isinstance(store, str) else store.describe}"
    return hint


def _check_manifest(
    record: EvalRecord, manifest: EvalManifest, items: Sequence[Item], hint: str
) -> EvalManifest:
    """Write the manifest of a new eval; refuse to continue one started otherwise. Returns
    the manifest in force: the recorded one of an eval that goes on, grown to more of the same
    questions (a larger `--limit`) where it is given them."""
    where = record.manifest_location
    recorded_body = record.read_manifest()
    if recorded_body is None:
        record.write_manifest(as_json(manifest))
        return manifest
    try:
        recorded = EvalManifest.model_validate_json(recorded_body)
    except ValueError as exc:
        raise ConfigError(f"{where}: not an eval manifest: {exc}") from None
    refuse = f"continue it with `{hint}` or choose a new --eval-id"
    for key, what in (("config_hash", "another config"), ("scorer", "another scorer")):
        if getattr(recorded, key) != getattr(manifest, key):
            raise ConfigError(f"{where}: eval {manifest.eval_id} was started with {what}; {refuse}")
    if recorded.questions_hash == manifest.questions_hash:
        return recorded
    same_start = questions_hash(items[: recorded.questions]) == recorded.questions_hash
    if same_start and len(items) > recorded.questions:  # --limit grew: the first ones stay
        grown = recorded.model_copy(
            update={
                "questions": len(items),
                "limit": manifest.limit,
                "questions_hash": manifest.questions_hash,
            }
        )
        record.write_manifest(as_json(grown))
        return grown
    shrunk = manifest.limit is not None and manifest.limit < recorded.questions
    if shrunk and manifest.dataset == recorded.dataset != "<items>":
        raise ConfigError(
            f"{where}: eval {manifest.eval_id} has "
            f"{recorded.questions} questions; --limit can grow it, not shrink it"
        )
    raise ConfigError(f"{where}: eval {manifest.eval_id} was started with other questions; {refuse}")


class _Eval:
    """One invocation of an eval: what is recorded, what is left, and the workers."""

    def __init__(
        self,
        session: JobSession,
        scorer: Scorer,
        record: EvalRecord,
        manifest: EvalManifest,
        items: dict[int, Item],
        stop_reason: Callable[[], str],
    ) -> None:
        self.session, self.scorer, self.kept = session, scorer, record
        self.manifest, self.items, self.stop_reason = manifest, items, stop_reason
        self.rows = {index: row for index, row in read_results(record, repair=True).items() if index in items}
        self.on_result: OnResult | None = None

    def run_id(self, item: Item) -> str:
        return self.manifest.run_id(item.index)

    async def run(self, concurrency: int, on_start: OnStart | None, on_result: OnResult | None) -> None:
        if on_start is not None:
            on_start(len(self.items), [self.rows[i] for i in sorted(self.rows)])
        self.on_result = on_result
        todo: list[tuple[Item, bool]] = []  # (item, resume its run)
        for index, item in sorted(self.items.items()):
            if index in self.rows:
                continue
            store = self.session.store
            if not store.exists(self.run_id(item)):
                todo.append((item, False))
                continue
            state = read_state(store, self.run_id(item))  # a finished run: recorded, not run
            if state.result is not None:
                result = RunResult.model_validate(state.result)
                self.record(await self.scored(item, result, state))
            elif state.failure is not None:
                self.record(self.failed(item, f"{state.failure.error}: {state.failure.message}", state))
            else:
                todo.append((item, True))
        if not todo:
            return  # nothing to sample: no model is loaded
        if self.session.executor is not None:
            await self.run_on(self.session.executor, [item for item, _ in todo], concurrency)
            return
        queue = iter(todo)

        async def worker() -> None:
            for item, resume in queue:  # shared: each question taken by one worker
                await self.question(item, resume)

        try:
            async with self.session, anyio.create_task_group() as tg:
                for _ in range(min(concurrency, len(todo))):
                    tg.start_soon(worker)
        except BaseExceptionGroup as group:
            if not group.subgroup(Exception):
                raise
            raise lanefold_error(group) from None

    async def run_on(self, executor: Executor, items: list[Item], concurrency: int) -> None:
        """The questions on the executor's workers; each outcome scored and recorded here."""
        seed = self.session.config.loop.seed
        jobs = [
            Job(item.index, item.question, self.run_id(item), seed + item.index, item.tools) for item in items
        ]
        async with contextlib.aclosing(
            executor.outcomes(self.session.worker_spec(), jobs, concurrency)
        ) as outcomes:
            async for outcome in outcomes:
                item = self.items[outcome.job.index]
                if outcome.error is not None:
                    self.failure(item, outcome.error)
                else:
                    assert outcome.result is not None
                    self.record(await self.scored(item, outcome.result, None))

    async def question(self, item: Item, resume: bool) -> None:
        session, run_id = self.session, self.run_id(item)
        try:
            if resume:
                result = await session.resume(run_id, stop_reason=self.stop_reason)
            else:
                result = await session.run(
                    item.question,
                    run_id=run_id,
                    seed=_seed(session.config, item.index),
                    stop_reason=self.stop_reason,
                    tools=item.tools or None,
                )
        except LanefoldError as exc:
            self.failure(item, exc)
            return
        self.record(await self.scored(item, result, None))

    def failure(self, item: Item, exc: LanefoldError) -> None:
        """A run that failed, as a row. Misuse, a log not the run's own, or a failure of the
        machine (a full disk, a store gone) ends the eval instead: none is the question's, and
        `--resume` goes on from the runs' records."""
        if isinstance(exc, ConfigError | LogCorruptError) or exc.machine_failure:
            raise exc
        state = None
        with contextlib.suppress(LanefoldError, OSError):
            state = read_state(self.session.store, self.run_id(item))
        self.record(
            self.failed(
                item, f"{type(exc).__name__}: {exc}", state, refused=isinstance(exc, BudgetExhaustedError)
            )
        )

    def record(self, row: QuestionResult) -> None:
        append_result(self.kept, row)  # a full disk: LogWriteError, the eval stops
        self.rows[row.index] = row
        if self.on_result is not None:
            self.on_result(row)

    async def scored(self, item: Item, result: RunResult, state: RunState | None) -> QuestionResult:
        budget = self.session.config.budget
        limited = budget.max_tokens is not None or budget.max_cost_usd is not None
        return await scored_row(self.scorer, self.session.store, item, result, state, budgeted=limited)

    def failed(
        self, item: Item, error: str, state: RunState | None, *, refused: bool = False
    ) -> QuestionResult:
        spend = state.spend if state is not None else None
        lanes = 0
        if state is not None:
            lanes = sum(len(w.lanes) for w in state.waves.values() if w.info.bill == "sample")
        tokens = {line: getattr(spend, f"{line}_tokens", 0) if spend else 0 for line in TOKEN_LINES}
        by_line = {line: getattr(spend, _USD[line], 0.0) if spend else 0.0 for line in COST_LINES}
        return QuestionResult(
            index=item.index,
            run_id=self.run_id(item),
            question=item.question,
            answer=None,
            gold=item.answer,
            correct=False,
            score=0.0,
            status="failed",
            lanes=lanes,
            tokens=tokens,
            cost=spend.cost_usd if spend else 0.0,
            cost_by_line=by_line,
            seconds=round(state.active_seconds(), 6) if state is not None else 0.0,
            error=" ".join(error.split()),
            capped=refused or (state is not None and shrunk(state)),
        )


_USD = {
    "prefill": "prefill_usd",
    "cached_prefill": "cached_prefill_usd",
    "decode": "decode_usd",
    "kv_residency": "kv_residency_usd",
    "verifier": "verifier_usd",
    "cut_off": "cut_off_usd",
}


def shrunk(state: RunState) -> bool:
    """Whether the budget shrank one of the run's waves below what its loop asked for."""
    return any(wave.info.k < wave.info.k_requested for wave in state.waves.values())


async def scored_row(
    scorer: Scorer,
    store: Store,
    item: Item,
    result: RunResult,
    state: RunState | None = None,
    *,
    budgeted: bool = False,
) -> QuestionResult:
    """The row of `item` as `result` answered it, scored by `scorer` (its lanes' texts read
    from `store` where the scorer needs them). `budgeted`: the run had a `[budget]` limit,
    so whether it was cut at it is read from its log."""
    capped = stopped_for_budget(result.outcome)
    if budgeted and not capped:
        state = state or read_state(store, result.run_id)
        capped = shrunk(state)
    if scorer.needs_text:
        state = state or read_state(store, result.run_id)
        lanes = [
            (s.answer, s.text)
            for _, w in sorted(state.waves.items())
            if w.info.bill == "sample"
            for s in w.completed()
        ]
    else:
        lanes = [(lane.answer, None) for lane in result.lanes if lane.status == "completed"]
    scores = await _score_all(
        scorer, item, [*lanes, (result.answer, result.winner_text)], answered=result.status == "answered"
    )
    final, lane_scores = scores[-1], scores[:-1]
    usage, cost = result.usage, result.cost
    return QuestionResult(
        index=item.index,
        run_id=result.run_id,
        question=item.question,
        answer=result.answer,
        gold=item.answer,
        correct=final.correct,
        score=final.value,
        status=result.status,
        lanes=len(result.lanes),
        lane_answers=[answer for answer, _ in lanes],
        lane_correct=[score.correct for score in lane_scores],
        tokens={
            "prefill": usage.prefill_tokens,
            "cached_prefill": usage.cached_prefill_tokens,
            "decode": usage.decode_tokens,
            "verifier": usage.verifier_tokens,
            "cut_off": usage.cut_off_tokens,
        },
        cost=cost.total,
        cost_by_line={line: getattr(cost, line) for line in COST_LINES},
        seconds=result.elapsed_s,
        error=final.error,
        capped=capped,
    )


async def _score_all(
    scorer: Scorer, item: Item, pairs: list[tuple[str | None, str | None]], *, answered: bool
) -> list[Score]:
    """Each distinct (answer, text) scored once, concurrently (tests run in processes);
    the last pair is the run's own answer, wrong when the run abstained."""
    distinct = list(dict.fromkeys(pairs[:-1] + ([pairs[-1]] if answered else [])))
    found: dict[tuple[str | None, str | None], Score] = {}

    async def one(pair: tuple[str | None, str | None]) -> None:
        try:
            found[pair] = await scorer.score(item, *pair)
        except Exception as exc:  # a plug-in scorer that raises: that answer's score fails
            found[pair] = Score(0.0, f"scorer {scorer.name} raised {type(exc).__name__}: {exc}")

    async with anyio.create_task_group() as tg:
        for pair in distinct:
            tg.start_soon(one, pair)
    return [found[pair] for pair in pairs[:-1]] + [found[pairs[-1]] if answered else Score(0.0)]
