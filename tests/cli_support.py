"""What the command-line tests share: running the command in-process or in a subprocess, and
the shape of what it prints. The tests are under tests/cli/, a module per command group."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lanefold.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "simulated.toml"
QUESTION = "What is 17 * 23?"
RESULT_KEYS = {"run_id", "answer", "votes", "lanes_completed", "lanes_failed", "usage", "cost", "events"}
USAGE_KEYS = {"prefill_tokens", "cached_prefill_tokens", "decode_tokens", "verifier_tokens"}
COST_KEYS = {"prefill", "cached_prefill", "decode", "kv_residency", "verifier", "total"}
RFC3339_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00)")


# -- helpers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str

    @property
    def json(self) -> dict[str, Any]:
        lines = self.out.splitlines()
        assert len(lines) == 1, f"expected one JSON line on stdout, got {self.out!r}"
        value = json.loads(lines[0])
        assert isinstance(value, dict)
        return value

    @property
    def error_line(self) -> str:
        lines = self.err.splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got {self.err!r}"
        assert "Traceback" not in self.err
        return lines[0]


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> Outcome:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return Outcome(code, out, err)


def command(*argv: str | Path, timeout: float = 60) -> Outcome:
    done = subprocess.run(
        [sys.executable, "-m", "lanefold", *map(str, argv)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(value)


def example_variant(
    folder: Path, changes: Mapping[str, Mapping[str, Any]], name: str = "variant.toml"
) -> Path:
    """The self-consistency example with some sections' keys changed, written as TOML."""
    raw = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    for section, values in changes.items():
        raw.setdefault(section, {}).update(values)
    text = "\n".join(
        f"[{section}]\n" + "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())
        for section, values in raw.items()
    )
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def log_lines(path: Path | str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def log_events(path: Path | str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log_lines(path)]


def events_path(runs: Path, run_id: str) -> Path:
    return runs / run_id / "events.jsonl"


def relabel(lines: list[str], run_id: str) -> list[str]:
    """Another run's log lines as if run `run_id` had written them (a log refuses lines that
    carry another run's id)."""
    out = []
    for line in lines:
        event = json.loads(line)
        old = event["run_id"]
        event.update(run_id=run_id, source=f"lanefold:run/{run_id}", id=event["id"].replace(old, run_id, 1))
        out.append(json.dumps(event))
    return out


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture(scope="module")
def _finished_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The self-consistency example run once per module with `--json`: (runs dir, stdout)."""
    runs = tmp_path_factory.mktemp("finished") / "runs"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(
            [
                "run",
                str(EXAMPLE),
                "--question",
                QUESTION,
                "--runs-dir",
                str(runs),
                "--run-id",
                "done",
                "--json",
            ]
        )
    assert code == 0, err.getvalue()
    return runs, out.getvalue()


@pytest.fixture
def finished(_finished_once: tuple[Path, str], runs: Path) -> Outcome:
    """A finished run `done` in this test's runs dir (a copy of the module's one run)."""
    source, out = _finished_once
    shutil.copytree(source, runs)
    return Outcome(0, out, "")


def _check_result(result: dict[str, Any]) -> None:
    assert RESULT_KEYS <= set(result)
    usage, cost = result["usage"], result["cost"]
    assert USAGE_KEYS <= set(usage)
    assert all(type(usage[key]) is int and usage[key] >= 0 for key in USAGE_KEYS)
    assert COST_KEYS <= set(cost)
    assert all(isinstance(cost[key], float | int) and cost[key] >= 0 for key in COST_KEYS)
    lines = sum(cost[key] for key in COST_KEYS - {"total"})
    assert cost["total"] == pytest.approx(lines, rel=1e-9, abs=1e-15)
    assert Path(result["events"]).is_file()
