"""The shape of the distribution: import arrows, typed packages, the pinned public names.

Arrows only point down: orchestrator (the facade, `lanefold`) -> coordinators, backends ->
primitives, each under one import name (`lanefold.primitives`, ...). These tests read the source
with `ast` (nothing is imported to check an arrow), so a new module is covered the moment it is
written.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("primitives", "backends", "coordinators", "stores", "orchestrator")
OURS = frozenset({*PACKAGES, "tests", "bench"})
# The folder each package lives in, and the name it is imported by.
IMPORT_NAME = {
    "primitives": "lanefold.primitives",
    "backends": "lanefold.backends",
    "coordinators": "lanefold.coordinators",
    "stores": "lanefold.stores",
    "orchestrator": "lanefold",
}
LAYERS = ("primitives", "backends", "coordinators", "stores")


def _layered(name: str) -> str:
    """A dotted import name with `lanefold` read as the folder it maps to:
    `lanefold.primitives._state` -> `primitives._state`, `lanefold.cli` -> `orchestrator.cli`."""
    parts = name.split(".")
    if parts[0] != "lanefold":
        return name
    if len(parts) > 1 and parts[1] in LAYERS:
        return ".".join(parts[1:])
    return ".".join(["orchestrator", *parts[1:]])


# Which of our top-level packages each package may import (itself always).
ALLOWED: dict[str, frozenset[str]] = {
    "primitives": frozenset({"primitives"}),
    "backends": frozenset({"backends", "primitives"}),
    "coordinators": frozenset({"coordinators", "primitives"}),
    "stores": frozenset({"stores", "primitives"}),
    "orchestrator": frozenset(PACKAGES),
}

# The public names of `orchestrator`, pinned: changing them is a deliberate act, made here.
PUBLIC_NAMES = frozenset(
    {
        "AnyEvent",
        "Lane",
        "LaneJob",
        "Loop",
        "LoopContext",
        "NonDeterminismError",
        "Outcome",
        "ReduceOptions",
        "Reducer",
        "Reduction",
        "Session",
        "SyncSession",
        "RunFailure",
        "ToolCall",
        "ToolSpec",
        "Verdict",
        "Verifier",
        "register_backend",
        "register_loop",
        "register_reducer",
        "register_scorer",
        "register_verifier",
        "register_store",
        "register_executor",
        "Hook",
        "register_hook",
        "Backend",
        "BackendError",
        "BudgetExhaustedError",
        "ConfigError",
        "CostBreakdown",
        "EventLog",
        "JsonlEventLog",
        "LaneResult",
        "LanefoldError",
        "Limits",
        "LogCorruptError",
        "LogWriteError",
        "LoopConfig",
        "MemoryEventLog",
        "Pricing",
        "QuorumNotMetError",
        "RunError",
        "RunInUseError",
        "RunNotFoundError",
        "RunResult",
        "RunState",
        "RunStore",
        "PgStore",
        "Store",
        "Executor",
        "RayExecutor",
        "open_store",
        "Sample",
        "SampleRequest",
        "SamplingParams",
        "Usage",
        "UsageBreakdown",
        "build_backend",
        "config_hash",
        "fold",
        "load_config",
        "parse_config",
        "parse_event",
        "read_run",
        "read_state",
        "resume",
        "resume_sync",
        "run",
        "run_sync",
    }
)


def _modules(package: str) -> list[Path]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no Python files under {package}/"
    return files


def _all_modules() -> list[Path]:
    return [path for package in PACKAGES for path in _modules(package)]


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


IMPORT_CALLS = frozenset({"importlib.import_module", "import_module", "__import__", "importlib.__import__"})


def _dynamic_import(node: ast.AST) -> str | None:
    """The module a call such as `importlib.import_module("lanefold.backends")` imports, where
    the name is written in it: an import the statement scans would not see. A relative name
    (`import_module(".x", __package__)`) is returned with its dots."""
    if not (isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in IMPORT_CALLS):
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else None


def _imported_top_levels(path: Path, package: str) -> set[tuple[str, int]]:
    """(top-level module name, line) of every import in the file, function bodies and
    `importlib` calls that name their module included."""
    found: set[tuple[str, int]] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            found.update((_layered(alias.name).split(".")[0], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: stays inside its own package
                found.add((package, node.lineno))
            elif node.module:
                found.add((_layered(node.module).split(".")[0], node.lineno))
        elif (name := _dynamic_import(node)) is not None:
            found.add((package if name.startswith(".") else _layered(name).split(".")[0], node.lineno))
    return found


def _bare_imports(path: Path) -> list[tuple[str, int]]:
    """Imports of our packages by their folder names (`from primitives import ...`): in an
    installed library those names are whatever a user's project calls its own packages."""
    found = []
    for node in ast.walk(_tree(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif (dynamic := _dynamic_import(node)) is not None:
            names = [dynamic]
        found += [(name, node.lineno) for name in names if name.split(".")[0] in PACKAGES]
    return found


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- (a) import arrows ---------------------------------------------------------------------------


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_only_down(package: str) -> None:
    wrong = sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in _modules(package)
        for name, line in _imported_top_levels(path, package)
        if name in OURS and name not in ALLOWED[package]
    )
    assert wrong == [], f"{package} may import only {sorted(ALLOWED[package])} of ours"


def _private_imports(path: Path, own: tuple[str, ...] | None = None) -> list[tuple[str, int]]:
    """(module, line) of each import of a private `_module` outside the file's own package."""
    if own is None:
        own = path.relative_to(ROOT).with_suffix("").parts[:-1]  # the package the file is in
    found = []
    for node in ast.walk(_tree(path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif (dynamic := _dynamic_import(node)) is not None and not dynamic.startswith("."):
            names = [dynamic]
        for name in map(_layered, names):
            parts = name.split(".")
            private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
            if private is None or parts[0] not in OURS:
                continue
            if tuple(parts[:private]) != own[:private]:
                found.append((name, node.lineno))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_another_packages_private_module(package: str) -> None:
    wrong = sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in _modules(package)
        for name, line in _private_imports(path)
    )
    assert wrong == [], "import the package's public names instead"


@pytest.mark.parametrize("package", [*PACKAGES, "tests", "bench", "scripts"])
def test_our_code_imports_our_packages_through_lanefold(package: str) -> None:
    wrong = sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, line in _bare_imports(path)
    )
    assert wrong == [], "import lanefold, lanefold.primitives, ... (a user may own `backends`)"


def test_private_import_scan(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "from lanefold.primitives._state import RunState\n"
        "from lanefold.coordinators._reducers import vote\n"
        "import lanefold.backends.engine._config\n"
        "from lanefold.primitives import events\n"
        "from lanefold.cli._main import main\n"
    )
    found = {name for name, _ in _private_imports(source, own=("coordinators",))}
    assert found == {
        "primitives._state",
        "primitives._state.RunState",
        "backends.engine._config",
        "orchestrator.cli._main",
        "orchestrator.cli._main.main",
    }


def test_import_scan_sees_every_form(tmp_path: Path) -> None:
    # The arrow check is only as good as the scanner: it must see nested, dotted and relative forms.
    source = tmp_path / "m.py"
    source.write_text(
        "import os.path\n"
        "from . import sibling\n"
        "def f():\n"
        "    from lanefold.backends.simulated import SimulatedBackend\n"
        "    import lanefold.cli._main as cli\n"
    )
    found = {name for name, _ in _imported_top_levels(source, "coordinators")}
    assert found == {"os", "coordinators", "backends", "orchestrator"}


def test_import_scans_see_importlib_calls_that_name_their_module(tmp_path: Path) -> None:
    # `importlib.import_module("...")` is an import the statement scans would miss: an arrow up,
    # a private module or a folder's bare name hidden in a string.
    source = tmp_path / "m.py"
    source.write_text(
        "import importlib\n"
        "from importlib import import_module\n"
        "def f(name):\n"
        '    importlib.import_module("lanefold.stores.files")\n'
        '    import_module("lanefold.backends.engine._config")\n'
        '    __import__("primitives")\n'
        '    importlib.import_module(".sibling", __package__)\n'
        "    importlib.import_module(name)\n"
    )
    found = {name for name, _ in _imported_top_levels(source, "coordinators")}
    assert found == {"importlib", "stores", "backends", "primitives", "coordinators"}
    assert [name for name, _ in _private_imports(source, own=("coordinators",))] == [
        "backends.engine._config"
    ]
    assert [name for name, _ in _bare_imports(source)] == ["primitives"]


# -- (a2) the facade composes plug-ins by what they declare, never by name -------------------------

# The built-in plug-ins' names: the facade (orchestrator/) names none of them as a string, except
# in FACADE_DEFAULTS, where its defaults are named once. Another kind's names (backends, stores)
# join as another tuple in BUILT_IN_NAMES.
BUILT_IN_LOOPS = ("parallel_sample", "adaptive_sample", "sequential_refine", "debate", "plan_verify_replan")
BUILT_IN_REDUCERS = ("majority_vote", "weighted_vote", "judge_argmax", "usc", "any_pass", "field_vote")
BUILT_IN_VERIFIERS = ("command", "schema_valid")
BUILT_IN_BACKENDS = ("simulated", "engine", "openai")
BUILT_IN_STORES = ("files", "postgres")
BUILT_IN_NAMES: tuple[str, ...] = (
    *BUILT_IN_LOOPS,
    *BUILT_IN_REDUCERS,
    # "command" is a common word (a resume command, a reproducing command): the facade's
    # mentions of it are not the verifier's name
    *(name for name in BUILT_IN_VERIFIERS if name != "command"),
    *BUILT_IN_BACKENDS,
    *BUILT_IN_STORES,
)
# Packages whose concrete classes the facade never tests with isinstance/issubclass.
PLUG_IN_PACKAGES = ("lanefold.coordinators", "lanefold.backends", "lanefold.stores")
FACADE_DEFAULTS = ROOT / "orchestrator" / "config" / "_defaults.py"


def _facade_modules() -> list[Path]:
    """orchestrator/'s modules (the layers are folders beside it, mapped in by the build)."""
    return _modules("orchestrator")


def _where(path: Path) -> str:
    return _rel(path) if path.is_relative_to(ROOT) else path.name


def _docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _named_plug_ins(path: Path, names: tuple[str, ...] = BUILT_IN_NAMES) -> list[str]:
    """Each string (docstrings aside) that is a built-in's name, or holds a snake_case one
    as a word (a one-word name such as "debate" only where it is the whole string)."""
    tree = _tree(path)
    docs = _docstrings(tree)
    words = [name for name in names if "_" in name]
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b") if words else None
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docs:
            continue
        match = (
            node.value
            if node.value in names
            else (pattern.search(node.value) if pattern is not None else None)
        )
        if match:
            found.append(f"{_where(path)}:{node.lineno} names {node.value[:60]!r}")
    return found


def _isinstance_on_plug_ins(path: Path, packages: tuple[str, ...] = PLUG_IN_PACKAGES) -> list[str]:
    """Each isinstance/issubclass whose classes include one imported from a plug-in package."""
    tree = _tree(path)
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(packages)
        for alias in node.names
    }
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.startswith(packages)
    }
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            continue
        for part in ast.walk(node.args[1]):
            named = part.id if isinstance(part, ast.Name) else None
            dotted = ast.unparse(part) if isinstance(part, ast.Attribute) else ""
            if named in imported or any(dotted.startswith(f"{a}.") for a in aliases):
                found.append(f"{_where(path)}:{node.lineno} {ast.unparse(node)}")
                break
    return found


