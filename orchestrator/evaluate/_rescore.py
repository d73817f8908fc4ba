"""Re-scoring an eval: every run reduced again by another reducer (a verifier, a judge), no
sampling, the eval's scorer applied to the new answers.

`orchestrator reduce --eval EVAL_ID --reducer R [--verifier module:function |
--verifier-command CMD]` and `lanefold.evaluate.rescore_eval`. A re-reduction is an eval record
of its own beside the original, `<eval_id>.r<N>`: its manifest is the original's plus what was
asked (`rescore_of`: the eval, the reducer, the verifier, the extraction), its rows point at the
original's runs, and its summary is the original's shape, so `show`, `tail` and `curve` read it
as any eval. The original's `summary.json` is never touched. The same request again continues
(or returns) the same re-reduction; another reducer or verifier is the next number. Each run
gets a reduction of its own in its log (`reduce.started`/`reduce.completed`), under its lock:
a verifier's checks are recorded, and a judge reducer runs only its judge wave.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio

from lanefold.evaluate._datasets import DatasetSpec
from lanefold.evaluate._eval import OnResult, OnStart, scored_row
from lanefold.evaluate._eval_records import (
    EvalManifest,
    EvalSummary,
    QuestionResult,
    RescoreSpec,
    append_result,
    as_json,
    csv_table,
    read_results,
    read_summary,
    summarize,
)
from lanefold.evaluate._item import Item
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.execution import Session, open_store
from lanefold.primitives import (
    ConfigError,
    ExtractSpec,
    LanefoldError,
    RunInUseError,
    Store,
    resolve_reducer,
)

__all__ = ("RescoreSpec", "rereductions", "rescore_eval")

_MOST = 1000  # re-reductions of one eval: `<eval_id>.r1` ... `.r1000`


def rereductions(store: Store, eval_id: str) -> list[tuple[EvalManifest, EvalSummary | None]]:
    """The re-reductions of `eval_id` recorded in `store`, in order, each with its summary
    (None while unfinished)."""
    found = []
    for number in range(1, _MOST + 1):
        record = store.eval_record(f"{eval_id}.r{number}")
        body = record.read_manifest()
        if body is None:
            break
        manifest = EvalManifest.model_validate_json(body)
        found.append((manifest, read_summary(record)))
    return found


def _slot(store: Store, eval_id: str, spec: RescoreSpec) -> str:
    """The id of the re-reduction `spec` asks for: the one recorded with the same request,
    else the next free number."""
    found = rereductions(store, eval_id)
    for manifest, _ in found:
        if manifest.rescore_of == spec:
            return manifest.eval_id
    if len(found) >= _MOST:
        raise ConfigError(f"--eval: eval {eval_id} has {_MOST} re-reductions already")
    return f"{eval_id}.r{len(found) + 1}"


def _items(manifest: EvalManifest, rows: dict[int, QuestionResult]) -> list[Item]:
    """The eval's questions as it was given them: its dataset loaded again (so a scorer
    finds what it needs, HumanEval's tests), or, for questions given in Python, its rows."""
    if manifest.dataset != "<items>":
        spec = DatasetSpec(manifest.dataset, manifest.question_field, manifest.answer_field, manifest.limit)
        return list(spec.load())
    return [Item(row.index, row.question, row.gold) for _, row in sorted(rows.items())]


