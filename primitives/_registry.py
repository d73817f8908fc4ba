"""Registries of loops and reducers: the names config files use.

A loop or reducer is registered with a decorator (`@register_loop`, `@register_reducer`), by
an installed package's entry point (groups `lanefold.loops` and `lanefold.reducers`, loaded on
first lookup), or named in a config as `package.module:ClassName`, imported on demand.

Every `module:attr` a config or a flag names (a loop, a reducer, a verifier, a scorer) is
imported by `import_object`, which looks in the config's folder first, then the working
directory, then the usual `sys.path`: the same for the command line and for Python.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from lanefold.primitives._errors import ConfigError

__all__ = (
    "import_object",
    "loop_names",
    "plugin_folders",
    "reducer_names",
    "register_loop",
    "register_reducer",
    "resolve_loop",
    "resolve_reducer",
    "without_plugin_imports",
)

T = TypeVar("T", bound=type[Any])

_LOOPS: dict[str, type[Any]] = {}
_REDUCERS: dict[str, type[Any]] = {}
_ENTRY_POINTS_LOADED: set[str] = set()


_NAME = re.compile(r"[a-z][a-z0-9_]*")
_FOLDERS: ContextVar[tuple[str, ...]] = ContextVar("lanefold_plugin_folders", default=())
_SKIPPED: ContextVar[list[str] | None] = ContextVar("lanefold_plugin_skipped", default=None)
_PATH_LOCK = threading.RLock()  # sys.path is the process's: one temporary change at a time


@contextlib.contextmanager
def without_plugin_imports() -> Iterator[list[str]]:
    """Within the block, `import_object` imports nothing new: a module not imported yet is a
    ConfigError, its spec added to the list yielded. For readers of a record (`tail`, `show`),
    which print what was recorded and never need to run a plug-in's code."""
    skipped: list[str] = []
    token = _SKIPPED.set(skipped)
    try:
        yield skipped
    finally:
        _SKIPPED.reset(token)


@contextlib.contextmanager
def plugin_folders(*folders: str | Path | None) -> Iterator[None]:
    """Within the block, `import_object` looks in `folders` (a config's own folder) before
    the working directory. Nested blocks look in the inner folders first."""
    named = tuple(str(Path(f).resolve()) for f in folders if f)
    token = _FOLDERS.set(tuple(dict.fromkeys((*named, *_FOLDERS.get()))))
    try:
        yield
    finally:
        _FOLDERS.reset(token)


def import_object(spec: str, *, key: str) -> Any:
    """The object `module:attr` names (`attr` may be dotted: `module:Class.method`).

    The module is looked up in the folders of `plugin_folders`, then the working directory,
    then `sys.path`; those folders are on the path only while it imports (a module beside its
    config may import its own siblings). Any failure, an exit at import included, is a
    ConfigError naming `key`.
    """
    module_name, colon, attr = spec.partition(":")
    if not (module_name and colon and attr):
        raise ConfigError(f"{key}: {spec!r} must look like 'module:attr'")
    skipped = _SKIPPED.get()
    if skipped is not None and module_name not in sys.modules:
        skipped.append(spec)
        raise ConfigError(f"{key}: {spec!r} is not imported by a reader of the record")
    try:
        found: Any = _import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (Exception, SystemExit) as exc:  # a user's module may fail (or exit) in any way
        raise ConfigError(f"{key}: cannot import {spec!r}: {type(exc).__name__}: "
                          f"{exc}") from None
    return found


def _import_module(name: str) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    search = [*_FOLDERS.get(), os.getcwd()]
    with _PATH_LOCK:
        added = [folder for folder in dict.fromkeys(search) if folder not in sys.path]
        sys.path[:0] = added
        try:
            return importlib.import_module(name)
        finally:
            for folder in added:
                with contextlib.suppress(ValueError):
                    sys.path.remove(folder)


def register_loop(cls: T) -> T:
    """Class decorator: make a loop available by its `name` (`coordinator = "<name>"`).

    The name is lower case, digits and `_` (it names the loop's events, `loop.<name>.<noun>`).
    """
    for attr in ("name", "Params", "run"):
        if not hasattr(cls, attr):
            raise TypeError(f"{cls.__qualname__} is not a Loop: it has no {attr!r}")
    _check_name(cls)
    _register(_LOOPS, cls, "loop")
    return cls


