"""Defaults and checks before anything is written: the engine is the default backend, `validate`
(and `run`, before it creates a run) catches what a schema cannot, `max_seconds` counts
sampling only, and the display a person reads (tally, summary, tail) holds its shape.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

import lanefold
from lanefold.backends.engine import EngineBackend, EngineConfig
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.cli import main
from lanefold.cli._display import describe, summary, tally
from lanefold.primitives.events import BackendNoted, BackendNotedData

QUESTION = "What is 17 * 23?"
VERIFIER = "def score(question, text, answer):\n    return 1.0\n"
SIMULATED = '[backend]\nkind = "simulated"\n'
JUDGED = '[loop]\nreducer = "judge_argmax"\n'


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory; sys.path and our verifier modules restored afterwards
    (the CLI adds the config's folder and the working directory to sys.path)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield elsewhere
    for name in [n for n in sys.modules if n.startswith("lanefold_defaults_")]:
        del sys.modules[name]


def cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return code, out, err


def simulated(**sections: dict[str, Any]) -> lanefold.LoopConfig:
    raw: dict[str, Any] = {"loop": {"k": 4}, "backend": {"kind": "simulated"}}
    for name, values in sections.items():
        raw[name] = {**raw.get(name, {}), **values}
    return lanefold.parse_config(raw)


# -- the embedded default ---------------------------------------------------------------------------


def test_a_config_without_a_backend_runs_on_the_bundled_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backend = lanefold.parse_config({}).backend
    assert isinstance(backend, EngineConfig)
    assert (backend.kind, backend.model) == ("engine", "smollm2-135m")
    assert isinstance(lanefold.build_backend(backend), EngineBackend)  # built, not loaded
    named = lanefold.parse_config({"backend": {"kind": "simulated"}}).backend
    assert isinstance(named, SimulatedConfig)
    path = tmp_path / "bare.toml"
    path.write_text("[loop]\nk = 2\n")
    code, out, err = cli(capsys, "validate", path)
    assert (code, err) == (0, "")
    assert "backend=engine" in out


@pytest.mark.slow
def test_a_bare_config_samples_the_bundled_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bare.toml"
    path.write_text("[loop]\nk = 2\n[sampling]\nmax_tokens = 4\n")
    code, out, err = cli(
        capsys, "run", path, "--question", "What is 2 + 2?", "--runs-dir", tmp_path / "runs", "--json"
    )
    assert code in (0, 4), err  # four tokens may hold no answer: the run completed either way
    started = lanefold.parse_event(Path(json.loads(out)["events"]).read_text().splitlines()[0])
    assert started.data.backend == "engine:smollm2-135m"  # type: ignore[union-attr]


# -- validate and run refuse before anything is written ---------------------------------------------


@pytest.mark.parametrize("where", ["beside the config", "in the working directory"])
def test_a_verifier_beside_the_config_or_in_the_cwd_resolves(
    where: str, isolated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    module = f"lanefold_defaults_{'beside' if where.startswith('beside') else 'cwd'}"
    (project if where.startswith("beside") else isolated).joinpath(f"{module}.py").write_text(VERIFIER)
    path = project / "loop.toml"
    path.write_text(JUDGED + SIMULATED + f'[judge]\nverifier = "{module}:score"\n')
    assert importlib.util.find_spec(module) is None, "not importable before the CLI runs"
    code, out, err = cli(capsys, "validate", path)
    assert (code, err) == (0, "") and "ok" in out, err
    code, _, err = cli(capsys, "run", path, "--question", QUESTION, "--runs-dir", tmp_path / "runs", "--json")
    assert (code, err) == (0, ""), err


BAD = {
    "unimportable verifier": (
        JUDGED + SIMULATED + '[judge]\nverifier = "lanefold_defaults_gone:f"\n',
        ["judge.verifier", "lanefold_defaults_gone"],
    ),
    "missing engine model": (
        '[backend]\nkind = "engine"\nmodel = "/nope/missing.gguf"\n',
        ["backend.model", "/nope/missing.gguf"],
    ),
    "missing judge model": (
        JUDGED + SIMULATED + '[judge]\ntemplate = "{question} {candidate}"\n'
        '[judge.backend]\nkind = "engine"\nmodel = "/nope/judge.gguf"\n',
        ["judge.backend.model", "/nope/judge.gguf"],
    ),
    "nan": (SIMULATED + "latency_ms = [nan, nan]\n", ["backend.latency_ms"]),
    "inf": (SIMULATED + "[budget]\nmax_cost_usd = inf\n", ["budget.max_cost_usd"]),
    "judge key under majority": (
        SIMULATED + '[judge]\ntemplate = "{question} {candidate}"\n',
        ["judge.template"],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_validate_and_run_refuse_a_bad_config_naming_the_field(
    case: str, isolated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, named = BAD[case]
    path = tmp_path / "bad.toml"
    path.write_text(text)
    runs = tmp_path / "runs"
    for argv in (["validate", path], ["run", path, "--question", QUESTION, "--runs-dir", runs]):
        code, out, err = cli(capsys, *argv)
        assert code == 2, (argv[0], err)
        lines = err.splitlines()
        if argv[0] == "validate" and len(lines) > 1:  # each error (nan twice), then the count
            assert lines[-1] == f"orchestrator validate: {len(lines) - 1} errors", err
            lines = lines[:-1]
        assert out == "" and (len(lines) == 1 or argv[0] == "validate"), err
        assert all(word in err for word in named), err
        assert all(str(path) in line for line in lines), err
    assert not runs.exists(), "nothing is created for a config that cannot run"


def test_run_from_python_refuses_before_creating_the_run(tmp_path: Path) -> None:
    config = lanefold.parse_config({"backend": {"kind": "engine", "model": "/nope/x.gguf"}})
    with pytest.raises(lanefold.ConfigError, match=r"backend\.model: .*/nope/x\.gguf"):
        lanefold.run_sync(config, QUESTION, runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


# -- max_seconds counts sampling, not loading -------------------------------------------------------


class SlowToLoad(SimulatedBackend):
    """Loads for longer than the run's max_seconds, then samples at once."""

    loaded = False

    async def load(self) -> None:
        await anyio.sleep(0.6)
        self.loaded = True


