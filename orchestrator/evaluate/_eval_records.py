"""What an eval records, through its store's `EvalRecord`, and the statistics of its summary.

    manifest    written first: config, dataset, fields, scorer, limit
    results     one row per question, appended as each finishes (a crash keeps them)
    summary     n, accuracy and its 95% Wilson interval, pass@k, spend, wall time

In the files store these are `runs/<eval_id>/eval.json`, `results.jsonl` (and `results.csv`,
the rows flat) and `summary.json`; in PostgreSQL, rows of `lanefold_evals` and
`lanefold_eval_results`. Rows, the manifest and the summary are pydantic models: what is read
back is checked.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lanefold.execution import open_store
from lanefold.primitives import ConfigError, EvalRecord, Store, validate_run_id

__all__ = (
    "COST_LINES",
    "RUN_IDS",
    "TOKEN_LINES",
    "EvalManifest",
    "EvalPaths",
    "EvalSummary",
    "FittedBudget",
    "QuestionResult",
    "RescoreSpec",
    "append_result",
    "as_json",
    "check_eval_id",
    "csv_table",
    "eval_record",
    "is_eval",
    "pass_at_k",
    "read_manifest",
    "read_results",
    "read_summary",
    "summarize",
    "wilson_interval",
)

TOKEN_LINES = ("prefill", "cached_prefill", "decode", "verifier", "cut_off")
PAID_TOKENS = ("prefill", "decode", "verifier", "cut_off")  # computed: what `max_tokens` counts
OVER_BUDGET = 1.05  # a config that paid over this share of its equal budget is over it
COST_LINES = ("prefill", "cached_prefill", "decode", "kv_residency", "verifier", "cut_off")
Z95 = NormalDist().inv_cdf(0.975)
# Question i of eval E is the run `E.i`; no eval id may end in `.<digits>`, so no eval's folder
# is another eval's run. (Evals before this rule named them `E-i`: their manifests say so.)
RUN_IDS = "{eval_id}.{index}"
_OLD_RUN_IDS = "{eval_id}-{index}"
_LIKE_A_RUN = re.compile(r"\.[0-9]+$")


def check_eval_id(eval_id: str) -> str:
    """An eval id: a plain name (as a run id) that does not end like its questions' runs."""
    validate_run_id(eval_id)
    if _LIKE_A_RUN.search(eval_id) or eval_id.endswith("."):
        raise ConfigError(
            f"eval id {eval_id!r} ends like a question's run id (<eval id>.<n>): choose another"
        )
    return eval_id


class RescoreSpec(BaseModel):
    """What a re-reduction of an eval asked for: recorded in its manifest (`rescore_of`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_id: str  # the eval re-reduced
    reducer: str
    verifier: str | None = None  # `module:function`
    verifier_command: list[str] | None = None
    extract: dict[str, Any] | None = None

    def describe(self) -> str:
        """`any_pass with checks:verify` (for a table)."""
        by = self.verifier or (" ".join(self.verifier_command) if self.verifier_command else None)
        return self.reducer + (f" with {by}" if by else "")


class FittedBudget(BaseModel):
    """The equal budget a `compare` or `sweep` fitted an eval's config to: what a question may
    pay, in `unit` (`tokens`, `cost` or `lanes`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: Literal["tokens", "cost", "lanes"]
    budget: float

    def paid(self, summary: EvalSummary) -> float:
        """What a question of the eval paid on average, in this budget's unit."""
        if self.unit == "lanes":
            return summary.mean_lanes
        if self.unit == "cost":
            return summary.mean_cost
        return math.fsum(summary.mean_tokens.get(line, 0.0) for line in PAID_TOKENS)

    def over(self, summary: EvalSummary) -> bool:
        """Whether the eval paid over 105% of the budget (never "best", never on a frontier)."""
        return self.paid(summary) > OVER_BUDGET * self.budget


class EvalManifest(BaseModel):
    """`eval.json`: what `orchestrator eval --resume ID` needs to run the same eval again,
    and what the same command with the same `--eval-id` must match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_id: str
    created: datetime
    config_path: str | None  # where the config came from (None: given as an object)
    config: dict[str, object]  # the resolved config; every question runs it
    config_hash: str
    seeds: str = "loop.seed + index"  # question i runs with the config's seed plus i
    dataset: str  # the --dataset spec ("<items>" when the caller gave items)
    question_field: str | None = None  # None: the default (or the packaged data's own)
    answer_field: str | None = None
    scorer: str
    limit: int | None = None
    questions: int
    questions_hash: str  # of every question and gold, in order
    library_version: str
    run_ids: str = _OLD_RUN_IDS  # how its questions' runs are named (RUN_IDS for new evals)
    # A re-reduction of another eval (`orchestrator reduce --eval`): what it asked for
    rescore_of: RescoreSpec | None = Field(None, exclude_if=lambda v: v is None)
    # The equal budget a compare or sweep fitted its config to
    fitted_to: FittedBudget | None = Field(None, exclude_if=lambda v: v is None)

    def run_id(self, index: int) -> str:
        """The run of question `index`."""
        return self.run_ids.format(eval_id=self.eval_id, index=index)


class QuestionResult(BaseModel):
    """One row of `results.jsonl`: a question's run, its answer and how it scored.

    `status` is the run's ("answered", "no_answer": an abstention) or "failed" (the run
    raised: budget, quorum, backend; `error` says). `lanes` counts the sample lanes the run
    priced; `lane_answers` and `lane_correct` are its completed ones, in order (what pass@k
    and the curves read). `seconds` is the run's sampling time (`elapsed_s`). `capped`: the
    run was cut at its per-question `[budget]` limit (a wave shrunk or refused, or its loop
    stopped because the budget could not fund its next step; failed with it, refused).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    run_id: str
    question: str
    answer: str | None
    gold: str | None
    correct: bool
    score: float
    status: Literal["answered", "no_answer", "failed"]
    lanes: int
    lane_answers: list[str | None] = []
    lane_correct: list[bool] = []
    tokens: dict[str, int]
    cost: float
    cost_by_line: dict[str, float] = {}
    seconds: float
    error: str | None = None
    capped: bool = False


