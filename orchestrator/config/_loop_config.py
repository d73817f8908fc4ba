"""Loop config files: TOML (or JSON) validated by pydantic, errors naming file and field."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)

import lanefold.backends  # registers the built-in backends
import lanefold.coordinators  # registers the built-in loops, reducers and verifiers
import lanefold.stores  # noqa: F401  # registers the built-in stores
from lanefold.config._defaults import DEFAULT_BACKEND_KIND, DEFAULT_LOOP, OTEL_HOOK
from lanefold.config._serve_section import ServeSection
from lanefold.primitives import (
    BACKENDS,
    HOOKS,
    REDUCERS,
    BackendSpec,
    ConfigError,
    ExtractSpec,
    Hook,
    JudgeSettings,
    LaneTokens,
    Limits,
    Loop,
    PluginImportError,
    PluginNotImportedError,
    Pricing,
    PromptForm,
    SamplingParams,
    compile_score_regex,
    hash_config,
    import_verifier,
    loop_reducer,
    reducer_traits,
    resolve_reducer,
)
from lanefold.primitives.internal import (
    backend_build_errors,
    backend_deprecated,
    backend_preflight,
    backend_prompt_forms,
    build_hook,
    extract_mismatch,
    hook_params,
    plugin_folders,
    reading_a_record,
    resolve_loop,
    store_for_url,
)

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from lanefold.primitives import RunState


# The facade's own hook registers as a plug-in's would, once; its module imports this one, so
# it is imported where a config first names it.
HOOKS.add_lazy(OTEL_HOOK, "lanefold.telemetry:OtelHook")

__all__ = (
    "DEFAULT_BACKEND",
    "MAX_CONFIG_BYTES",
    "MAX_NESTING",
    "VERSION",
    "BackendConfig",
    "JudgeBackendConfig",
    "LoopConfig",
    "backend_errors",
    "backend_preflight_errors",
    "build_errors",
    "config_errors",
    "config_hash",
    "load_backend_config",
    "load_config",
    "parse_config",
    "preflight",
    "recorded_config",
)

VERSION = metadata.version("lanefold")  # in every run.started: which version wrote a log
# How deep tables and arrays may nest in a config: a real one nests three or four deep; far
# deeper is a mistake or an attack, and validating it would exhaust Python's stack.
MAX_NESTING = 32
# A config (or keys) file is read no further than this: far past any real one (a keys file of
# ten thousand keys is about 2 MiB), so a device or a runaway file is one line, not a read forever.
MAX_CONFIG_BYTES = 4 << 20

# The facade's defaults, named once: a config without `[backend]` runs on the bundled engine
# on its bundled model (no server, no key).
DEFAULT_BACKEND: dict[str, Any] = {"kind": DEFAULT_BACKEND_KIND}

M = TypeVar("M", bound=BaseModel)
_log = logging.getLogger("lanefold.config")


def _backend_section(where: str) -> Any:
    """The validator of a `[backend]` table at `where`: its `kind` picks the registered model
    (or names one as `module:Class`), which validates the rest; errors name `where.<key>`."""

    def validate(value: Any) -> BackendSpec | None:
        if value is None and where != "backend":
            return None
        if isinstance(value, BaseModel):  # built in Python: a backend's own config model
            if not isinstance(value, BackendSpec):
                raise ValueError(
                    f"{where}: {type(value).__name__} is not a backend config "
                    f"(it has no 'kind' or no 'build')"
                )
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{where}: must be a table")
        try:
            return _backend_of(value, where)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        except ValidationError as exc:  # each error, named by its place: one line each
            raise ValueError("\n".join(_described(exc, where))) from None

    return PlainValidator(validate)


_BACKEND_SCHEMA = {"type": "object", "description": "a registered backend's keys, by kind"}
BackendConfig = Annotated[BackendSpec, _backend_section("backend"), WithJsonSchema(_BACKEND_SCHEMA)]
JudgeBackendConfig = Annotated[
    BackendSpec | None,
    _backend_section("judge.backend"),
    WithJsonSchema({"anyOf": [_BACKEND_SCHEMA, {"type": "null"}]}),
]


def _backend_of(raw: Mapping[str, Any], where: str = "backend") -> BackendSpec:
    """A `[backend]` table validated by the model its `kind` names: a ConfigError naming
    `where.kind` when that is unknown, a ValidationError for the rest."""
    kind = raw.get("kind")
    if not isinstance(kind, str):
        known = ", ".join(BACKENDS.names())
        said = "required" if kind is None else "must be a string"
        raise ConfigError(f"{where}.kind: {said} (known: {known}; or give 'module:attr')")
    found: type[BaseModel] = BACKENDS.resolve(kind, key=f"{where}.kind")
    model = _kind_model(found, kind)
    document = json.dumps(dict(raw), default=str)
    strict = _strict(model)
    if strict is not model:  # the plug-in's own model may allow unknown keys: refused here
        strict.model_validate_json(document, strict=True)
    spec: Any = model.model_validate_json(document, strict=True)  # a BackendSpec: registered
    return cast(BackendSpec, spec)


@functools.cache
def _kind_model(model: type[BaseModel], kind: str) -> type[BaseModel]:
    """`model`, its `kind` the name it was found by: a model named as `module:Class` (or
    registered by a name not its own) records that name, so the record finds it again."""
    if model.model_fields["kind"].default == kind:
        return model
    named: Any = Literal[kind]  # a Literal of a value known at run time
    return create_model(model.__name__, __base__=model, __module__=model.__module__, kind=(named, kind))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LoopSection(BaseModel):
    """`[loop]`: the keys every loop shares (which coordinator, the seed, how many lanes at
    once, the per-request timeout, the gateway's reply without an answer); every other key is
    the chosen loop's, validated by its `Params` (and filled with its defaults, so a recorded
    config is whole)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    coordinator: str = Field(DEFAULT_LOOP, description="a registered loop's name, or 'module:Class'")
    max_concurrency: int = Field(16, ge=1)
    seed: int = 0
    timeout_s: float | None = Field(None, gt=0, description="per backend request")
    # What the gateway replies for a run without an answer: an error (`no_answer`), or the best
    # lane's text marked as no answer. Recorded only when not the default (old hashes hold).
    on_no_answer: Literal["error", "best_lane"] = Field(
        "error",
        exclude_if=lambda v: v == "error",
        description="the gateway's reply without an answer: an error, or the best lane marked so",
    )