async def rescore_eval(
    eval_id: str,
    *,
    reducer: str,
    verifier: Any = None,
    verifier_command: Sequence[str] | None = None,
    extract: ExtractSpec | None = None,
    runs_dir: str | Path = "runs",
    store: str | Store | None = None,
    concurrency: int = 8,
    on_start: OnStart | None = None,
    on_result: OnResult | None = None,
    stop_reason: Callable[[], str] = lambda: "cancelled",
    clock: Callable[[], float] = time.monotonic,
) -> EvalSummary:
    """Reduce every run of eval `eval_id` again with `reducer` (and `verifier`: a
    `module:function`, a callable `fn(question, text, answer)` or a Verifier; or
    `verifier_command`, an argv; else the one the eval's scorer or config gives) and score
    the new answers with the eval's scorer; the re-reduction's summary. Nothing is sampled;
    everything is checked before anything is written."""
    if concurrency < 1:
        raise ConfigError(f"--concurrency: must be at least 1, got {concurrency}")
    if verifier is not None and verifier_command is not None:
        raise ConfigError("--verifier and --verifier-command: give one")
    if ":" not in reducer:
        resolve_reducer(reducer, key="--reducer")  # an unknown name, before anything
    opened = open_store(store, runs_dir) if isinstance(store, str | None) else store
    original = opened.eval_record(eval_id)
    body = original.read_manifest()
    if body is None:
        raise ConfigError(f"--eval: no eval {eval_id} in {original.location}")
    manifest = EvalManifest.model_validate_json(body)
    if manifest.rescore_of is not None:
        raise ConfigError(
            f"--eval: {eval_id} is a re-reduction of {manifest.rescore_of.eval_id}; re-reduce that eval"
        )
    rows = read_results(original)
    if not rows:
        raise ConfigError(f"--eval: eval {eval_id} has no finished question to reduce again")
    items = {item.index: item for item in _items(manifest, rows)}
    scorer = resolve_scorer(manifest.scorer, list(items.values()))
    given: Any = verifier if verifier is not None else (list(verifier_command) if verifier_command else None)
    if given is None:
        given = scorer.verifier(list(items.values()))  # as the eval had it: HumanEval's tests
    session = Session(runs_dir=runs_dir, store=opened, verifier=given)
    spec = RescoreSpec(
        eval_id=eval_id,
        reducer=reducer,
        verifier=verifier if isinstance(verifier, str) or verifier is None else _name_of(verifier),
        verifier_command=list(verifier_command) if verifier_command else None,
        extract=extract.model_dump(mode="json") if extract is not None else None,
    )
    started = clock()
    rescored_id = _slot(opened, eval_id, spec)
    record = opened.eval_record(rescored_id)
    held = contextlib.ExitStack()
    try:
        held.enter_context(record.hold())
    except RunInUseError as exc:
        raise ConfigError(
            f"re-reduction {rescored_id} is being run by another process (pid {exc.pid or 'unknown'})"
        ) from None
    with held:
        if record.read_manifest() is None:
            own = manifest.model_copy(
                update={
                    "eval_id": rescored_id,
                    "created": datetime.now(UTC),
                    "run_ids": manifest.run_ids.replace("{eval_id}", eval_id),
                    "rescore_of": spec,
                }
            )
            record.write_manifest(as_json(own))
        done = read_results(record, repair=True)
        todo = [rows[index] for index in sorted(rows) if index not in done]
        if on_start is not None:
            on_start(len(rows), [done[i] for i in sorted(done)])
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(row: QuestionResult) -> None:
            async with limiter:
                item = items.get(row.index)
                reduced = await _reduce_row(session, row, item, reducer, extract, stop_reason)
                new = reduced
                if item is not None and not isinstance(reduced, QuestionResult):
                    new = await scored_row(scorer, session.store, item, reduced)
            append_result(record, new)
            done[new.index] = new
            if on_result is not None:
                on_result(new)

        async with session, anyio.create_task_group() as tg:
            for row in todo:
                tg.start_soon(one, row)
        ordered = [done[index] for index in sorted(done)]
        loop = manifest.config.get("loop")
        summary = summarize(
            ordered,
            eval_id=rescored_id,
            config=manifest.config_path or "<config>",
            loop=str(loop.get("coordinator") if isinstance(loop, dict) else loop),
            dataset=manifest.dataset,
            scorer=manifest.scorer,
            wall_s=clock() - started,
            results=record.results_location,
        )
        record.write_summary(as_json(summary), table=csv_table(ordered))
        return summary


async def _reduce_row(
    session: Session,
    row: QuestionResult,
    item: Item | None,
    reducer: str,
    extract: ExtractSpec | None,
    stop_reason: Callable[[], str],
) -> Any:
    """The run's new result, or the LanefoldError that stopped it (a run that failed in
    the eval has no lanes to reduce: its row stays failed)."""
    if row.status == "failed" or item is None:
        return row.model_copy(update={"error": row.error or "the question is not in the eval's dataset"})
    try:
        return await session.reduce(row.run_id, reducer=reducer, extract=extract, stop_reason=stop_reason)
    except ConfigError:
        raise  # a reducer that needs what this eval has not: the whole request is refused
    except LanefoldError as exc:
        return row.model_copy(
            update={"answer": None, "correct": False, "score": 0.0, "status": "failed", "error": str(exc)}
        )


def _name_of(verifier: Any) -> str:
    """What a re-reduction records of a verifier given as an object: its `name`, else
    `module:qualname`."""
    name = getattr(verifier, "name", None)
    if isinstance(name, str):
        return name
    return (
        f"{getattr(verifier, '__module__', '?')}:{getattr(verifier, '__qualname__', type(verifier).__name__)}"
    )