class EvalSummary(BaseModel):
    """`summary.json`: the eval at a glance. Failed runs and abstentions count as wrong.

    `interval` is the 95% Wilson score interval of `accuracy`; `pass_at_k` maps k (powers of
    two up to the fewest completed lanes any finished question has) to the mean unbiased
    pass@k over the `pass_at_k_questions` questions that finished; `tokens` and `cost` are
    totals by bill line, `mean_*` per question; `seconds` sums the runs' sampling time and
    `wall_s` the eval's own time (over every invocation that ended, a killed one's is lost).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_id: str
    config: str
    loop: str
    dataset: str
    scorer: str
    n: int
    correct: int
    accuracy: float
    interval: tuple[float, float]
    mean_score: float
    answered: int
    abstentions: int
    failed: int
    pass_at_k: dict[str, float]
    pass_at_k_questions: int
    mean_lanes: float
    tokens: dict[str, int]
    mean_tokens: dict[str, float]
    cost: dict[str, float]
    mean_cost: float
    seconds: float
    wall_s: float
    results: str


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of `successes` out of `n` (95% by default); (0, 1) for n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At the edges a bound is 0 or 1 exactly (the float formula leaves a crumb).
    return (
        0.0 if successes == 0 else max(0.0, centre - half),
        1.0 if successes == n else min(1.0, centre + half),
    )


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one question with `c` correct of `n` samples (Chen et al.
    2021): `1 - C(n-c, k)/C(n, k)`, as the product `prod (1 - k/i)` for i in (n-c, n], so a
    large n needs no huge integers."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ConfigError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def summarize(
    rows: Sequence[QuestionResult],
    *,
    eval_id: str,
    config: str,
    loop: str,
    dataset: str,
    scorer: str,
    wall_s: float,
    results: str,
) -> EvalSummary:
    """The summary of every question's row."""
    n = len(rows)
    correct = sum(row.correct for row in rows)
    finished = [row for row in rows if row.status != "failed" and row.lane_correct]
    ks: list[int] = []
    if finished:
        fewest = min(len(row.lane_correct) for row in finished)
        ks = [2**i for i in range(fewest.bit_length()) if 2**i <= fewest]
    passes = {
        str(k): _mean([pass_at_k(len(r.lane_correct), sum(r.lane_correct), k) for r in finished]) for k in ks
    }
    tokens = {line: sum(row.tokens.get(line, 0) for row in rows) for line in TOKEN_LINES}
    cost = {line: sum(row.cost_by_line.get(line, 0.0) for row in rows) for line in COST_LINES}
    cost["total"] = sum(row.cost for row in rows)
    return EvalSummary(
        eval_id=eval_id,
        config=config,
        loop=loop,
        dataset=dataset,
        scorer=scorer,
        n=n,
        correct=correct,
        accuracy=correct / n if n else 0.0,
        interval=wilson_interval(correct, n),
        mean_score=_mean([row.score for row in rows]),
        answered=sum(row.status == "answered" for row in rows),
        abstentions=sum(row.status == "no_answer" for row in rows),
        failed=sum(row.status == "failed" for row in rows),
        pass_at_k=passes,
        pass_at_k_questions=len(finished) if ks else 0,
        mean_lanes=_mean([row.lanes for row in rows]),
        tokens=tokens,
        mean_tokens={line: tokens[line] / n if n else 0.0 for line in TOKEN_LINES},
        cost=cost,
        mean_cost=cost["total"] / n if n else 0.0,
        seconds=round(sum(row.seconds for row in rows), 6),
        wall_s=round(wall_s, 6),
        results=results,
    )


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