class RetrySection(_Section):
    """`[retry]`: attempts per lane and exponential backoff with jitter between them."""

    max_attempts: int = Field(3, ge=1, le=100)
    initial_backoff_s: float = Field(0.25, ge=0)
    max_backoff_s: float = Field(8.0, ge=0)
    jitter: float = Field(0.25, ge=0, le=1)


class PromptSection(_Section):
    """`[prompt]`: the template every lane is sent, with `{question}` in it, and the form it is
    sent in (`form`, one rule for every entry: run, eval, compare, sweep, Session, gateway).
    "chat": the prompt is the user's turn of a chat the backend renders through the model's
    chat template; "raw": it is sent as it is (a completion); "auto": "chat" where the backend
    takes a chat, and, for a gateway `/v1/completions` request, "raw" where it takes raw text."""

    template: str = "Question: {question}\nThink briefly, then end with 'Answer: <answer>'.\n"
    form: Literal["auto", "chat", "raw"] = Field(
        "auto", description="how each lane's prompt reaches the model: a chat turn, or raw text"
    )

    @field_validator("template")
    @classmethod
    def _has_question(cls, value: str) -> str:
        if "{question}" not in value:
            raise ValueError("template must contain {question}")
        return value


class SamplingSection(_Section):
    """`[sampling]`: shared by every lane; `max_tokens` is each lane's ceiling."""

    temperature: float = Field(0.7, ge=0, le=5)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_tokens: LaneTokens = Field(256, ge=1)
    stop: list[str] = []
    logprobs: bool = False
    # Which of a gateway request's own sampling fields its sampled lanes take instead of the
    # above (none by default: the loop's settings are what was compared and chosen).
    from_request: list[Literal["temperature", "top_p"]] = Field([], exclude_if=lambda v: not v)


