"""Answer extraction and normalisation: pure functions from a lane's text to a votable answer.

Extraction finds the answer inside a lane's free text (`ExtractSpec` says how); normalisation
maps answers that mean the same to one string, so that `"1,000."` and `" 1000"` vote together.
Nothing found is `None`: an abstention, never an error, because one lane's bad format must not
sink a wave. A structured answer (`"json"`, `"tool_call"`) is read by `primitives/_structured.py`
and is already canonical; normalisation leaves it as it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from lanefold.primitives._errors import ConfigError
from lanefold.primitives._structured import AnswerRead, canonical_json, read_structured
from lanefold.primitives._tools import ToolSpec, check_schema, tools_schema

__all__ = (
    "STRUCTURED_METHODS",
    "ExtractMethod",
    "ExtractSpec",
    "extract_answer",
    "normalize_answer",
    "read_answer",
)

ExtractMethod = Literal["regex", "last_number", "boxed", "json_field", "json", "tool_call"]
"""How an answer is found in a lane's text (`[extract] method`); each takes the last occurrence."""

STRUCTURED_METHODS = frozenset({"json", "tool_call"})
"""The methods whose answer is a JSON value or a tool call, in canonical JSON text."""

# A number as people write it: optional sign, optional thousands groups, optional decimals.
# The sign counts only where it cannot be a binary minus or a hyphen ("5-3", "x-1", "(2)-1").
_NUMBER = re.compile(
    r"(?:(?<![\w)\].])[-+\u2212])?"
    r"(?<![\d.])(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?(?![0-9])"
    r"|(?:(?<![\w)\].])[-+\u2212])?(?<![\d.])\.[0-9]+(?![0-9])"
)
# The whole string is one number (used by normalisation, after other wrapping is gone).
_WHOLE_NUMBER = re.compile(r"[-+]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]+)?|[-+]?\.[0-9]+")
_BOXED = re.compile(r"\\boxed\s*\{")
_TRAILING_PUNCT = ".,;:!?"
_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("`", "`"), ("$", "$"), ("\u201c", "\u201d"))


