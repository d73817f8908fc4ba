"""The Berkeley Function Calling Leaderboard as a dataset source: `--dataset bfcl:<category>`.

BFCL's questions ship inside the `bfcl-eval` wheel on PyPI (2 MB): one JSON Lines file per
category, `bfcl_eval/data/BFCL_v4_<category>.json` (each entry its `id`, its `question` as
turns of chat messages and its `function` list), and the gold for each under
`bfcl_eval/data/possible_answer/` (`ground_truth`: for each call, every acceptable value of
each argument, `""` marking one that may be left out). The wheel is fetched once with `pip
download --no-deps` into `$LANEFOLD_CACHE/bfcl` and read there as a zip archive: never
installed, never imported (its checker imports every model vendor's SDK).

The categories read here are those whose answer is one call of a Python function
(`CATEGORIES`); the parallel ones (several calls), Java and JavaScript (arguments as source
text), irrelevance (no call) and the multi-turn ones are refused, naming these.

Each entry becomes an Item:
- question: the contents of its first turn's messages (a system message, then the user's),
  joined by a blank line; the messages themselves in `meta["messages"]`.
- tools: its functions as OpenAI tools (`bfcl_tool`): BFCL's Python-flavoured types mapped to
  JSON Schema as BFCL maps them for OpenAI (`dict` object, `float` number, `tuple` array,
  `any` and an unknown type string), a `.` in a name as `_`, a `default` moved into the
  description (so that the canonical form fills no argument the model left out).
- answer: the simplest right call, as canonical JSON text (each argument's first acceptable
  value; one that may be left out is). `meta` keeps `functions`, `ground_truth` and
  `category` for the `bfcl` scorer, and names it the dataset's default (`meta["scorer"]`).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from lanefold.config import MAX_NESTING, nests_deeper
from lanefold.evaluate._fetch import fetch_refused, pip_download, source_cache
from lanefold.evaluate._item import Item
from lanefold.primitives import ConfigError, LanefoldError, ToolSpec, canonical_json, get_logger, parse_tools

__all__ = (
    "BFCL_VERSION",
    "CATEGORIES",
    "WHEEL_NAME",
    "bfcl_cache",
    "bfcl_categories",
    "bfcl_schema",
    "bfcl_tool",
    "fetch_bfcl",
    "load_bfcl",
)

BFCL_VERSION = "2026.3.23"
WHEEL_NAME = f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl"
CATEGORIES = ("simple_python", "multiple", "live_simple", "live_multiple")
"""The categories whose every answer is one call of a Python function: what a lane's call is."""
_DATA = "bfcl_eval/data/"
_ANSWERS = "bfcl_eval/data/possible_answer/"
_PREFIX = "BFCL_v4_"
# BFCL's own map to OpenAI's JSON Schema (bfcl_eval/constants/type_mappings.py, GORILLA_TO_OPENAPI).
_TYPES = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}
# Keywords kept as they are; BFCL's own (`optional`, a property's boolean `required`) are dropped.
_KEPT = ("description", "enum", "maximum", "minimum", "minItems", "maxItems")
_log = get_logger("lanefold.evaluate")


def bfcl_cache() -> Path:
    """Where the wheel is kept: `$LANEFOLD_CACHE/bfcl`."""
    return source_cache("bfcl")


def load_bfcl(category: str, *, cache_dir: Path | None = None) -> list[Item]:
    """The entries of one BFCL category with their tools and gold, fetching the wheel into
    `cache_dir` first if it is not there."""
    category = category.strip()
    spec = f"bfcl:{category}"
    if category not in CATEGORIES:
        raise ConfigError(f"--dataset {spec}: {_why_not(category)}; name one of {', '.join(CATEGORIES)}")
    wheel = (cache_dir or bfcl_cache()) / WHEEL_NAME
    if not wheel.is_file():
        fetch_bfcl(wheel.parent, spec=spec)
    name = f"{_PREFIX}{category}.json"
    try:
        with zipfile.ZipFile(wheel) as zf:
            if _DATA + name not in zf.namelist():
                raise ConfigError(f"--dataset {spec}: the {wheel.name} archive holds no {_DATA}{name}")
            entries = _rows(zf, _DATA + name, spec)
            golds = {str(row.get("id")): row for _, row in _rows(zf, _ANSWERS + name, spec)}
    except (OSError, zipfile.BadZipFile) as exc:
        raise LanefoldError(
            f"--dataset {spec}: cannot read {wheel}: {exc}; delete it to fetch again"
        ) from exc
    items = [
        _item(row, golds, index=index, category=category, source=f"{wheel.name}:{_DATA}{name}:{number}")
        for index, (number, row) in enumerate(entries)
    ]
    if not items:
        raise ConfigError(f"--dataset {spec}: {_DATA}{name} holds no entries")
    return items


