"""Registries of loops and reducers: the names config files use.

A loop or reducer is registered with a decorator (`@register_loop`, `@register_reducer`), by
an installed package's entry point (groups `lanefold.loops` and `lanefold.reducers`, loaded on
first lookup), or named in a config as `package.module:ClassName`, imported on demand.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import re
from typing import Any, TypeVar

from primitives._errors import ConfigError

__all__ = (
    "loop_names",
    "reducer_names",
    "register_loop",
    "register_reducer",
    "resolve_loop",
    "resolve_reducer",
)

T = TypeVar("T", bound=type[Any])

_LOOPS: dict[str, type[Any]] = {}
_REDUCERS: dict[str, type[Any]] = {}
_ENTRY_POINTS_LOADED: set[str] = set()


_NAME = re.compile(r"[a-z][a-z0-9_]*")


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


def _load_entry_points(group: str) -> None:
    if group in _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED.add(group)
    table = _LOOPS if group == "lanefold.loops" else _REDUCERS
    for entry in importlib.metadata.entry_points(group=group):
        try:
            found = entry.load()  # importing the module also runs its @register_* decorators
        except Exception as exc:  # a broken plug-in must not break every other loop
            raise ConfigError(f"entry point {entry.name!r} in {group}: cannot load "
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
        module_name, _, attr = spec.partition(":")
        try:
            found: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                found = getattr(found, part)
        except Exception as exc:  # a user's module may fail to import in any way
            raise ConfigError(f"{key}: cannot import {spec!r}: {type(exc).__name__}: "
                              f"{exc}") from None
        if not isinstance(found, type):
            raise ConfigError(f"{key}: {spec!r} is not a class")
        return found
    if spec not in table:
        _load_entry_points(group)
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