def test_the_built_in_names_are_the_registered_ones() -> None:
    import lanefold.coordinators  # each built-in registers by its module's import (alone, none is)
    from lanefold.primitives import LOOPS, REDUCERS, VERIFIERS

    assert lanefold.coordinators.__name__

    def built_in(registry: Any) -> set[str]:
        return {name for name, cls in registry.items() if cls.__module__.startswith("lanefold.coordinators")}

    assert set(BUILT_IN_LOOPS) == built_in(LOOPS)
    assert set(BUILT_IN_REDUCERS) == built_in(REDUCERS)
    assert set(BUILT_IN_VERIFIERS) == built_in(VERIFIERS)


def test_the_facade_names_no_built_in_plug_in() -> None:
    wrong = sorted(
        line for path in _facade_modules() if path != FACADE_DEFAULTS for line in _named_plug_ins(path)
    )
    assert wrong == [], (
        "ask the registry and what the plug-in declares (lanefold.primitives' "
        "cost_shape, fit_params, reducer_traits, ...); defaults live in "
        "orchestrator/config/_defaults.py"
    )
    # the default loop, the reducer curve counts, the default backend and store: each once
    assert len(_named_plug_ins(FACADE_DEFAULTS)) == 4


def test_the_facade_tests_no_plug_in_class() -> None:
    wrong = sorted(line for path in _facade_modules() for line in _isinstance_on_plug_ins(path))
    assert wrong == [], "a plug-in declares what the facade needs; the facade never tests its class"