def fetch_bfcl(cache_dir: Path, *, spec: str = "bfcl:<category>") -> Path:
    """Download the `bfcl-eval` wheel with pip (never installing it) as `cache_dir/WHEEL_NAME`.
    A ConfigError naming `spec` and the other sources when pip cannot fetch it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fetch-", dir=cache_dir))
    log = cache_dir / "fetch.log"
    requirement = f"bfcl-eval=={BFCL_VERSION}"
    _log.warning("fetching the bfcl-eval wheel once with pip (2 MB)", cache=str(cache_dir))
    try:
        pip_download(requirement, work, log=log, options=("--only-binary=:all:",))
        wheels = sorted(work.glob("bfcl_eval-*.whl"))
        if not wheels:
            raise fetch_refused(spec, requirement, log, source="bfcl")
        os.replace(wheels[0], cache_dir / WHEEL_NAME)
    except OSError as exc:
        raise LanefoldError(f"--dataset {spec}: fetching into {cache_dir} failed: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return cache_dir / WHEEL_NAME


def bfcl_categories(zf: zipfile.ZipFile) -> dict[str, int]:
    """The CATEGORIES the archive holds, with their number of entries (lines)."""
    names = set(zf.namelist())
    found: dict[str, int] = {}
    for category in CATEGORIES:
        member = f"{_DATA}{_PREFIX}{category}.json"
        if member in names and f"{_ANSWERS}{_PREFIX}{category}.json" in names:
            found[category] = sum(1 for line in zf.read(member).splitlines() if line.strip())
    return found


def bfcl_schema(node: Any) -> Any:
    """A BFCL parameter schema as JSON Schema: each `type` mapped as BFCL maps it for OpenAI
    (`float` noted in the description, as BFCL does), a missing or unknown type a string,
    `default` moved into the description, BFCL's own keywords dropped, an array's `enum` of
    items moved into its `items`; nested `properties` and `items` alike."""
    if not isinstance(node, dict):
        return node
    raw = node.get("type")
    schema: dict[str, Any] = {"type": _TYPES.get(raw, "string") if isinstance(raw, str) else "string"}
    schema.update((key, copy.deepcopy(node[key])) for key in _KEPT if key in node)
    notes = [" This is a float type value."] if raw == "float" else []
    if "default" in node:
        notes.append(f" Default is: {node['default']}.")
    if notes:
        schema["description"] = str(node.get("description", "")) + "".join(notes)
    if isinstance(node.get("properties"), dict):
        schema["properties"] = {str(k): bfcl_schema(v) for k, v in node["properties"].items()}
        required = node.get("required")
        if isinstance(required, list) and all(isinstance(r, str) for r in required):
            schema["required"] = list(required)
    if isinstance(node.get("items"), dict):
        schema["items"] = bfcl_schema(node["items"])
    enum = schema.get("enum")
    if schema["type"] == "array" and isinstance(enum, list) and not any(isinstance(v, list) for v in enum):
        # BFCL writes an array's allowed items on the array (unsatisfiable as JSON Schema says)
        schema.setdefault("items", {})["enum"] = schema.pop("enum")
    return schema


def bfcl_tool(function: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function as an OpenAI tool (`bfcl_schema` for its parameters, `.` in its name
    as `_`, as BFCL sends it to OpenAI-style models)."""
    parameters = bfcl_schema(function.get("parameters", {"type": "dict", "properties": {}}))
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    return {
        "name": called(str(function.get("name", ""))),
        "description": str(function.get("description", "")),
        "parameters": parameters,
    }


def called(name: str) -> str:
    """The name a function is called by: BFCL's, with `.` as `_` (OpenAI's names have none)."""
    return name.replace(".", "_")