class ExtractSpec(BaseModel):
    """How to find the answer in a lane's text.

    `method` defaults to `"regex"` when `regex` is given, else `"last_number"`; read the
    effective one from `resolved_method`. A `regex` must compile and have a group (the first
    group is the answer); `"json_field"` needs `field`, a dotted path such as `"result.answer"`;
    `"json"` takes an optional `schema` (a JSON Schema, as a table or JSON text; kept as JSON
    text). `"tool_call"` reads a call of the run's tools, which a run binds to its extractor
    (`with_tools`): they are the run's (`run.started`), not the config's.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, serialize_by_alias=True, validate_by_name=True)

    method: ExtractMethod | None = None
    regex: str | None = Field(default=None, validate_default=True)
    field: str | None = Field(default=None, validate_default=True)
    # `schema` is BaseModel's (deprecated) method name: the field is `schema_`, read as `schema`,
    # and left out of dumps where absent, so configs written before it hash as they did.
    schema_: str | None = Field(default=None, alias="schema", exclude_if=lambda v: v is None)
    _tools: tuple[ToolSpec, ...] = PrivateAttr(default=())
    _tool_choice: str | None = PrivateAttr(default=None)

    @field_validator("regex")
    @classmethod
    def _check_regex(cls, value: str | None, info: ValidationInfo) -> str | None:
        method = info.data.get("method")
        if value is None:
            if method == "regex":
                raise ValueError("regex is required when method is 'regex'")
            return None
        if method not in (None, "regex"):
            raise ValueError(f"regex is only used with method 'regex', not with {method!r}")
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"regex does not compile: {exc}") from None
        if compiled.groups < 1:
            raise ValueError("regex needs a capturing group: its first group is the answer")
        return value

    @field_validator("field")
    @classmethod
    def _check_field(cls, value: str | None, info: ValidationInfo) -> str | None:
        method = info.data.get("method")
        if value is None:
            if method == "json_field":
                raise ValueError("field is required when method is 'json_field'")
            return None
        if method != "json_field":
            raise ValueError("field is only used with method 'json_field'; set method to it")
        if not value or any(not part for part in value.split(".")):
            raise ValueError("field must be a dotted path of non-empty keys, e.g. 'result.answer'")
        return value

    @field_validator("schema_", mode="before")
    @classmethod
    def _check_schema(cls, value: Any, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("method") != "json":
            raise ValueError("schema is only used with method 'json'; set method to it")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("expected a JSON Schema object")
        try:
            check_schema(value, "schema")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def schema_text(self) -> str | None:
        """`[extract] schema` as JSON text (None: none given)."""
        return self.schema_

    @property
    def tools(self) -> tuple[ToolSpec, ...]:
        """The run's tools a `"tool_call"` answer calls one of (bound by `with_tools`)."""
        return self._tools

    @property
    def tool_choice(self) -> str | None:
        """The run's `tool_choice` (bound by `with_tools`): a tool's name admits that one only."""
        return self._tool_choice

    def with_tools(self, tools: Sequence[ToolSpec], tool_choice: str | None = None) -> ExtractSpec:
        """This extractor bound to a run's tools: how every reader of the run (its lanes, the
        audit of its log, a re-reduction) reads a call, from what `run.started` records."""
        bound = self.model_copy()
        bound._tools, bound._tool_choice = tuple(tools), tool_choice
        return bound

    def output_schema(self) -> str | None:
        """The JSON Schema (JSON text) a lane's whole output is held to under this extractor,
        where a backend can constrain decoding: `[extract] schema` for `"json"`; for
        `"tool_call"` a call of the bound tools (`tools_schema`), unless `tool_choice` is
        "auto" (the model may answer in prose) or "none"; else None."""
        method = self.resolved_method
        if method == "json":
            return self.schema_
        if method == "tool_call" and self._tool_choice not in ("auto", "none"):
            return tools_schema(self._tools, self._tool_choice)
        return None

    @property
    def structured(self) -> bool:
        """Whether answers are JSON values or calls (canonical JSON text, see `read_answer`)."""
        return self.resolved_method in STRUCTURED_METHODS

    @property
    def resolved_method(self) -> ExtractMethod:
        """The method in effect once the default has been applied."""
        if self.method is not None:
            return self.method
        return "regex" if self.regex is not None else "last_number"


def read_answer(text: str, spec: ExtractSpec) -> AnswerRead:
    """The answer in `text` as `spec` says to find it, and why there is none: the reason is
    given for a structured answer (`"json"`, `"tool_call"`: not JSON, not valid under the
    schema, not a call of the run's tools), None for text methods (nothing matched)."""
    method = spec.resolved_method
    if method in STRUCTURED_METHODS:
        return read_structured(
            text, method=method, schema=spec.schema_, tools=spec.tools, tool_choice=spec.tool_choice
        )
    return AnswerRead(extract_answer(text, spec))


def extract_answer(text: str, spec: ExtractSpec) -> str | None:
    """The answer in `text` as `spec` says to find it, or None (an abstention).

    Every method takes the LAST occurrence: a rationale may try intermediate values or restate
    the format (`"end with Answer: <n>"`) before it commits, and models commit at the end.
    The result is raw (not normalised) and stripped; an empty capture is an abstention.
    """
    method = spec.resolved_method
    if method in STRUCTURED_METHODS:
        return read_answer(text, spec).answer
    if method == "regex":
        assert spec.regex is not None  # guaranteed by validation
        found = _last_regex_group(text, re.compile(spec.regex))
    elif method == "last_number":
        found = _last_number(text)
    elif method == "boxed":
        found = _last_boxed(text)
    else:
        assert spec.field is not None  # guaranteed by validation
        found = _last_json_field(text, spec.field)
    if found is None:
        return None
    found = found.strip()
    return found or None