class JudgeSection(_Section):
    """`[judge]`: what judging reducers use: an LLM judge (template, its sampling, its
    backend), a verifier (`module:function` or a command), usc's template."""

    template: str | None = None
    verifier: str | None = Field(
        None,
        description="a registered verifier's NAME or NAME:ARG (command:ARGV), "
        "or module:function returning a score",
    )
    verifier_command: list[str] | None = Field(
        None,
        min_length=1,
        description="the candidate on stdin; exit 0 passes; a number on stdout is the score",
    )
    verifier_timeout_s: float = Field(30.0, gt=0)
    backend: JudgeBackendConfig = None
    temperature: float = Field(0.0, ge=0, le=5)
    max_tokens: LaneTokens = Field(64, ge=1)
    stop: list[str] = []
    score_regex: str | None = Field(None, description="the judge's score: group 1 (or `num`)")
    usc_template: str | None = Field(
        None, description="universal self-consistency's prompt: {question}, {candidates}"
    )

    @field_validator("score_regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                compile_score_regex(value)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix("judge.score_regex: ")) from None
        return value

    @field_validator("template")
    @classmethod
    def _has_candidate(cls, value: str | None) -> str | None:
        if value is not None and "{candidate}" not in value:
            raise ValueError("template must contain {candidate}")
        return value

    @field_validator("verifier")
    @classmethod
    def _module_function(cls, value: str | None) -> str | None:
        named = value is not None and re.fullmatch(r"[a-z][a-z0-9_]*", value) is not None
        if value is not None and not named and not all(value.partition(":")[::2]):
            raise ValueError(
                "verifier must look like 'module:function' (or a registered verifier's NAME or NAME:ARG)"
            )
        return value


class BudgetSection(Limits):
    """`[budget]`: the run's own limits, and `shared`: the name of a budget in the store
    (`[store] url`) that every run naming it spends from too, on any machine."""

    shared: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
        exclude_if=lambda v: v is None,
        description="a named budget in the PostgreSQL store, shared by a fleet of runs",
    )


class LogSection(_Section):
    """`[log]`: when the event log is forced to disk."""

    fsync: Literal["always", "barrier", "never"] = "barrier"


class StoreSection(_Section):
    """`[store]`: where runs are recorded. Not part of the recorded config (a run is the same
    run in any store), so no URL, let alone a password, is ever written to a log."""

    url: str | None = None
    password_env: str | None = None

    @field_validator("url")
    @classmethod
    def _served(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            store_for_url(value)  # a scheme some registered store serves
        except ConfigError as exc:
            raise ValueError(str(exc).removeprefix("store.url: ")) from None
        parts = urlsplit(value)
        if parts.password is not None:
            raise ValueError("put the password in the environment variable named by store.password_env")
        return value

    @field_validator("password_env")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "a").isalnum():
            raise ValueError("must name an environment variable (letters, digits, _)")
        return value


