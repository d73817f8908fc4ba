"""What an eval writes in `runs/<eval_id>/`, and the statistics of its summary.

    eval.json       the manifest, written first: config, dataset, fields, scorer, limit
    results.jsonl   one row per question, appended as each finishes (a crash keeps them)
    results.csv     the same rows, flat, rewritten when the eval ends
    summary.json    n, accuracy and its 95% Wilson interval, pass@k, spend, wall time

Rows, the manifest and the summary are pydantic models: what is read back is checked.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from lanefold.primitives import ConfigError, LogWriteError, validate_run_id

__all__ = ("COST_LINES", "RUN_IDS", "TOKEN_LINES", "EvalManifest", "EvalPaths", "EvalSummary",
           "QuestionResult", "append_result", "check_eval_id", "pass_at_k", "read_manifest",
           "read_results", "summarize", "wilson_interval", "write_csv", "write_json")

TOKEN_LINES = ("prefill", "cached_prefill", "decode", "verifier", "cut_off")
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
        raise ConfigError(f"eval id {eval_id!r} ends like a question's run id (<eval id>.<n>): "
                          f"choose another")
    return eval_id


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

    def run_id(self, index: int) -> str:
        """The run of question `index`."""
        return self.run_ids.format(eval_id=self.eval_id, index=index)


class QuestionResult(BaseModel):
    """One row of `results.jsonl`: a question's run, its answer and how it scored.

    `status` is the run's ("answered", "no_answer": an abstention) or "failed" (the run
    raised: budget, quorum, backend; `error` says). `lanes` counts the sample lanes the run
    priced; `lane_answers` and `lane_correct` are its completed ones, in order (what pass@k
    and the curves read). `seconds` is the run's sampling time (`elapsed_s`).
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
    return (0.0 if successes == 0 else max(0.0, centre - half),
            1.0 if successes == n else min(1.0, centre + half))


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


def summarize(rows: Sequence[QuestionResult], *, eval_id: str, config: str, loop: str,
              dataset: str, scorer: str, wall_s: float, results: str) -> EvalSummary:
    """The summary of every question's row."""
    n = len(rows)
    correct = sum(row.correct for row in rows)
    finished = [row for row in rows if row.status != "failed" and row.lane_correct]
    ks: list[int] = []
    if finished:
        fewest = min(len(row.lane_correct) for row in finished)
        ks = [2 ** i for i in range(fewest.bit_length()) if 2 ** i <= fewest]
    passes = {str(k): _mean([pass_at_k(len(r.lane_correct), sum(r.lane_correct), k)
                             for r in finished]) for k in ks}
    tokens = {line: sum(row.tokens.get(line, 0) for row in rows) for line in TOKEN_LINES}
    cost = {line: sum(row.cost_by_line.get(line, 0.0) for row in rows) for line in COST_LINES}
    cost["total"] = sum(row.cost for row in rows)
    return EvalSummary(
        eval_id=eval_id, config=config, loop=loop, dataset=dataset, scorer=scorer, n=n,
        correct=correct, accuracy=correct / n if n else 0.0,
        interval=wilson_interval(correct, n), mean_score=_mean([row.score for row in rows]),
        answered=sum(row.status == "answered" for row in rows),
        abstentions=sum(row.status == "no_answer" for row in rows),
        failed=sum(row.status == "failed" for row in rows), pass_at_k=passes,
        pass_at_k_questions=len(finished) if ks else 0,
        mean_lanes=_mean([row.lanes for row in rows]), tokens=tokens,
        mean_tokens={line: tokens[line] / n if n else 0.0 for line in TOKEN_LINES},
        cost=cost, mean_cost=cost["total"] / n if n else 0.0,
        seconds=round(sum(row.seconds for row in rows), 6), wall_s=round(wall_s, 6),
        results=results)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


# -- files ------------------------------------------------------------------------------------