def test_max_seconds_starts_at_the_first_dispatch(tmp_path: Path) -> None:
    backend = SlowToLoad(SimulatedConfig())
    config = simulated(budget={"max_seconds": 0.3})
    result = lanefold.run_sync(config, QUESTION, runs_dir=tmp_path, backend=backend)
    assert backend.loaded
    assert (result.status, result.lanes_completed) == ("answered", 4)


def test_sampling_past_max_seconds_still_stops_the_run(tmp_path: Path) -> None:
    config = simulated(budget={"max_seconds": 0.05}, backend={"latency_ms": [500, 500]})
    with pytest.raises(lanefold.BudgetExhaustedError):
        lanefold.run_sync(config, QUESTION, runs_dir=tmp_path, run_id="slow")
    log = [
        lanefold.parse_event(line) for line in (tmp_path / "slow" / "events.jsonl").read_text().splitlines()
    ]
    assert [e.type for e in log[-2:]] == ["budget.exhausted", "run.failed"]
    assert log[-2].data.limit == "max_seconds"  # type: ignore[union-attr]


# -- display ----------------------------------------------------------------------------------------


def test_tally_prints_integers_for_unweighted_votes_and_decimals_for_weighted() -> None:
    assert tally({"14": 2.0, "15": 5.0, "19": 1.0}) == "15 ×5 · 14 ×2 · 19 ×1"
    assert tally({"391": 1.25, "381": 0.5}) == "391 ×1.25 · 381 ×0.5"
    assert tally({"7": 1234.5}) == "7 ×1234"  # never 1.23e+03