class HookSection(BaseModel):
    """One `[[hooks]]` table: `kind` (a registered hook's name or `module:attr`) and the
    hook's own keys, checked by its `Params` when the config is read (`_hook_errors`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str


class LoopConfig(_Section):
    """A whole loop config file."""

    loop: LoopSection = LoopSection()
    prompt: PromptSection = PromptSection()
    sampling: SamplingSection = SamplingSection()
    extract: ExtractSpec = ExtractSpec(regex=r"Answer:\s*(.+)")
    backend: BackendConfig = Field(default_factory=lambda: _backend_of(DEFAULT_BACKEND))
    budget: BudgetSection = BudgetSection()
    pricing: Pricing = Pricing()
    retry: RetrySection = RetrySection()
    judge: JudgeSection = JudgeSection()
    log: LogSection = LogSection()
    store: StoreSection = Field(default=StoreSection(), exclude=True)
    # How the gateway serves the file (the models it may run it over): not part of a run either.
    serve: ServeSection = Field(default=ServeSection(), exclude=True)
    # Recorded only when given (a config without hooks hashes as before), so a worker or a
    # resume builds the same hooks from the recorded config.
    hooks: list[HookSection] = Field(default=[], exclude_if=lambda v: not v)

    _loop_params: BaseModel | None = PrivateAttr(None)
    _folder: str | None = PrivateAttr(None)
    _recorded_before_form: bool = PrivateAttr(False)  # a log written before `[prompt] form`
    _recorded: dict[str, Any] | None = PrivateAttr(None)  # `recorded()`, made once
    _hash: str | None = PrivateAttr(None)  # `config_hash`, made once

    @model_validator(mode="after")
    def _consistent(self) -> LoopConfig:
        choice = loop_reducer(resolve_loop(self.loop.coordinator), self.loop_params)
        if choice is not None and choice.name:
            _check_judge(self.judge, choice.name, choice.judge_keys)
        for where, backend in _backends(self):
            forms = backend_prompt_forms(backend)
            if self.prompt.form != "auto" and self.prompt.form not in forms:
                raise ValueError(
                    f'prompt.form: "{self.prompt.form}", but {where} (kind "{backend.kind}") as '
                    f'configured sends only "{forms[0]}" prompts'
                )
        spec = self.backend
        if self.serve.models and not (isinstance(spec, BaseModel) and "model" in type(spec).model_fields):
            raise ValueError(f'serve.models: backend kind "{self.backend.kind}" has no model to choose')
        return self

    def prompt_form(
        self, backend: BackendSpec | None = None, *, completion: bool = False
    ) -> PromptForm | None:
        """How this config's lanes send their prompt to `backend` (default: its `[backend]`):
        `[prompt] form`, "auto" resolved by what the backend takes ("chat" first; "raw" first
        for a `completion`, a gateway `/v1/completions` request). None for a run recorded
        before `form` was a key: it resumes by the rule it ran with (`Dispatcher`)."""
        if self._recorded_before_form:
            return None
        forms = backend_prompt_forms(backend or self.backend)
        if self.prompt.form != "auto":
            return self.prompt.form
        return "raw" if completion and "raw" in forms else forms[0]

    def with_form(self, form: PromptForm) -> LoopConfig:
        """This config with `[prompt] form` set (itself when it says so already)."""
        if self.prompt.form == form:
            return self
        raw = self.model_dump(mode="json")
        raw["prompt"]["form"] = form
        return parse_config(raw, folder=self.folder)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> LoopConfig:
        """A copy; one with `update` made says something else: what was made once is made anew."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            copied._recorded = copied._hash = copied._loop_params = None
        return copied

    def recorded(self) -> dict[str, Any]:
        """The config as a run records it (`run.started`'s `config`: `model_dump(mode="json")`),
        made once, as a config is frozen: every run of a served config records the same one.
        The same dict is returned each time: read it, never change it."""
        if self._recorded is None:
            self._recorded = self.model_dump(mode="json")
        return self._recorded

    @property
    def loop_params(self) -> BaseModel:
        """The chosen loop's validated `Params` (its `[loop]` keys)."""
        if self._loop_params is None:
            self._loop_params = _loop_params(self.loop)
        return self._loop_params

    def __eq__(self, other: object) -> bool:
        """Equal configs say the same; where each was read from is not part of what it says."""
        if not isinstance(other, LoopConfig):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = _Section.__hash__

    @property
    def folder(self) -> str | None:
        """The folder of the file this config was read from (None: built in code), where its
        `module:attr` plug-ins are looked up first; runs record it."""
        return self._folder

    def build_hooks(self) -> list[Hook]:
        """The hooks the `[[hooks]]` tables name, built fresh (one set per run)."""
        built: list[Hook] = []
        with plugin_folders(self._folder):
            for i, section in enumerate(self.hooks, 1):
                found = HOOKS.resolve(section.kind, key=f"hooks[{i}].kind")
                built.append(build_hook(found, section.__pydantic_extra__ or {}))
        return built

    def loop_class(self) -> type[Loop]:
        with plugin_folders(self._folder):
            return resolve_loop(self.loop.coordinator)

    def judge_settings(self) -> JudgeSettings:
        j = self.judge
        return JudgeSettings(
            template=j.template,
            params=SamplingParams(temperature=j.temperature, max_tokens=j.max_tokens, stop=tuple(j.stop)),
            score_regex=j.score_regex,
            usc_template=j.usc_template,
        )

    def with_seed(self, seed: int | None) -> LoopConfig:
        """This config with its loop seed set to `seed` (itself when `seed` is None or the
        same): a run's own seed, as an eval gives question i the seed `loop.seed + i`."""
        if seed is None or seed == self.loop.seed:
            return self
        raw = self.model_dump(mode="json")
        raw["loop"]["seed"] = seed
        seeded = parse_config(raw, folder=self.folder)
        seeded._recorded_before_form = self._recorded_before_form  # sent as it was recorded
        return seeded

    def sampling_params(self) -> SamplingParams:
        s = self.sampling
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_tokens=s.max_tokens,
            stop=tuple(s.stop),
            logprobs=s.logprobs,
        )


_SHARED_LOOP_KEYS = frozenset(LoopSection.model_fields)


