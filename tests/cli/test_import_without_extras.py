"""The command line starts without the optional extras: a wheel installed bare runs `lanefold
--version` and a simulated loop. tests/test_release.py checks it on a built wheel (slowly); this
checks the imports at every change, with each extra's packages made unimportable."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = (
    "starlette",
    "uvicorn",
    "jinja2",
    "psycopg",
    "ray",
    "opentelemetry",
    "matplotlib",
    "torch",
    "llguidance",
)
CHECK = f"""
import sys
for name in {BLOCKED!r}:
    sys.modules[name] = None  # an import of it raises ImportError, as where it is not installed
from lanefold.cli import main
sys.exit(main(["--version"]))
"""


def test_the_command_line_imports_without_any_extra() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("lanefold ")
