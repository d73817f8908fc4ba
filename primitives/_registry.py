"""Registries of plug-ins: the names config files use, one `Registry` per kind.

Every kind (loops, reducers, backends, stores, executors, scorers, verifiers, hooks) is found
the same three ways: registered by a decorator (`@register_loop`, `@register_backend("kind")`,
...), by an installed package's entry point (group `lanefold.<kind>s`, loaded on first lookup
of a name not registered yet), or named in a config as `package.module:attr`, imported on
demand.

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
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar, cast, overload
from urllib.parse import urlsplit

from lanefold.primitives._errors import ConfigError, PluginImportError, PluginNotImportedError

if TYPE_CHECKING:  # the protocols import what imports the registry: named here, not imported
    from lanefold.primitives._loop import Loop, Reducer
    from lanefold.primitives._store import StoreClass

__all__ = (
    "EXECUTORS",
    "LOOPS",
    "REDUCERS",
    "STORES",
    "NotOfKindError",
    "Registry",
    "import_object",
    "loop_names",
    "plugin_folders",
    "reducer_names",
    "register_executor",
    "register_loop",
    "register_reducer",
    "register_store",
    "resolve_loop",
    "resolve_reducer",
    "store_for_url",
    "without_plugin_imports",
)

T = TypeVar("T")
L = TypeVar("L", bound="type[Loop]")
R = TypeVar("R", bound="type[Reducer]")
S = TypeVar("S", bound="StoreClass")


_NAME = re.compile(r"[a-z][a-z0-9_]*")
_FOLDERS: ContextVar[tuple[str, ...]] = ContextVar("lanefold_plugin_folders", default=())
_SKIPPED: ContextVar[list[str] | None] = ContextVar("lanefold_plugin_skipped", default=None)
_PATH_LOCK = threading.RLock()  # sys.path is the process's: one temporary change at a time


@contextlib.contextmanager
def without_plugin_imports() -> Iterator[list[str]]:
    """Within the block, `import_object` imports nothing new: a module not imported yet is a
    PluginNotImportedError, its spec added to the list yielded. For readers of a record (`tail`, `show`),
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
    # Made absolute here (string work, no file system), resolved only where a module is
    # imported: a run enters these blocks several times, and a module is imported once.
    named = tuple(os.path.abspath(f) for f in folders if f)
    token = _FOLDERS.set(tuple(dict.fromkeys((*named, *_FOLDERS.get()))))
    try:
        yield
    finally:
        _FOLDERS.reset(token)


def import_object(spec: str, *, key: str) -> object:
    """The object `module:attr` names (`attr` may be dotted: `module:Class.method`).

    The module is looked up in the folders of `plugin_folders`, then the working directory,
    then `sys.path`; those folders are on the path only while it imports (a module beside its
    config may import its own siblings). Any failure, an exit at import included, is a
    PluginImportError naming `key` (a PluginNotImportedError within `without_plugin_imports`).
    """
    module_name, colon, attr = spec.partition(":")
    if not (module_name and colon and attr):
        raise ConfigError(f"{key}: {spec!r} must look like 'module:attr'")
    skipped = _SKIPPED.get()
    if skipped is not None and module_name not in sys.modules:
        skipped.append(spec)
        raise PluginNotImportedError(
            f"{key}: {spec!r} is not imported by a reader of the record", key=key, spec=spec
        )
    try:
        found: object = _import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (Exception, SystemExit) as exc:  # a user's module may fail (or exit) in any way
        raise PluginImportError(
            f"{key}: cannot import {spec!r}: {type(exc).__name__}: {exc}", key=key, spec=spec
        ) from None
    return found


def _import_module(name: str) -> object:
    if name in sys.modules:
        return sys.modules[name]
    search = [*(str(Path(f).resolve()) for f in _FOLDERS.get()), os.getcwd()]
    with _PATH_LOCK:
        added = [folder for folder in dict.fromkeys(search) if folder not in sys.path]
        sys.path[:0] = added
        try:
            return importlib.import_module(name)
        finally:
            for folder in added:
                with contextlib.suppress(ValueError):
                    sys.path.remove(folder)