def _loop_params(section: LoopSection) -> BaseModel:
    """Validate the loop's own `[loop]` keys with its Params; fill in its defaults."""
    try:
        cls = resolve_loop(section.coordinator)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    extra = dict(section.__pydantic_extra__ or {})
    try:
        _strict(cls.Params).model_validate_json(json.dumps(extra), strict=True)
        params: BaseModel = cls.Params.model_validate_json(json.dumps(extra), strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        if error["type"] == "value_error" and not where:
            where, _, message = str(error["ctx"]["error"]).partition(": ")
            where = where.removeprefix("loop.")
        raise ValueError(f"loop.{where}: {message}") from None
    # The recorded config is whole: the loop's defaults are written out as its keys.
    if section.__pydantic_extra__ is not None:
        section.__pydantic_extra__.update(params.model_dump(mode="json"))
    return params


def _check_judge(judge: JudgeSection, reducer: str, loop_keys: frozenset[str]) -> None:
    """A reducer that needs a judge has one; [judge] keys no reducer reads are refused."""
    keys = reducer_traits(resolve_reducer(reducer)).judge_keys
    if keys is None:
        return
    ignored = sorted(
        key
        for key in judge.model_fields_set - keys - loop_keys
        if getattr(judge, key) != JudgeSection.model_fields[key].default
    )
    if ignored:
        key = ignored[0]
        readers = [name for name, cls in REDUCERS.items() if key in (reducer_traits(cls).judge_keys or {key})]
        raise ValueError(
            f"judge.{key}: the {reducer} reducer ignores it; set loop.reducer to "
            f"one that reads it ({', '.join(readers)}) or remove it"
        )


def parse_config(
    raw: dict[str, Any], *, source: str = "<config>", folder: str | Path | None = None
) -> LoopConfig:
    """Validate a config mapping; a bad one raises ConfigError naming source and field.

    Validation is strict, as for JSON: `k = true` or `k = "8"` is an error, not a coercion.
    `folder` is where the config's `module:attr` plug-ins are looked up first (then the
    working directory); `load_config` gives the file's own.
    """
    with plugin_folders(folder):
        config = _parse(raw, source)
    config._folder = str(Path(folder).resolve()) if folder is not None else None
    return config


class _Said(str):
    """One line of `_validate`'s errors that came from a plug-in that cannot be imported: it
    keeps the error, so `_parse` raises its class (a reader acts on the class, never the words)."""

    error: PluginImportError

    @classmethod
    def of(cls, line: str, error: PluginImportError) -> _Said:
        said = cls(line)
        said.error = error
        return said


def _parse(raw: dict[str, Any], source: str) -> LoopConfig:
    config, errors = _validate(raw, source)
    if config is None:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        first = errors[0]
        if isinstance(first, _Said):
            raise PluginImportError(f"{first}{more}", key=first.error.key, spec=first.error.spec) from None
        raise ConfigError(f"{first}{more}") from None
    return config


def _validate(raw: dict[str, Any], source: str) -> tuple[LoopConfig | None, list[str]]:
    """The config, or None and every error found, one `source: where: what` line each.

    The `[loop]` keys (shared and the loop's own) are checked in one pass, then the rest; a
    check across fields (a judge for a reducer, the quorum within k) runs once the fields it
    reads are valid, so it can show up only when those are fixed.
    """
    if _deeper_than(raw, MAX_NESTING):
        return None, [
            f"{source}: nested deeper than {MAX_NESTING} levels (tables and arrays within each other)"
        ]
    bad = list(_non_finite(raw))
    if bad:
        return None, [f"{source}: {where or '(top level)'}: must be a finite number" for where in bad]
    try:
        document = json.dumps(raw, default=str)
    except (TypeError, ValueError) as exc:
        return None, [f"{source}: (top level): {exc}"]
    errors: list[str] = []
    loop = raw.get("loop")
    if isinstance(loop, dict):  # the shared keys and the loop's own, in one pass
        coordinator = loop.get("coordinator", DEFAULT_LOOP)
        if isinstance(coordinator, str):
            try:
                loop_class: Any = resolve_loop(coordinator)
                section = _section_model(loop_class)
                section.model_validate_json(json.dumps(loop, default=str), strict=True)
            except PluginImportError as exc:
                errors.append(_Said.of(f"{source}: {exc}", exc))
            except ConfigError as exc:
                errors.append(f"{source}: {exc}")
            except ValidationError as exc:
                errors += [f"{source}: {line}" for line in _described(exc, "loop")]
    hooks = raw.get("hooks")
    told = len(errors)
    if isinstance(hooks, list):
        for i, table in enumerate(hooks, 1):
            if isinstance(table, Mapping):
                errors += [f"{source}: {line}" for line in _hook_errors(table, i)]
    try:
        config = LoopConfig.model_validate_json(document, strict=True)
    except ValidationError as exc:
        lines = _described(exc)
        if told:  # `[loop]` is told above already, in its loop's own words
            lines = [line for line in lines if not line.startswith(("loop:", "loop."))]
        if len(errors) > told:  # and the hooks, in their own
            lines = [line for line in lines if not line.startswith("hooks.")]
        return None, errors + [f"{source}: {line}" for line in lines]
    return (None, errors) if errors else (config, [])


def _hook_errors(table: Mapping[str, Any], i: int) -> list[str]:
    """What is wrong with the `i`th `[[hooks]]` table (counted from 1, as in the file): its
    `kind` unknown, or a key its hook's `Params` refuses (`hooks[i].<key>: ...`)."""
    where = f"hooks[{i}]"
    kind = table.get("kind")
    if not isinstance(kind, str):
        return [f"{where}.kind: a hook's name or 'module:attr' is required"]
    try:
        found = HOOKS.resolve(kind, key=f"{where}.kind")
    except ConfigError as exc:
        if isinstance(exc, PluginNotImportedError):
            return []  # `tail`/`show` read a record and never run its hooks
        return [str(exc)]
    keys = {key: value for key, value in table.items() if key != "kind"}
    params = hook_params(found)
    if params is None:
        return [f"{where}.{key}: unknown key ({kind} takes no keys)" for key in keys]
    try:
        _strict(params).model_validate_json(json.dumps(keys, default=str), strict=True)
    except ValidationError as exc:
        return _described(exc, where)
    return []


def _described(exc: ValidationError, prefix: str = "") -> list[str]:
    """`where: what` for each error of a validation, in its order."""
    return [line for error in exc.errors() for line in _describe(error, prefix)]


def _describe(error: ErrorDetails, prefix: str = "") -> list[str]:
    """`where: what` for one error of a validation (a plug-in's section: one for each of its
    errors)."""
    where = ".".join([prefix] * bool(prefix) + [str(part) for part in error["loc"]])
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = "unknown key"
    if error["type"] == "value_error":
        said = str(error["ctx"]["error"])
        if where and said.startswith((f"{where}.", f"{where}:")):
            # A plug-in's section, validated by its own model: its lines name their keys.
            return said.splitlines()
        if where in ("", prefix):
            # A check across fields names its own field: "loop.min_quorum: ...".
            where, _, message = said.partition(": ")
    return [f"{where or '(top level)'}: {message}"]


@functools.cache
def _section_model(loop: Any) -> type[BaseModel]:
    """`[loop]` as one model for `loop`: its Params' keys, then the shared ones."""
    shared: dict[str, Any] = {
        name: (field.annotation, field) for name, field in LoopSection.model_fields.items()
    }
    return create_model(f"{loop.__name__}Section", __base__=_strict(loop.Params), **shared)


@functools.cache
def _strict(params: type[M]) -> type[M]:
    """A plug-in's model (a loop's `Params`, a backend's config) refusing unknown keys,
    whatever its own model config allows: a key no plug-in reads is a typo to name, never a
    setting to drop."""
    if params.model_config.get("extra") == "forbid":
        return params
    config = ConfigDict(**{**params.model_config, "extra": "forbid"})
    strict: type[M] = type(
        params.__name__, (params,), {"model_config": config, "__module__": params.__module__}
    )
    return strict


def _non_finite(value: object, where: str = "") -> Iterator[str]:
    """The dotted place of each NaN or infinity in a config (TOML has `nan` and `inf`)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield where
    items: list[tuple[object, object]] = []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = list(enumerate(value))
    for key, item in items:
        yield from _non_finite(item, f"{where}.{key}" if where else str(key))


def _deeper_than(value: object, limit: int) -> bool:
    """Whether tables and arrays nest more than `limit` deep in `value`; walked without
    recursion, so a document nested 100,000 deep is measured, not a RecursionError."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterator[object] | None = None
        if isinstance(item, Mapping):
            children = iter(item.values())
        elif isinstance(item, list | tuple):
            children = iter(item)
        if children is not None:
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in children)
    return False