def test_the_plug_in_scans_see_names_and_classes(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        '"""A docstring may say parallel_sample."""\n'
        "from lanefold.coordinators import ParallelSampleParams as P\n"
        "import lanefold.coordinators as c\n"
        "def f(params, name):\n"
        '    """Nor is this one counted: majority_vote."""\n'
        '    if name == "debate" or name in ("usc",):\n'
        '        raise ValueError(f"a {name} is not a judge_argmax")\n'
        '    x = "a debate, said in prose"\n'
        "    return isinstance(params, P | int) or issubclass(params, c.Debate)\n"
    )
    assert [line.split(" names ")[1] for line in _named_plug_ins(source)] == [
        "'debate'",
        "'usc'",
        "' is not a judge_argmax'",
    ]
    assert len(_isinstance_on_plug_ins(source)) == 2


PLUG_IN_FOLDERS = ("backends", "coordinators", "stores")
PLUG_IN_MODULE = re.compile(r"^lanefold\.(backends|coordinators|stores)\b")
# The one facade module that names plug-in packages' modules in strings: its lazy re-exports,
# each a pinned public name (PUBLIC_NAMES) whose home module is written beside it.
LAZY_EXPORTS = ROOT / "orchestrator" / "__init__.py"


def _importlib_imports_of_plug_ins(path: Path) -> list[str]:
    """Each `importlib` import of a plug-in package in a facade module: by its name, or by a
    name built from a string that names one (`f"lanefold.backends.{kind}"`, a tuple looped
    over). The facade reaches plug-ins through the registries, never by module name."""
    tree = _tree(path)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        name = _dynamic_import(node)
        if name is not None and _layered(name).split(".")[0] in PLUG_IN_FOLDERS:
            found.append(f"{_where(path)}:{node.lineno} {ast.unparse(node)}")
        elif (
            path != LAZY_EXPORTS
            and isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docs
            and PLUG_IN_MODULE.match(node.value)
            and not any(_dynamic_import(call) == node.value for call in ast.walk(tree))
        ):
            found.append(f"{_where(path)}:{node.lineno} {node.value!r}")
    return sorted(found, key=lambda line: int(line.split(":")[1].split(" ")[0]))