def rendered(result: lanefold.RunResult, width: int = 200) -> list[str]:
    buffer = io.StringIO()
    summary(result, Console(width=width, file=buffer))
    return buffer.getvalue().splitlines()


def test_the_summary_shows_the_tally_and_keeps_the_log_path_whole(tmp_path: Path) -> None:
    runs = tmp_path / "a-folder-name-long-enough-to-overflow-a-narrow-terminal" / "runs"
    result = lanefold.run_sync(simulated(loop={"k": 8}), QUESTION, runs_dir=runs)
    votes = next(line for line in rendered(result) if line.startswith("votes: "))
    assert re.fullmatch(r"votes: \d+ ×\d+( · \d+ ×\d+)*  \(agreement \d+%\)", votes), votes
    assert f"{result.answer} ×{int(result.votes[result.answer or ''])}" in votes
    narrow = rendered(result, width=40)
    assert result.events is not None and len(result.events) > 40
    assert any(line.rstrip().endswith(f"log {result.events}") for line in narrow), narrow


def test_a_majority_run_with_no_votes_says_so(tmp_path: Path) -> None:
    result = lanefold.run_sync(simulated(extract={"regex": r"NEVER-(\d+)"}), QUESTION, runs_dir=tmp_path)
    text = "\n".join(rendered(result))
    assert "votes: no votes" in text and "scores: {}" not in text
    assert result.events is not None
    reduce = [
        describe(e)
        for e in map(lanefold.parse_event, Path(result.events).read_text().splitlines())
        if e.type == "reduce.completed"
    ]
    assert len(reduce) == 1 and "no votes" in reduce[0] and "{}" not in reduce[0]


GIST_STARTS = {
    "run.started": "parallel_sample",
    "wave.started": None,
    "lane.dispatched": "max_tokens=",
    "lane.completed": "answer=",
    "lane.failed": None,
    "wave.barrier": "completed=",
    "judge.completed": "candidate ",
    "reduce.completed": "judge_argmax",
    "run.completed": "answered",
    "budget.wave_shrunk": "{",
    "backend.n_unsupported": "{",
}


def test_tail_lines_have_aligned_columns(tmp_path: Path) -> None:
    # Two-digit lanes, retries, a shrunk wave and a judge wave: every kind of `where`.
    config = simulated(
        loop={"k": 14, "min_quorum": 1, "reducer": "judge_argmax"},
        backend={"failure_rate": 0.3, "prompt_tokens": 10, "output_tokens": 20},
        retry={"max_attempts": 4, "initial_backoff_s": 0.0},
        budget={"max_tokens": 3200},
        judge={"template": "Q: {question}\nA: {candidate}\nScore:"},
    )
    result = lanefold.run_sync(config, QUESTION, runs_dir=tmp_path)
    assert result.events is not None
    events = [lanefold.parse_event(line) for line in Path(result.events).read_text().splitlines()]
    assert {e.type for e in events} >= set(GIST_STARTS) - {"backend.n_unsupported"}
    assert any(e.lane is not None and e.lane >= 10 for e in events)
    # What a valid log can also hold: k = 100000 lanes, 100 attempts, the longest type.
    events += [
        e.model_copy(update={"sequence": 654321, "lane": 99999, "attempt": 100})
        for e in events
        if e.type in ("lane.completed", "lane.failed")
    ]
    events.append(
        BackendNoted(
            id="x",
            source="x",
            time=events[0].time,
            sequence=9,
            run_id="x",
            wave=1,
            data=BackendNotedData(note="n ignored"),
        )
    )
    types, gists = set(), set()
    for event in events:
        line = describe(event)
        column = line.index(event.type)
        types.add(column)
        start = GIST_STARTS.get(event.type) or str(
            getattr(event.data, "purpose", None) or getattr(event.data, "error", "")
        )
        gists.add(line.index(start, column + len(event.type)))
    assert len(types) == 1, "the type column starts at one offset"
    assert len(gists) == 1, "the gist column starts at one offset"
