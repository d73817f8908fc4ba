"""An mkdocs hook: lay `lanefold` out for griffe as Python imports it.

The API reference is read from the source by griffe (mkdocstrings' loader), which finds a
package by the name of its folder and never runs it. lanefold's folders have other names
(`orchestrator/` is imported as `lanefold`, `primitives/` as `lanefold.primitives`, ...), joined
today by links and tomorrow perhaps by a packaging map that griffe cannot read. So this hook
asks the import system where `lanefold` and each of its layers live (importing the facade
alone, which imports nothing else until a name is used), copies them into a scratch folder as
one `lanefold/` tree, and hands that folder to mkdocstrings as its search path: the reference
reads the code `import lanefold` would run, from a checkout, an editable install or a wheel.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

# The design card's layers, shipped as `lanefold.<layer>` wherever their folders are.
LAYERS = ("primitives", "backends", "coordinators", "stores")

_scratch: list[Path] = []


def folder_of(package: str) -> Path:
    """The one folder `import package` reads, as the import system finds it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the API reference needs the package {package}: install lanefold")
    (location,) = spec.submodule_search_locations  # a namespace package would name several
    return Path(location).resolve()


def lay_out(into: Path) -> Path:
    """Copy `lanefold` and its layers into `into/lanefold` (sources only); give that tree."""
    tree = into / "lanefold"
    sources = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(folder_of("lanefold"), tree, ignore=sources)  # links copied as what they name
    for layer in LAYERS:
        if not (tree / layer).exists():  # a layer mapped from a folder of its own
            shutil.copytree(folder_of(f"lanefold.{layer}"), tree / layer, ignore=sources)
    return tree


@event_priority(100)  # before mkdocstrings' own on_config, which makes the handler from its `paths`
def on_config(config: Any) -> Any:
    """Point mkdocstrings' python handler at a fresh tree of the sources."""
    into = Path(tempfile.mkdtemp(prefix="lanefold-docs-"))
    _scratch.append(into)
    try:
        lay_out(into)
    except ModuleNotFoundError as error:  # one line, not a traceback
        raise PluginError(str(error)) from None
    handlers = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [str(into)]
    return config


def on_shutdown() -> None:
    """Remove the scratch trees this build made."""
    while _scratch:
        shutil.rmtree(_scratch.pop(), ignore_errors=True)