class EvalPaths:
    """The files of an eval: `runs_dir/<eval_id>/` and what it holds."""

    def __init__(self, runs_dir: str | Path, eval_id: str) -> None:
        self.folder = Path(runs_dir) / validate_run_id(eval_id)
        self.manifest = self.folder / "eval.json"
        self.results = self.folder / "results.jsonl"
        self.csv = self.folder / "results.csv"
        self.summary = self.folder / "summary.json"


def read_manifest(runs_dir: str | Path, eval_id: str) -> EvalManifest:
    """An eval's `eval.json` (ConfigError when there is no such eval or it is unreadable)."""
    path = EvalPaths(runs_dir, eval_id).manifest
    try:
        return EvalManifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no eval {eval_id!r} in {runs_dir}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not an eval manifest: {exc}") from None


def read_results(path: Path, *, repair: bool = False) -> dict[int, QuestionResult]:
    """The rows of a `results.jsonl`, by question index (the first row of an index wins).

    A torn last line (a crash mid-append) is ignored, and with `repair` cut off so the next
    append starts a line of its own; a bad line anywhere else is refused, naming it.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    lines = data.split(b"\n")
    rows: dict[int, QuestionResult] = {}
    offset = 0
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        if line.strip():
            try:
                row = QuestionResult.model_validate_json(line)
            except ValidationError as exc:
                if last:  # no newline after it: the append was cut short
                    if repair:  # a torn tail: cut it, as resume cuts an event log's
                        with _writing(path, "cut its torn last line"), path.open("r+b") as fh:
                            fh.truncate(offset)
                    break
                raise ConfigError(f"{path}:{number}: not a result row: "
                                  f"{exc.errors()[0]['msg']}") from None
            if last and repair:  # whole, but its newline never landed
                with _writing(path, "end its last line"), path.open("ab") as fh:
                    fh.write(b"\n")
            rows.setdefault(row.index, row)
        offset += len(line) + 1
    return rows


def append_result(path: Path, row: QuestionResult) -> None:
    """Append one row as one write (O_APPEND), so a crash leaves whole rows and at most a torn
    last one (LogWriteError when the disk refuses it: the row is not there)."""
    line = row.model_dump_json().encode() + b"\n"
    with _writing(path, "append"):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):  # a full disk may take part of it: cut it, refuse
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        finally:
            os.close(fd)


@contextlib.contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Every write of an eval's files fails the same way: one line, LogWriteError (exit 1),
    the machine's failure and never a question's."""
    try:
        yield
    except OSError as exc:
        raise LogWriteError(f"{path}: cannot {what}: {exc.strerror or exc}") from None


_CSV_COLUMNS = ("index", "run_id", "question", "answer", "gold", "correct", "score", "status",
                "lanes", "lanes_correct", *(f"tokens_{line}" for line in TOKEN_LINES), "cost",
                "seconds", "error")


def write_csv(path: Path, rows: Iterable[QuestionResult]) -> None:
    """`results.csv`: a row per question, tokens by bill line flattened into columns."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_COLUMNS)
    for row in rows:
        writer.writerow([row.index, row.run_id, row.question, row.answer, row.gold,
                         row.correct, row.score, row.status, row.lanes, sum(row.lane_correct),
                         *(row.tokens.get(line, 0) for line in TOKEN_LINES), row.cost,
                         row.seconds, row.error])
    _replace(path, out.getvalue())


def write_json(path: Path, model: BaseModel) -> None:
    """A model as indented JSON, replaced whole (written beside, then renamed)."""
    _replace(path, json.dumps(model.model_dump(mode="json"), indent=2) + "\n")


def _replace(path: Path, text: str) -> None:
    draft = path.with_name(f".{path.name}.new")
    with _writing(path, "write"):
        try:
            draft.write_text(text, encoding="utf-8")
            os.replace(draft, path)
        finally:
            draft.unlink(missing_ok=True)