def load_config(path: str | Path) -> LoopConfig:
    """Read a TOML (or `.json`) loop config file; a deprecated key in it is logged once, as a
    warning naming its replacement (the command line shows it)."""
    path = Path(path)
    config = parse_config(_read(path), source=str(path), folder=path.parent)
    for where, backend in _backends(config):
        for line in backend_deprecated(backend):
            _log.warning("%s: %s.%s", path, where, line)
    return config


def load_backend_config(path: str | Path) -> BackendSpec:
    """Read a backend config: a file holding a `[backend]` table, or only the backend's keys
    (a `kind = "module:Class"` is looked up beside the file first)."""
    path = Path(path)
    raw = _read(path)
    section = raw.get("backend", raw)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: backend: must be a table")
    return parse_config({"backend": section}, source=str(path), folder=path.parent).backend


def read_table(path: str | Path) -> dict[str, Any]:
    """A TOML (or `.json`) file as a table, read as a loop config is: an unreadable, invalid
    or too deeply nested file is one ConfigError naming it."""
    return _read(Path(path))


def describe_errors(exc: ValidationError, prefix: str = "") -> list[str]:
    """A model's validation errors as `where: what` lines, as a config's are told."""
    return _described(exc, prefix)


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:  # read no further than the bound: /dev/zero ends too
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes, more than any config holds")
    try:
        text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as read_text reads
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    too_deep = ConfigError(
        f"{path}: nested deeper than {MAX_NESTING} levels (tables and arrays within each other)"
    )
    if path.suffix != ".json" and _longest_dotted_key(text) > MAX_NESTING:
        raise too_deep  # before tomllib, whose time grows with the square of a key's parts
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {exc}"
        ) from None
    except RecursionError:  # the parsers recurse: nesting past Python's stack is refused here
        raise too_deep from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: (top level): must be a table")
    return raw