def _check_name(cls: type[Any]) -> None:
    if not isinstance(cls.name, str) or not _NAME.fullmatch(cls.name):
        raise ConfigError(f"loop.coordinator: {cls.__qualname__}.name {cls.name!r} must be "
                          f"lower case letters, digits and '_' (it names the loop's events)")


def register_reducer(cls: T) -> T:
    """Class decorator: make a reducer available by its `name` (`reducer = "<name>"`)."""
    for attr in ("name", "reduce"):
        if not hasattr(cls, attr):
            raise TypeError(f"{cls.__qualname__} is not a Reducer: it has no {attr!r}")
    _register(_REDUCERS, cls, "reducer")
    return cls


def _register(table: dict[str, type[Any]], cls: type[Any], what: str) -> None:
    name = cls.name
    known = table.get(name)
    if known is not None and known is not cls and _qualified(known) != _qualified(cls):
        raise ConfigError(f"{what} {name!r} is registered twice: {_qualified(known)} and "
                          f"{_qualified(cls)}")
    table[name] = cls


def _qualified(cls: type[Any]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _load_entry_points(group: str, key: str | None = None) -> None:
    """Register every entry point of `group`; one that fails (or exits) at import is a
    ConfigError naming `key`, the config key that asked for the lookup, where there is one."""
    if group in _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED.add(group)
    table = _LOOPS if group == "lanefold.loops" else _REDUCERS
    for entry in importlib.metadata.entry_points(group=group):
        try:
            found = entry.load()  # importing the module also runs its @register_* decorators
        except (Exception, SystemExit) as exc:  # a broken plug-in must not end the process
            where = f"{key}: " if key else ""
            raise ConfigError(f"{where}entry point {entry.name!r} in {group}: cannot load "
                              f"{entry.value!r}: {type(exc).__name__}: {exc}") from None
        name = getattr(found, "name", None)
        if isinstance(found, type) and isinstance(name, str):
            if group == "lanefold.loops":
                _check_name(found)
            table.setdefault(name, found)
            table.setdefault(entry.name, found)  # the entry point's name works too


def _resolve(table: dict[str, type[Any]], spec: str, *, group: str, key: str,
             what: str) -> type[Any]:
    if ":" in spec:
        found = import_object(spec, key=key)
        if not isinstance(found, type):
            raise ConfigError(f"{key}: {spec!r} is not a class")
        return found
    if spec not in table:
        _load_entry_points(group, key)
    cls = table.get(spec)
    if cls is None:
        raise ConfigError(f"{key}: unknown {what} {spec!r} (known: "
                          f"{', '.join(sorted(table)) or 'none'}; or give 'module:Class')")
    return cls


def resolve_loop(spec: str) -> type[Any]:
    """The loop class a `coordinator` value names (a registered name or `module:Class`)."""
    cls = _resolve(_LOOPS, spec, group="lanefold.loops", key="loop.coordinator", what="loop")
    for attr in ("name", "Params", "run"):
        if not hasattr(cls, attr):
            raise ConfigError(f"loop.coordinator: {spec!r} is not a Loop (it has no {attr!r})")
    _check_name(cls)
    return cls


def resolve_reducer(spec: str, *, key: str = "loop.reducer") -> type[Any]:
    """The reducer class a `reducer` value names (a registered name or `module:Class`)."""
    cls = _resolve(_REDUCERS, spec, group="lanefold.reducers", key=key, what="reducer")
    if not hasattr(cls, "reduce"):
        raise ConfigError(f"{key}: {spec!r} is not a Reducer (it has no 'reduce')")
    return cls


def loop_names() -> list[str]:
    """Every registered loop, entry points included."""
    _load_entry_points("lanefold.loops")
    return sorted(_LOOPS)


def reducer_names() -> list[str]:
    _load_entry_points("lanefold.reducers")
    return sorted(_REDUCERS)
