"""OpenAI's evals registry as a dataset source: `--dataset openai-evals:<name>`.

The registry's sets ship inside the `evals==3.0.1.post1` wheel on PyPI (46 MB): about 660 JSON
Lines files under `evals/registry/data/<folder>/<file>.jsonl`, and the evals that read them
declared in `evals/registry/evals/*.yaml`. The wheel is fetched once with `pip download --no-deps`
into `$LANEFOLD_CACHE/openai-evals` (default `~/.cache/lanefold/openai-evals`) and every load
reads it there as a zip archive: never installed, never imported (it pins old versions of much
of PyPI, and only its data is wanted).

`<name>` is an eval's name (`arithmetic-expression`) or id (`arithmetic-expression.dev.v0`):
the eval's `id` names a spec whose `args.samples_jsonl` is a path under `evals/registry/data/`.
A data path (`arithmetic-expression/samples.jsonl`) names a file directly.

Each sample becomes an Item:
- question: `input` as text. A string is the question; a list of chat messages (`{role,
  content}`) becomes their contents in order, joined by a blank line, so a system message's
  instructions come first and a few-shot example's turns read as plain text. The messages
  themselves go to `meta["messages"]` (a string input as one user message).
- answer: `ideal`, a string or a list of them (every acceptable answer): the first is the gold
  answer and all are in `meta["answers"]`, as BIG-bench items carry them.
- a row without an `ideal` (a model-graded sample), with an empty one, or whose input is neither
  text nor messages is skipped; a set with no row left is refused.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from lanefold.config import MAX_NESTING, nests_deeper
from lanefold.evaluate._fetch import fetch_refused, pip_download, source_cache
from lanefold.evaluate._item import Item
from lanefold.primitives import ConfigError, LanefoldError, get_logger

__all__ = (
    "EVALS_VERSION",
    "WHEEL_NAME",
    "Registry",
    "fetch_openai_evals",
    "load_openai_evals",
    "openai_evals_cache",
    "read_registry",
)

EVALS_VERSION = "3.0.1.post1"
WHEEL_NAME = f"evals-{EVALS_VERSION}-py3-none-any.whl"
_DATA = "evals/registry/data/"
_EVALS = "evals/registry/evals/"
_EXAMPLE = "arithmetic-expression"
_log = get_logger("lanefold.evaluate")


def openai_evals_cache() -> Path:
    """Where the wheel is kept: `$LANEFOLD_CACHE/openai-evals`."""
    return source_cache("openai-evals")


def load_openai_evals(name: str, *, cache_dir: Path | None = None) -> list[Item]:
    """The scorable samples of one registry set (an eval name or a data path), fetching the
    wheel into `cache_dir` first if it is not there."""
    spec = f"openai-evals:{name}"
    wheel = (cache_dir or openai_evals_cache()) / WHEEL_NAME
    if not wheel.is_file():
        fetch_openai_evals(wheel.parent, spec=spec)
    try:
        with zipfile.ZipFile(wheel) as zf:
            member = _member(name, zf, spec)
            rows = _rows(zf, member, spec)
    except (OSError, zipfile.BadZipFile) as exc:
        raise LanefoldError(
            f"--dataset {spec}: cannot read {wheel}: {exc}; delete it to fetch again"
        ) from exc
    path = member.removeprefix(_DATA)
    items: list[Item] = []
    for number, row in rows:
        item = _item(
            row, index=len(items), task=name.strip(), path=path, source=f"{WHEEL_NAME}:{member}:{number}"
        )
        if item is not None:
            items.append(item)
    if not items:
        raise ConfigError(
            f"--dataset {spec}: none of the {len(rows)} samples of {path} has an "
            "'ideal' answer to score against (model-graded sets and few-shot files "
            "have none); choose another"
        )
    return items


def fetch_openai_evals(cache_dir: Path, *, spec: str = "openai-evals:<name>") -> Path:
    """Download the `evals` wheel with pip (never installing it) as `cache_dir/WHEEL_NAME`,
    moved there whole once pip is done. A ConfigError naming `spec` and the other sources when
    pip cannot fetch it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=cache_dir))
    log = cache_dir / "fetch.log"
    requirement = f"evals=={EVALS_VERSION}"
    _log.warning("fetching the evals wheel once with pip (46 MB)", cache=str(cache_dir))
    try:
        pip_download(requirement, work, log=log, options=("--only-binary=:all:",))
        wheels = sorted(work.glob("evals-*.whl"))
        if not wheels:
            raise fetch_refused(spec, requirement, log, source="openai-evals")
        os.replace(wheels[0], cache_dir / WHEEL_NAME)
    except OSError as exc:
        raise LanefoldError(f"--dataset {spec}: fetching into {cache_dir} failed: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return cache_dir / WHEEL_NAME


@dataclass(frozen=True, slots=True)
class Registry:
    """What the wheel's registry declares: each eval name and each spec id with the data path
    its samples come from (None: it reads none from the registry, e.g. a Hugging Face set),
    and every JSONL data path the wheel holds."""

    evals: Mapping[str, str | None]
    specs: Mapping[str, str | None]
    data: frozenset[str]

    def names(self) -> list[str]:
        """The eval names whose samples the wheel holds: what `openai-evals:<name>` takes."""
        return sorted(name for name, path in self.evals.items() if path in self.data)


def read_registry(zf: zipfile.ZipFile) -> Registry:
    """Parse every `evals/registry/evals/*.yaml` of the wheel (a YAML file that does not parse
    is left out, as the evals package leaves out a registry entry it cannot read)."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            "--dataset openai-evals: reading its registry needs PyYAML "
            "(pip install pyyaml; the `eval` extra has it)"
        ) from None
    entries: dict[str, Any] = {}
    for member in sorted(zf.namelist()):
        if member.startswith(_EVALS) and member.endswith((".yaml", ".yml")):
            try:
                doc = yaml.load(zf.read(member), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            except yaml.YAMLError as exc:
                _log.warning(
                    "skipping a registry file that does not parse",
                    file=member,
                    error=str(exc).splitlines()[0],
                )
                continue
            if isinstance(doc, dict):
                entries.update((str(key), value) for key, value in doc.items() if isinstance(value, dict))
    specs = {key: _samples(value) for key, value in entries.items() if "id" not in value}
    evals = {key: specs.get(str(value["id"])) for key, value in entries.items() if "id" in value}
    data = frozenset(
        m.removeprefix(_DATA) for m in zf.namelist() if m.startswith(_DATA) and m.endswith(".jsonl")
    )
    return Registry(evals=evals, specs=specs, data=data)


def _samples(spec: Mapping[str, Any]) -> str | None:
    args = spec.get("args")
    path = args.get("samples_jsonl") if isinstance(args, dict) else None
    return path if isinstance(path, str) else None


def _member(name: str, zf: zipfile.ZipFile, spec: str) -> str:
    """The archive member `name` (an eval name, a spec id or a data path) reads."""
    wanted = name.strip().strip("/")
    registry = read_registry(zf)
    if wanted.endswith(".jsonl") and ".." not in PurePosixPath(wanted).parts and wanted in registry.data:
        return _DATA + wanted
    declared = {**registry.specs, **registry.evals}
    if wanted in declared and not wanted.endswith(".jsonl"):
        path = declared[wanted]
        if path is None:
            raise ConfigError(
                f"--dataset {spec}: the eval {wanted!r} reads no samples from the "
                "registry (its data comes from elsewhere); name another"
            )
        if path not in registry.data:
            raise ConfigError(
                f"--dataset {spec}: the eval {wanted!r} reads {path}, which the "
                f"{WHEEL_NAME} wheel does not hold"
            )
        return _DATA + path
    close = difflib.get_close_matches(wanted, [*registry.names(), *sorted(registry.data)], n=1)
    raise ConfigError(f"--dataset: no OpenAI evals set {wanted!r} (e.g. {close[0] if close else _EXAMPLE})")


def _rows(zf: zipfile.ZipFile, member: str, spec: str) -> list[tuple[int, Any]]:
    """The JSON values of a data file's lines, with their line numbers."""
    try:
        text = zf.read(member).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LanefoldError(f"--dataset {spec}: {member} is not UTF-8 text: {exc}") from exc
    rows: list[tuple[int, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if nests_deeper(line, MAX_NESTING):  # before the parser, which recurses per level
                raise LanefoldError(
                    f"--dataset {spec}: {member}:{number}: nested deeper than {MAX_NESTING} levels"
                )
            try:
                rows.append((number, json.loads(line)))
            except ValueError as exc:
                raise LanefoldError(f"--dataset {spec}: {member}:{number}: not valid JSON: {exc}") from exc
    return rows


def _item(row: Any, *, index: int, task: str, path: str, source: str) -> Item | None:
    """One sample as an Item (see the module's docstring), or None if it cannot be scored."""
    if not isinstance(row, dict):
        return None
    messages = _messages(row.get("input"))
    answers = _answers(row.get("ideal"))
    if messages is None or not answers:
        return None
    question = "\n\n".join(message["content"] for message in messages)
    meta = {key: value for key, value in row.items() if key not in ("input", "ideal")}
    meta.update(task=task, file=path, messages=messages, answers=answers)
    return Item(index=index, question=question, answer=answers[0], meta=meta, source=source)


def _messages(value: Any) -> list[dict[str, Any]] | None:
    """The input as chat messages, or None if it is neither text nor a list of messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value.strip() else None
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value):
        return None
    return value if any(m["content"].strip() for m in value) else None


def _answers(value: Any) -> list[str]:
    """Every acceptable answer as text: a string, a number, or a list of them; blanks dropped."""
    values = value if isinstance(value, list) else [value]
    answers = [json.dumps(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in values]
    return [answer for answer in answers if isinstance(answer, str) and answer.strip()]