def _last_regex_group(text: str, pattern: re.Pattern[str]) -> str | None:
    last: str | None = None
    for match in pattern.finditer(text):
        group = match.group(1)
        if group is not None:  # a group outside the taken branch of an alternation
            last = group
    return last


def _last_number(text: str) -> str | None:
    last: str | None = None
    for match in _NUMBER.finditer(text):
        last = match.group(0)
    return None if last is None else last.replace("\u2212", "-")


def _balanced_end(text: str, open_at: int) -> int | None:
    """Index just past the `}` closing the `{` at `open_at`, or None when it never closes."""
    depth = 0
    for index in range(open_at, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return None


def _last_boxed(text: str) -> str | None:
    # A truncated last box (the lane hit max_tokens) falls back to the last one that closed.
    for match in reversed(list(_BOXED.finditer(text))):
        brace = match.end() - 1
        end = _balanced_end(text, brace)
        if end is not None:
            return text[brace + 1 : end - 1]
    return None


def _json_objects(text: str) -> list[dict[str, object]]:
    """The top-level JSON objects embedded in `text`, in order (objects inside them excluded)."""
    decoder = json.JSONDecoder(parse_float=Decimal)
    objects: list[dict[str, object]] = []
    index = text.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except ValueError:
            index = text.find("{", index + 1)
            continue
        if isinstance(value, dict):
            objects.append(value)
        index = text.find("{", end)
    return objects


def _last_json_field(text: str, path: str) -> str | None:
    objects = _json_objects(text)
    if not objects:
        return None
    value: object = objects[-1]
    for key in path.split("."):
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    return _stringify(value)


def _stringify(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | Decimal):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def normalize_answer(answer: str) -> str:
    """The canonical form of `answer`, so that answers meaning the same vote together.

    Collapses whitespace, casefolds, drops trailing `.,;:!?`, surrounding quotes or `$…$`, a
    currency `$` before a number, and a whole-string `\\boxed{…}`; numbers become canonical
    decimals (`1,000` -> `1000`, `3.0` -> `3`, `+5` -> `5`, `-0` -> `0`, `0.50` -> `0.5`) through
    `Decimal`, so no float rounding. Idempotent: it repeats one pass to a fixed point.
    A JSON object or array already in canonical form (a `"json"` or `"tool_call"` answer) is
    kept as it is: its strings keep their case and their spaces.
    """
    if answer[:1] in ("{", "[") and _canonical_structure(answer):
        return answer
    current = answer
    for _ in range(64):  # each pass only shortens or settles; the bound is a guard
        following = _normalize_pass(current)
        if following == current:
            return current
        current = following
    return current


def _canonical_structure(answer: str) -> bool:
    try:
        value = json.loads(answer, parse_float=Decimal)
    except (ValueError, RecursionError):
        return False
    try:
        return isinstance(value, dict | list) and canonical_json(value) == answer
    except (TypeError, ValueError, RecursionError):
        return False


def _normalize_pass(text: str) -> str:
    text = " ".join(text.replace("\u2212", "-").split()).casefold()
    text = text.rstrip(_TRAILING_PUNCT).rstrip()
    text = _unwrap(text)
    if text.startswith("$") and _WHOLE_NUMBER.fullmatch(text[1:]):
        text = text[1:]
    if _WHOLE_NUMBER.fullmatch(text):
        return _canonical_number(text)
    return text


def _unwrap(text: str) -> str:
    if len(text) >= 2:
        for opening, closing in _QUOTE_PAIRS:
            if text.startswith(opening) and text.endswith(closing):
                return text[len(opening) : -len(closing)].strip()
    match = _BOXED.match(text)
    if match is not None and _balanced_end(text, match.end() - 1) == len(text):
        return text[match.end() : -1].strip()
    return text


def _canonical_number(text: str) -> str:
    try:
        value = Decimal(text.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        return text
    if value.is_zero():
        return "0"
    return format(value.normalize(), "f")