class Registry(Generic[T]):
    """The plug-ins of one kind by name: `register` (a decorator), the kind's entry-point group
    (`lanefold.<kind>s`, loaded once, on the first lookup of a name not registered), and
    `module:attr` (imported by `import_object`, looked up beside the config first).

    `check(obj, where)` refuses what is not of the kind (a ConfigError naming `where`, or a
    TypeError at registration); `name_of(obj)` gives the name of an object registered without
    one (a loop's or reducer's `name` attribute).
    """

    def __init__(
        self,
        kind: str,
        *,
        key: str,
        check: Callable[[object, str], None] | None = None,
        name_of: Callable[[object], str | None] | None = None,
    ) -> None:
        self.kind = kind
        self.key = key  # the config key that names one, for messages
        self.group = f"lanefold.{kind}s"
        self._check = check
        self._name_of = name_of or (lambda obj: getattr(obj, "name", None))
        self._table: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> `module:attr`, imported on first lookup
        self._loaded = False
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._table)})"

    @overload
    def register(self, obj: str, /) -> Callable[[T], T]: ...

    @overload
    def register(self, obj: T, /) -> T: ...

    def register(self, obj: str | T, /) -> Callable[[T], T] | T:
        """`@registry.register` (the object's own `name`) or `@registry.register("name")`."""
        if isinstance(obj, str):
            given = obj

            def named(found: T) -> T:
                self.add(given, found)
                return found

            return named
        own = self._name_of(obj)
        if not isinstance(own, str):
            raise TypeError(
                f'{_qualified(obj)} has no name to register it by: give one (@register_{self.kind}("name"))'
            )
        self.add(own, obj)
        return obj

    def add(self, name: str, obj: T) -> None:
        """Register `obj` as `name`; a second, different object under one name is refused."""
        if self._check is not None:
            try:
                self._check(obj, self.key)
            except NotOfKindError as exc:  # a programming error, found at import
                raise TypeError(str(exc)) from None
        with self._lock:
            known = self._table.get(name)
            if known is not None and known is not obj and _qualified(known) != _qualified(obj):
                raise ConfigError(
                    f"{self.kind} {name!r} is registered twice: {_qualified(known)} and {_qualified(obj)}"
                )
            self._table[name] = obj

    def add_lazy(self, name: str, spec: str) -> None:
        """Register `name` as the object `spec` (`module:attr`) names, imported on its first
        lookup: for a built-in whose module imports what imports the registry's user."""
        with self._lock:
            self._lazy[name] = spec

    def _materialize(self, name: str, key: str | None) -> None:
        spec = self._lazy.get(name)
        if spec is not None and name not in self._table:
            self.add(name, cast(T, import_object(spec, key=key or self.key)))  # `add` checks its kind

    def resolve(self, spec: str, *, key: str | None = None) -> T:
        """What `spec` names: a registered name, an entry point's, or `module:attr`. Unknown,
        or not of the kind, is a ConfigError naming `key` (the config key that named it)."""
        where = key or self.key
        if ":" in spec:
            found: object = import_object(spec, key=where)
        else:
            self._materialize(spec, where)
            if spec not in self._table:
                self.load_entry_points(where)
            found = self._table.get(spec)
            if found is None:
                known = ", ".join(sorted({*self._table, *self._lazy})) or "none"
                raise ConfigError(
                    f"{where}: unknown {self.kind} {spec!r} (known: {known}; or give 'module:attr')"
                )
        if self._check is not None:
            self._check(found, where)
        return cast(T, found)  # of the kind, as far as its check tells: a `module:attr` is anything

    def get(self, name: str) -> T | None:
        """The object registered as `name` (entry points loaded), or None."""
        self._materialize(name, None)
        if name not in self._table:
            self.load_entry_points()
        return self._table.get(name)

    def names(self) -> list[str]:
        """Every registered name, entry points included."""
        self.load_entry_points()
        return sorted({*self._table, *self._lazy})

    def items(self) -> list[tuple[str, T]]:
        for name in list(self._lazy):
            self._materialize(name, None)
        self.load_entry_points()
        return sorted(self._table.items(), key=lambda item: item[0])

    def load_entry_points(self, key: str | None = None) -> None:
        """Register every entry point of the kind's group, once. One that fails (or exits) at
        import, or that names another object under a name already registered, is a ConfigError
        naming the entry point (and `key`, where a config key asked for the lookup), told again
        at the next lookup: a name is one plug-in, never the first of two found."""
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
        where = f"{key}: " if key else ""
        for entry in importlib.metadata.entry_points(group=self.group):
            try:
                found = entry.load()  # importing the module also runs its decorators
            except (Exception, SystemExit) as exc:  # a broken plug-in must not end the process
                self._loaded = False
                raise ConfigError(
                    f"{where}entry point {entry.name!r} in {self.group}: cannot "
                    f"load {entry.value!r}: {type(exc).__name__}: {exc}"
                ) from None
            try:
                if self._check is not None:
                    self._check(found, key or self.key)
            except ConfigError:
                continue  # a module registering by decorator may point its entry at anything
            name = self._name_of(found)
            try:
                for each in dict.fromkeys([*([name] if isinstance(name, str) else []), entry.name]):
                    self.add(each, found)  # the entry point's own name works too
            except ConfigError as exc:
                self._loaded = False
                raise ConfigError(f"{where}entry point {entry.name!r} in {self.group}: {exc}") from None

    def snapshot(self) -> tuple[dict[str, T], bool]:
        """The table and whether entry points were loaded (tests restore them)."""
        return dict(self._table), self._loaded

    def restore(self, saved: tuple[dict[str, T], bool]) -> None:
        with self._lock:
            self._table, self._loaded = dict(saved[0]), saved[1]