def _why_not(category: str) -> str:
    if "parallel" in category:
        return "its answers are several calls, and a lane's answer is one call"
    if category in ("simple_java", "simple_javascript"):
        return "its arguments are Java or JavaScript source text, which this source does not read"
    if "irrelevance" in category or "relevance" in category:
        return "its right answer is no call, which a tool_call answer cannot say"
    if category.startswith(("multi_turn", "memory", "web_search", "format")):
        return "it is a multi-turn or agentic category"
    return "no such category"


def _rows(zf: zipfile.ZipFile, member: str, spec: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSON Lines member, with their line numbers."""
    try:
        text = zf.read(member).decode("utf-8-sig")
    except KeyError:
        raise ConfigError(f"--dataset {spec}: the archive holds no {member}") from None
    except UnicodeDecodeError as exc:
        raise LanefoldError(f"--dataset {spec}: {member} is not UTF-8 text: {exc}") from exc
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if nests_deeper(line, MAX_NESTING):  # before the parser, which recurses per level
            raise LanefoldError(
                f"--dataset {spec}: {member}:{number}: nested deeper than {MAX_NESTING} levels"
            )
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise LanefoldError(f"--dataset {spec}: {member}:{number}: not valid JSON: {exc}") from exc
        if not isinstance(row, dict):
            raise LanefoldError(f"--dataset {spec}: {member}:{number}: an entry must be a JSON object")
        rows.append((number, row))
    return rows


def _item(
    row: dict[str, Any], golds: dict[str, dict[str, Any]], *, index: int, category: str, source: str
) -> Item:
    """One entry as an Item (see the module's docstring); a LanefoldError naming `source` for
    an entry not in BFCL's shape."""
    entry_id = str(row.get("id"))
    turns, functions = row.get("question"), row.get("function")
    messages = turns[0] if isinstance(turns, list) and turns and isinstance(turns[0], list) else None
    if not messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise LanefoldError(f"{source}: {entry_id}: no question (a turn of chat messages)")
    if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
        raise LanefoldError(f"{source}: {entry_id}: no function list")
    gold = golds.get(entry_id, {}).get("ground_truth")
    if not isinstance(gold, list) or len(gold) != 1 or not isinstance(gold[0], dict) or len(gold[0]) != 1:
        raise LanefoldError(f"{source}: {entry_id}: its possible answer is not one call")
    try:
        tools: tuple[ToolSpec, ...] = parse_tools(
            [bfcl_tool(f) for f in functions], where=f"{entry_id}.function"
        )
    except ConfigError as exc:
        raise LanefoldError(f"{source}: {exc}") from None
    question = "\n\n".join(m["content"] for m in messages)
    meta = {
        "id": entry_id,
        "category": category,
        "messages": messages,
        "functions": functions,
        "ground_truth": gold,
        "scorer": "bfcl",
    }
    answer = _simplest(gold[0], functions)
    return Item(index=index, question=question, answer=answer, meta=meta, source=source, tools=tools)


def _simplest(call: dict[str, Any], functions: list[dict[str, Any]]) -> str:
    """The simplest right call of a ground truth `{name: {param: [values]}}` as canonical text:
    each argument's first value, those that may be left out (`""` among them) left out unless
    the function requires them (a few entries allow leaving out what their function requires)."""
    ((name, params),) = call.items()
    function = next((f for f in functions if f.get("name") == name), {})
    required = function.get("parameters", {}).get("required", [])
    return canonical_json({"name": called(str(name)), "arguments": _first_values(params, required)})


def _first_values(options: dict[str, Any], required: Any = (), *, argument: bool = True) -> dict[str, Any]:
    """`{key: [acceptable values]}` as each key's first value that is one, those that may be left
    out (and are not `required`) left out. For a call's arguments (`argument`), a dict value is a
    dict argument's own options and made one value the same way; inside it values are as they are."""
    kept: dict[str, Any] = {}
    for key, values in options.items():
        given = [v for v in values if v != ""] if isinstance(values, list) else []
        if given and ("" not in values or key in required):
            kept[key] = _first(given[0]) if argument else given[0]
    return kept


def _first(value: Any) -> Any:
    """An argument's acceptable value made one: a dict argument's options by `_first_values`,
    each of a list of such dicts too."""
    if isinstance(value, dict):
        return _first_values(value, argument=False)
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [_first_values(v, argument=False) for v in value]
    return value