def test_the_facade_imports_no_plug_in_package_through_importlib() -> None:
    wrong = sorted(line for path in _facade_modules() for line in _importlib_imports_of_plug_ins(path))
    assert wrong == [], "resolve plug-ins through their registry (LOOPS, BACKENDS, ...), not importlib"


def _plug_in_identifiers() -> tuple[str, ...]:
    """The built-ins' registered names and the class names the plug-in packages export."""
    import lanefold.backends
    import lanefold.coordinators
    import lanefold.stores.files
    import lanefold.stores.postgres

    classes = {
        name
        for package in (
            lanefold.backends,
            lanefold.coordinators,
            lanefold.stores.files,
            lanefold.stores.postgres,
        )
        for name in package.__all__
        if isinstance(getattr(package, name, None), type)
    }
    return tuple(sorted({*BUILT_IN_NAMES, *BUILT_IN_BACKEND_CLASSES, *classes}))


def _compared_plug_in_names(path: Path, names: tuple[str, ...]) -> list[str]:
    """Each comparison (`==`, `!=`, `in`, `startswith`, `case "..."`) of a string against a
    built-in plug-in's name or a plug-in class's name (`type(b).__name__ == "EngineBackend"`):
    an isinstance or a name test by another spelling."""
    tree = _tree(path)
    words = [name for name in names if "_" in name]
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b") if words else None
    found = []
    for node in ast.walk(tree):
        operands: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith", "removeprefix", "removesuffix"):
                operands = [node.func.value, *node.args]
        elif isinstance(node, ast.match_case):
            operands = [node.pattern]
        for inner in (n for operand in operands for n in ast.walk(operand)):
            if not (isinstance(inner, ast.Constant) and isinstance(inner.value, str)):
                continue
            if inner.value in names or (pattern is not None and pattern.search(inner.value)):
                found.append(f"{_where(path)}:{inner.lineno} compares {inner.value[:60]!r}")
    return found