class NotOfKindError(ConfigError):
    """What a config or decorator names is not of the registry's kind (not a class, or lacking
    what the kind needs): a ConfigError where a config names it, a TypeError at registration."""


def _check_loop(obj: object, key: str) -> None:
    if not isinstance(obj, type):
        raise NotOfKindError(f"{key}: {_qualified(obj)} is not a class")
    for attr in ("name", "Params", "run"):
        if not hasattr(obj, attr):
            raise NotOfKindError(f"{key}: {_qualified(obj)} is not a Loop (it has no {attr!r})")
    name: object = getattr(obj, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(
            f"loop.coordinator: {obj.__qualname__}.name {name!r} must be "
            f"lower case letters, digits and '_' (it names the loop's events)"
        )


def _check_reducer(obj: object, key: str) -> None:
    if not isinstance(obj, type):
        raise NotOfKindError(f"{key}: {_qualified(obj)} is not a class")
    for attr in ("name", "reduce"):
        if not hasattr(obj, attr):
            raise NotOfKindError(f"{key}: {_qualified(obj)} is not a Reducer (it has no {attr!r})")


def _check_store(obj: object, key: str) -> None:
    if not isinstance(obj, type):
        raise NotOfKindError(f"{key}: {_qualified(obj)} is not a class")
    for attr in ("schemes", "from_url"):
        if not hasattr(obj, attr):
            raise NotOfKindError(f"{key}: {_qualified(obj)} is not a Store (it has no {attr!r})")
    schemes: object = getattr(obj, "schemes", None)
    if not isinstance(schemes, tuple) or not all(isinstance(s, str) for s in schemes):
        raise NotOfKindError(f"{key}: {_qualified(obj)}.schemes must be a tuple of URL schemes")


def _check_executor(obj: object, key: str) -> None:
    if not callable(obj) and not hasattr(obj, "outcomes"):
        raise NotOfKindError(f"{key}: {_qualified(obj)} is neither an Executor nor makes one")


LOOPS: Registry[type[Loop]] = Registry("loop", key="loop.coordinator", check=_check_loop)
"""The loop classes by name (`[loop] coordinator`): `@register_loop` or the `lanefold.loops` entry points."""
REDUCERS: Registry[type[Reducer]] = Registry("reducer", key="loop.reducer", check=_check_reducer)
"""The reducer classes by name (`[loop] reducer`): `@register_reducer` or `lanefold.reducers` entry points."""
STORES: Registry[StoreClass] = Registry("store", key="store.url", check=_check_store)
"""The store classes by name (`[store] url`'s scheme): `@register_store` or `lanefold.stores` entry points.

A store class has `schemes` (the URL schemes it serves; none: it is opened without a URL) and
`from_url(url, *, runs_dir=, password_env=)`.
"""
EXECUTORS: Registry[object] = Registry("executor", key="executor", check=_check_executor)
"""The executors by name (`--executor NAME`): `@register_executor` or `lanefold.executors` entry points.

Each is what makes an executor from its options (`RayExecutor`), or an Executor itself; a maker
may give None: the Session's own in-process path ("local").
"""


def register_loop(cls: L) -> L:
    """Class decorator: make a loop available by its `name` (`coordinator = "<name>"`).

    The name is lower case, digits and `_` (it names the loop's events, `loop.<name>.<noun>`).
    """
    LOOPS.register(cls)
    return cls


def register_reducer(cls: R) -> R:
    """Class decorator: make a reducer available by its `name` (`reducer = "<name>"`)."""
    REDUCERS.register(cls)
    return cls


def register_store(name: str) -> Callable[[S], S]:
    """Class decorator: make a store available by `name`, and by the URL schemes its
    `schemes` names (`[store] url`, `--store`)."""

    def named(cls: S) -> S:
        STORES.add(name, cls)
        return cls

    return named


def register_executor(name: str) -> Callable[[T], T]:
    """Decorator: make an executor (or what makes one from its options) available by `name`
    (`Session(executor="<name>")`, `eval --executor <name>`)."""

    def named(obj: T) -> T:
        EXECUTORS.add(name, obj)
        return obj

    return named


def store_for_url(url: str, *, key: str = "store.url") -> StoreClass:
    """The registered store serving `url`'s scheme; an unknown scheme is a ConfigError naming
    `key`."""
    scheme, sep, _ = url.partition("://")
    served = {s: cls for _, cls in STORES.items() for s in cls.schemes}
    if not sep or scheme.lower() not in served:
        known = ", ".join(f"{s}://" for s in sorted(served)) or "none"
        what = f"{scheme}:// URLs" if sep else "a value that is not a URL"  # never a password
        raise ConfigError(f"{key}: no store serves {what} (known: {known})")
    try:  # a host or port that does not parse is told here, not as a traceback from a driver
        _port = urlsplit(url).port
    except ValueError as exc:
        userinfo = url.partition("://")[2].partition("/")[0].rpartition("@")[0]
        said = str(exc).replace(userinfo, "***") if userinfo else str(exc)
        raise ConfigError(f"{key}: not a valid URL ({said})") from None
    return served[scheme.lower()]


def _qualified(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', repr(obj))}"


def resolve_loop(spec: str) -> type[Loop]:
    """The loop class a `coordinator` value names (a registered name or `module:Class`)."""
    return LOOPS.resolve(spec)


def resolve_reducer(spec: str, *, key: str = "loop.reducer") -> type[Reducer]:
    """The reducer class a `reducer` value names (a registered name or `module:Class`)."""
    return REDUCERS.resolve(spec, key=key)


def loop_names() -> list[str]:
    """Every registered loop, entry points included."""
    return LOOPS.names()


def reducer_names() -> list[str]:
    """Every registered reducer, entry points included."""
    return REDUCERS.names()