def _longest_dotted_key(text: str) -> int:
    """The most dots in one run of a TOML text between `=`, `,`, brackets and line ends,
    strings and comments skipped: a dotted key's parts less one (a value holds at most one,
    `1.5`). A scan in one pass, so a key of 100,000 parts is refused at once."""
    most = dots = i = 0
    while i < len(text):
        char = text[i]
        if char in "\"'":
            quote = char * 3 if text.startswith(char * 3, i) else char
            i += len(quote)
            while i < len(text) and not text.startswith(quote, i):
                if len(quote) == 1 and text[i] == "\n":
                    break  # an unclosed one-line string: tomllib will say so
                i += 2 if char == '"' and text[i] == "\\" else 1
            i += len(quote)
            continue
        if char == "#":
            i = text.find("\n", i)
            if i < 0:
                break
        elif char == ".":
            dots += 1
            most = max(most, dots)
        elif char in "=,[]{}\n":
            dots = 0
        i += 1
    return most


def preflight(config: LoopConfig, source: str = "<config>", *, verifier_given: bool = False) -> None:
    """What validation alone cannot see, checked before a run is created: a reducer that
    needs a judge has one (`verifier_given`: the caller passes a verifier), the verifier
    imports, and what each backend checks before a run (its `preflight`: an engine's model
    exists). Raises ConfigError naming the first that fails."""
    first = next(_preflight_errors(config, source, verifier_given=verifier_given), None)
    if first is not None:
        raise ConfigError(first)


def config_errors(path: str | Path) -> list[str]:
    """Every error of the config file at `path` that `load_config`, `preflight` and building
    its backends would refuse it for, one `file: where: what` line each (they raise only the
    first); [] when it is valid. What `orchestrator validate` lists, with the store's."""
    path = Path(path)
    try:
        raw = _read(path)
    except ConfigError as exc:
        return [str(exc)]  # unreadable: nothing further to check
    with plugin_folders(path.parent):
        config, errors = _validate(raw, str(path))
    if config is None:
        return errors
    config._folder = str(path.parent.resolve())
    return [*_preflight_errors(config, str(path)), *build_errors(config, str(path))]


def build_errors(
    config: LoopConfig, source: str = "<config>", environ: Mapping[str, str] = os.environ
) -> Iterator[str]:
    """What building the config's backends would refuse (a run builds them before it is
    created), found without building anything: each backend's own `build_errors` (an API key
    it would not send, an optional extra not installed)."""
    for where, backend in _backends(config):
        yield from backend_errors(backend, source, where, environ)