@pytest.mark.parametrize("package", ["orchestrator", "primitives"])
def test_no_string_comparison_names_a_built_in_plug_in(package: str) -> None:
    # The facade's defaults may name a built-in (as a value); nothing in the facade or the
    # substrate decides by comparing a string with one.
    paths = _facade_modules() if package == "orchestrator" else _modules(package)
    names = _plug_in_identifiers()
    wrong = sorted(line for path in paths for line in _compared_plug_in_names(path, names))
    assert wrong == [], "ask what the plug-in declares (lanefold.primitives), not its name"


def test_the_comparison_and_importlib_scans_see_what_they_refuse(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        "import importlib\n"
        "def f(backend, kind, name):\n"
        '    if type(backend).__name__ == "EngineBackend" or kind in ("files", "x"):\n'
        '        importlib.import_module("lanefold.backends.engine")\n'
        '    if name.startswith("majority_vote") or kind != "a debate":\n'
        '        importlib.import_module(f"lanefold.coordinators.{name}")\n'
        "    match kind:\n"
        '        case "postgres":\n'
        "            pass\n"
        '    defaults = {"loop": "parallel_sample"}  # a value, not a comparison\n'
        '    importlib.import_module("lanefold.primitives")\n'
        '    for module in ("starlette", "uvicorn"):  # an extra, by a computed name: not a plug-in\n'
        "        __import__(module)\n"
    )
    compared = [
        line.split(" compares ")[1] for line in _compared_plug_in_names(source, _plug_in_identifiers())
    ]
    assert sorted(compared) == ["'EngineBackend'", "'files'", "'majority_vote'", "'postgres'"]
    imported = [line.split(" ", 1)[1] for line in _importlib_imports_of_plug_ins(source)]
    assert imported == ["importlib.import_module('lanefold.backends.engine')", "'lanefold.coordinators.'"]


def _code_in_strings(path: Path) -> list[tuple[str, int]]:
    """Imports of a layer by its folder's name inside a string that is Python code (`python -c
    "import backends.engine"`): the subprocess imports the checkout's folder, not the package."""
    found = []
    layers = frozenset(LAYERS)
    for node in ast.walk(_tree(path)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value):
            continue
        try:
            code = ast.parse(textwrap.dedent(node.value))
        except SyntaxError:
            continue
        for inner in ast.walk(code):
            names: list[str] = []
            if isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            elif isinstance(inner, ast.ImportFrom) and inner.module and not inner.level:
                names = [inner.module]
            found += [(name, node.lineno) for name in names if name.split(".")[0] in layers]
    return found


# A user's own packages that carry the names ours had before 0.2 (the test that they do not
# shadow ours imports them by those names, on purpose).
USERS_OWN_LAYER_NAMES = ROOT / "tests" / "orchestrator" / "test_namespace.py"


@pytest.mark.parametrize("package", [*PACKAGES, "tests", "bench", "scripts"])
def test_code_in_strings_imports_our_packages_through_lanefold(package: str) -> None:
    wrong = sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != USERS_OWN_LAYER_NAMES
        for name, line in _code_in_strings(path)
    )
    assert wrong == [], "a subprocess's code imports lanefold.backends, ... (not the checkout's folder)"