# -- the record, through the store -----------------------------------------------------------


class EvalPaths:
    """The files of an eval in a files store: `runs_dir/<eval_id>/` and what it holds (for
    readers that read files only, as `curve` does)."""

    def __init__(self, runs_dir: str | Path, eval_id: str) -> None:
        self.folder = Path(runs_dir) / validate_run_id(eval_id)
        self.manifest = self.folder / "eval.json"
        self.results = self.folder / "results.jsonl"
        self.csv = self.folder / "results.csv"
        self.summary = self.folder / "summary.json"


def eval_record(where: Store | str | Path, eval_id: str) -> EvalRecord:
    """The record of `eval_id` in a store, or in the files under a runs folder."""
    store = open_store(None, where) if isinstance(where, str | Path) else where
    return store.eval_record(eval_id)


def read_manifest(where: Store | str | Path, eval_id: str) -> EvalManifest:
    """An eval's manifest (ConfigError when there is no such eval or it is unreadable);
    `where` a store, or a runs folder (the files store)."""
    record = eval_record(where, eval_id)
    body = record.read_manifest()
    if body is None:
        shown = where if isinstance(where, str | Path) else where.describe
        raise ConfigError(f"{record.manifest_location}: no eval {eval_id!r} in {shown}")
    try:
        return EvalManifest.model_validate_json(body)
    except ValueError as exc:
        raise ConfigError(f"{record.manifest_location}: not an eval manifest: {exc}") from None


def read_summary(record: EvalRecord) -> EvalSummary | None:
    """An eval's summary once it has ended (None before); ConfigError where unreadable."""
    body = record.read_summary()
    if body is None:
        return None
    try:
        return EvalSummary.model_validate_json(body)
    except ValueError as exc:
        raise ConfigError(f"{record.location}: not an eval summary: {exc}") from None


def _row(line: bytes) -> QuestionResult:
    try:
        return QuestionResult.model_validate_json(line)
    except ValidationError as exc:
        raise ValueError(exc.errors()[0]["msg"]) from None


def read_results(source: EvalRecord | Path, *, repair: bool = False) -> dict[int, QuestionResult]:
    """An eval's rows by question index, in the order they landed (the first row of an index
    wins); `source` its record, or the path of a files store's `results.jsonl`.

    A torn last row (a crash mid-append) is ignored, and with `repair` cut off so the next
    append starts a row of its own; a bad row anywhere else is refused, naming it.
    """
    record = _record_of(source)
    rows: dict[int, QuestionResult] = {}
    for row in record.read_rows(_row, repair=repair):
        rows.setdefault(row.index, row)
    return rows


def append_result(target: EvalRecord | Path, row: QuestionResult) -> None:
    """Append one row, whole or not at all (LogWriteError when the store refuses it);
    `target` the record, or the path of a files store's `results.jsonl`."""
    _record_of(target).append_row(row.model_dump_json().encode())


def _record_of(source: EvalRecord | Path) -> EvalRecord:
    if isinstance(source, Path):  # `<runs_dir>/<eval_id>/results.jsonl`
        return eval_record(source.parent.parent, source.parent.name)
    return source


_CSV_COLUMNS = (
    "index",
    "run_id",
    "question",
    "answer",
    "gold",
    "correct",
    "score",
    "status",
    "lanes",
    "lanes_correct",
    *(f"tokens_{line}" for line in TOKEN_LINES),
    "cost",
    "seconds",
    "error",
)


def csv_table(rows: Iterable[QuestionResult]) -> str:
    """`results.csv`: a row per question, tokens by bill line flattened into columns."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_COLUMNS)
    for row in rows:
        writer.writerow(
            [
                row.index,
                row.run_id,
                row.question,
                row.answer,
                row.gold,
                row.correct,
                row.score,
                row.status,
                row.lanes,
                sum(row.lane_correct),
                *(row.tokens.get(line, 0) for line in TOKEN_LINES),
                row.cost,
                row.seconds,
                row.error,
            ]
        )
    return out.getvalue()


def as_json(model: BaseModel) -> bytes:
    """A model as indented JSON, as the manifest and summary are kept."""
    return (json.dumps(model.model_dump(mode="json"), indent=2) + "\n").encode()


def is_eval(store: Store, name: str) -> bool:
    """Whether `name` is an eval in `store` (a manifest is recorded, not a run's log)."""
    try:
        record = store.eval_record(name)
    except ConfigError:
        return False  # not a plain name: the run commands say so
    return record.exists() and not record.is_run()