def backend_errors(
    backend: BackendSpec, source: str, where: str = "backend", environ: Mapping[str, str] = os.environ
) -> Iterator[str]:
    """`build_errors` of one backend section (`where`: its key), for `serve` too."""
    for line in backend_build_errors(backend, environ):
        yield f"{source}: {where}.{line}"


def backend_preflight_errors(backend: BackendSpec, source: str, where: str = "backend") -> Iterator[str]:
    """The backend's own `preflight` lines (a model on disk), for `serve` too."""
    for line in backend_preflight(backend):
        yield f"{source}: {where}.{line}"


def _backends(config: LoopConfig) -> Iterator[tuple[str, BackendSpec]]:
    """Each backend section of the config and its key."""
    yield "backend", config.backend
    if config.judge.backend is not None:
        yield "judge.backend", config.judge.backend


def _preflight_errors(config: LoopConfig, source: str, *, verifier_given: bool = False) -> Iterator[str]:
    """Each of `preflight`'s refusals, one line each, in the order it checks them."""
    choice = loop_reducer(config.loop_class(), config.loop_params)
    if choice is not None and choice.name:
        reducer = choice.name
        traits = reducer_traits(resolve_reducer(reducer))
        j = config.judge
        has_verifier = verifier_given or j.verifier is not None or j.verifier_command is not None
        # weighting = "verifier" needs one whatever the reducer (the loop's keys allow it only
        # where the reducer reads it)
        needs_verifier = traits.needs_verifier or choice.options.weighting == "verifier"
        if needs_verifier and not has_verifier:
            yield (
                f"{source}: judge.verifier: reducer {reducer} needs a verifier "
                f"(judge.verifier or judge.verifier_command)"
            )
        if traits.needs_judge and j.template is None and not has_verifier:
            yield (
                f"{source}: judge.template: reducer {reducer} needs "
                f"judge.template, judge.verifier or judge.verifier_command"
            )
        mismatch = extract_mismatch(
            resolve_reducer(reducer), config.extract.resolved_method, f"reducer {reducer}"
        )
        if mismatch is not None:
            yield f"{source}: extract.method: {mismatch}"
    if config.judge.verifier is not None:
        try:
            with plugin_folders(config.folder):
                verifier = import_verifier(config.judge.verifier)
        except ConfigError as exc:
            yield f"{source}: {exc}"
        else:
            what = f"verifier {config.judge.verifier}"
            mismatch = extract_mismatch(verifier, config.extract.resolved_method, what)
            if mismatch is not None:
                yield f"{source}: extract.method: {mismatch}"
    for where, backend in _backends(config):
        yield from backend_preflight_errors(backend, source, where)


def recorded_config(state: RunState, source: str) -> LoopConfig:
    """The config a log recorded, validated by this version; names the field and the
    version that wrote it when it no longer validates."""
    assert state.started is not None
    try:
        with reading_a_record():  # a header named as a secret since: the log stays readable
            config = parse_config(
                state.started.config, source=f"{source}:1: recorded config", folder=state.started.config_dir
            )
    except PluginImportError as exc:
        if exc.key == "loop.coordinator":  # no other version would read it: where to run it
            folder = state.started.config_dir or "the folder of its config"
            raise PluginImportError(
                f"{exc}; the loop must be importable to go on: run from {folder} "
                f"or put the folder that holds it on PYTHONPATH",
                key=exc.key,
                spec=exc.spec,
            ) from None
        raise _written_by(exc, state.started.library_version) from None
    except ConfigError as exc:
        raise _written_by(exc, state.started.library_version) from None
    prompt = state.started.config.get("prompt")
    # A log from before `[prompt] form`: its lanes sent what the rule of its day said, and a
    # resume must send the same (a wave's missing lanes, a later wave of the same run).
    config._recorded_before_form = not (isinstance(prompt, dict) and "form" in prompt)
    return config


def _written_by(exc: ConfigError, version: str) -> ConfigError:
    """A recorded config this version refuses, said with the version that wrote it."""
    return ConfigError(f"{exc} (written by lanefold {version}, this is {VERSION})")


def config_hash(config: LoopConfig) -> str:
    """sha256 of the resolved config's canonical JSON: two runs with one hash ran one config.
    Made once a config (it is frozen)."""
    if config._hash is None:
        config._hash = hash_config(config.recorded())
    return config._hash