def test_code_in_strings_scan(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text(
        'a = "import sys, backends.engine as e; e.EngineConfig()"\n'
        'b = """\n    from primitives import Lane\n    import lanefold.stores\n"""\n'
        'c = "a sentence that says import backends, not code"\n'
    )
    assert _code_in_strings(source) == [("backends.engine", 1), ("primitives", 2)]


# -- (b) typed packages with a tuple __all__ ------------------------------------------------------


@pytest.mark.parametrize("package", PACKAGES)
def test_package_is_typed_with_tuple_all(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
    module = importlib.import_module(IMPORT_NAME[package])
    exported = module.__all__
    assert isinstance(exported, tuple)
    assert all(isinstance(name, str) for name in exported)
    assert len(set(exported)) == len(exported), "duplicate names in __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []


def _bound_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    if "__getattr__" in names:
        # A lazy export (PEP 562): the name is typed under TYPE_CHECKING, made by __getattr__.
        for node in tree.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                names.update(
                    a.asname or a.name for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names
                )
    return names


def _declared_all(tree: ast.Module) -> ast.expr | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return node.value
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "__all__"
        ):
            return node.value
    return None


@pytest.mark.parametrize("path", _all_modules(), ids=_rel)
def test_every_module_all_is_a_tuple_of_its_own_names(path: Path) -> None:
    tree = _tree(path)
    declared = _declared_all(tree)
    if declared is None:
        return  # a module without __all__ (e.g. a script) exports nothing by contract
    assert isinstance(declared, ast.Tuple), f"{_rel(path)}: __all__ must be a tuple literal"
    names = [
        elt.value for elt in declared.elts if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
    ]
    assert len(names) == len(declared.elts), f"{_rel(path)}: __all__ holds only string literals"
    assert sorted(set(names) - _bound_names(tree)) == [], f"{_rel(path)}: undefined in __all__"


# -- (c) the public names of orchestrator ---------------------------------------------------------


def test_orchestrator_public_names_are_pinned() -> None:
    import lanefold

    assert set(lanefold.__all__) == PUBLIC_NAMES
    assert len(lanefold.__all__) == len(PUBLIC_NAMES)


def test_orchestrator_exports_what_a_user_needs() -> None:
    import lanefold

    needed = {"run", "run_sync", "resume", "resume_sync", "load_config", "RunResult", "ConfigError"}
    assert needed <= set(lanefold.__all__)
    assert inspect.iscoroutinefunction(lanefold.run)
    assert inspect.iscoroutinefunction(lanefold.resume)
    assert not inspect.iscoroutinefunction(lanefold.run_sync)
    assert not inspect.iscoroutinefunction(lanefold.resume_sync)
    assert issubclass(lanefold.ConfigError, lanefold.LanefoldError)
    assert issubclass(lanefold.RunError, lanefold.LanefoldError)
    assert not issubclass(lanefold.ConfigError, lanefold.RunError)


def test_orchestrator_public_classes_and_functions_have_docstrings() -> None:
    import lanefold

    undocumented = sorted(
        name
        for name in lanefold.__all__
        if (inspect.isclass(obj := getattr(lanefold, name)) or inspect.isfunction(obj))
        and not (obj.__doc__ or "").strip()
    )
    assert undocumented == []


# -- (d) a light import ---------------------------------------------------------------------------


def test_importing_orchestrator_does_not_import_torch() -> None:
    heavy = ("torch", "transformers", "tokenizers", "safetensors", "gguf")
    code = f"import lanefold, sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# -- (d2) the facade knows no backend by its class --------------------------------------------------

BUILT_IN_BACKEND_CLASSES = (
    "SimulatedConfig",
    "EngineConfig",
    "OpenAIConfig",
    "SimulatedBackend",
    "EngineBackend",
    "OpenAIBackend",
)


def test_the_facade_names_no_built_in_backend_class() -> None:
    # `[backend]` is validated and built through the registry (BACKENDS): each backend's config
    # model builds it and says what it checks, so no isinstance chain over them is left.
    named = sorted(
        f"{_rel(path)}:{node.lineno} {node.id if isinstance(node, ast.Name) else node.attr}"
        for path in _modules("orchestrator")
        for node in ast.walk(_tree(path))
        if (isinstance(node, ast.Name) and node.id in BUILT_IN_BACKEND_CLASSES)
        or (isinstance(node, ast.Attribute) and node.attr in BUILT_IN_BACKEND_CLASSES)
        or (isinstance(node, ast.alias) and node.name in BUILT_IN_BACKEND_CLASSES)
    )
    assert named == []


def test_the_facade_takes_no_name_from_a_backend_package() -> None:
    # Backends are reached through BACKENDS and what each config model declares; a rule the
    # facade shares with a backend (a secret read from the environment) is primitives' own
    # (`read_secret`). On main the gateway imported the openai backend's `read_api_key`.
    taken = sorted(
        f"{_rel(path)}:{node.lineno} {ast.unparse(node)}"
        for path in _modules("orchestrator")
        for node in ast.walk(_tree(path))
        if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lanefold.backends"))
        or (
            isinstance(node, ast.Import)
            and any(alias.name.startswith("lanefold.backends.") for alias in node.names)
        )
    )
    assert taken == []


# -- (e) anyio only -------------------------------------------------------------------------------


def test_no_library_module_imports_asyncio() -> None:
    offenders = sorted(
        f"{_rel(path)}:{line}"
        for package in PACKAGES
        for path in _modules(package)
        for name, line in _imported_top_levels(path, package)
        if name == "asyncio"
    )
    assert offenders == []


# -- the test harness itself ----------------------------------------------------------------------


def test_network_guard_refuses_remote_and_allows_loopback() -> None:
    # conftest's guard raises a RuntimeError (not an OSError that a retry loop would swallow).
    blocked = pytest.raises(RuntimeError, match="may not reach the network")
    with blocked:
        socket.create_connection(("192.0.2.1", 80), timeout=0.1)  # TEST-NET-1, never routed
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock, blocked:
        sock.connect(("example.com", 443))
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock, blocked:
        sock.connect(("2001:db8::1", 443, 0, 0))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass


# -- (e) config values reach runtime types by keyword ---------------------------------------------

# The runtime types a config's values are copied into: a field added, removed or reordered in
# one of them must never shift a value into the wrong field.
RUNTIME_TYPES = frozenset(
    {
        "SamplingParams",
        "RetryPolicy",
        "Ledger",
        "JudgeSettings",
        "ReduceOptions",
        "ExtractSpec",
        "Limits",
        "Pricing",
        "WaveSpec",
    }
)


def _positional_calls(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call) and node.args:
            name = (
                node.func.id
                if isinstance(node.func, ast.Name)
                else node.func.attr
                if isinstance(node.func, ast.Attribute)
                else ""
            )
            if name in RUNTIME_TYPES:
                found.append((name, node.lineno))
    return found


def test_the_facade_fills_runtime_types_by_keyword() -> None:
    wrong = sorted(
        f"{_rel(path)}:{line} {name}(positional ...)"
        for path in _modules("orchestrator")
        for name, line in _positional_calls(path)
    )
    assert wrong == [], "pass config values by keyword"


def test_positional_scan_sees_calls(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "a = SamplingParams(0.7, 1.0)\nb = p.RetryPolicy(3)\nc = SamplingParams(temperature=0.7)\n"
    )
    assert _positional_calls(source) == [("SamplingParams", 1), ("RetryPolicy", 2)]


# -- (f) primitives: protocols and the governed core, no I/O drivers -----------------------------

# Stores own their drivers and processes are started by plug-ins (a command verifier, a test
# scorer): the substrate every loop imports starts nothing and connects to nothing.
PRIMITIVES_MAY_NOT_IMPORT = ("subprocess", "psycopg", "multiprocessing")


def test_primitives_import_no_process_or_database_driver() -> None:
    wrong = sorted(
        f"{_rel(path)}:{line} imports {name}"
        for path in _modules("primitives")
        for name, line in _imported_top_levels(path, "primitives")
        if name in PRIMITIVES_MAY_NOT_IMPORT
    )
    assert wrong == []


def test_the_facade_names_no_built_in_store_but_in_its_defaults() -> None:
    """A store is found by its URL scheme through the registry: under `orchestrator/`, only
    `_defaults.py` names one (the store opened without a URL)."""
    import lanefold.execution._store  # noqa: F401  (registers the built-in stores)
    from lanefold.primitives import STORES

    names = set(STORES.names())
    found = []
    for path in _facade_modules():
        if path.name == "_defaults.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found


# -- (f) the facade, a folder per concern, with no import circle -----------------------------------

FACADE_FOLDERS = ("cli", "config", "evaluate", "execution", "serve", "telemetry", "view")


def _facade_name(path: Path) -> str:
    """`orchestrator/cli/_main.py` -> `lanefold.cli._main`; a package's `__init__` is its folder."""
    parts = path.relative_to(ROOT / "orchestrator").with_suffix("").parts
    return ".".join(("lanefold", *parts[: -1 if parts[-1] == "__init__" else None]))


def _facade_graph() -> dict[str, dict[str, int]]:
    """Each facade module -> the facade modules it imports (with the line), anywhere in it."""
    names = {_facade_name(path): path for path in _facade_modules()}
    graph: dict[str, dict[str, int]] = {}
    for name, path in names.items():
        edges: dict[str, int] = {}
        for node in ast.walk(_tree(path)):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            for target in targets:
                if target in names and target != name and target != "lanefold":
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def test_the_facade_is_a_folder_per_concern() -> None:
    top = ROOT / "orchestrator"
    modules = sorted(p.name for p in top.glob("*.py"))
    assert modules == ["__init__.py", "__main__.py"], "facade modules belong in " + ", ".join(FACADE_FOLDERS)
    folders = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(FACADE_FOLDERS)


def _circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every import circle a depth-first walk of `graph` meets, each as its path."""
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in graph.get(name, {}):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return circles


def test_the_facade_has_no_import_circle() -> None:
    circles = _circles(_facade_graph())
    assert circles == [], " ; ".join(" -> ".join(c) for c in circles)


def test_the_circle_check_sees_a_circle() -> None:
    assert _circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b": 1}, "b": {}, "c": {"b": 1}}) == []
    graph = _facade_graph()  # and the graph holds the facade's real edges
    assert "lanefold.cli._shared" in graph["lanefold.cli._runs"]
    assert "lanefold.config" in graph["lanefold.execution._session"]


# Imported when first used, for an optional extra the module cannot import at load.
LAZY_FOR_AN_EXTRA = {  # starlette: [serve]
    ("orchestrator/serve/_run.py", "lanefold.serve._app"),
    ("orchestrator/serve/_loops.py", "lanefold.serve._app"),
    ("orchestrator/serve/_loops.py", "lanefold.serve._gateway"),
    ("orchestrator/serve/_loops.py", "lanefold.serve._guard"),
    ("orchestrator/view/_run.py", "lanefold.view._app"),
}


def test_the_facade_imports_itself_only_at_module_level() -> None:
    """A function-level import of another facade module is how a circle hides; none."""
    names = {_facade_name(path) for path in _facade_modules()}
    wrong = []
    for path in _facade_modules():
        tree = _tree(path)
        top = {id(node) for node in tree.body}
        guarded = {  # `if TYPE_CHECKING:` blocks and the try/with around the CLI's startup imports
            id(inner)
            for node in tree.body
            if isinstance(node, ast.If | ast.Try | ast.With)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in top or id(node) in guarded:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if (_rel(path), node.module) in LAZY_FOR_AN_EXTRA:
                    continue
                if node.module in names or any(f"{node.module}.{a.name}" in names for a in node.names):
                    wrong.append(f"{_rel(path)}:{node.lineno} imports {node.module} in a function")
            elif isinstance(node, ast.Import):
                wrong += [
                    f"{_rel(path)}:{node.lineno} imports {a.name}" for a in node.names if a.name in names
                ]
    assert wrong == []
