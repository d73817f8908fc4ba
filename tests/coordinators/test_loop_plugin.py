"""A loop written outside the library, run end to end through the CLI.

`plugin_loop.py` (beside this file) is copied next to a config naming it
`coordinator = "plugin_loop:CritiqueLoop"`, as a user keeps a loop beside their config. The
in-process tests keep sys.path and sys.modules as they found them, and keep this folder off
sys.path, so the copy is found only the way a user's would be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loop_processes import cli, finish

import lanefold
from lanefold.cli import main

HERE = Path(__file__).resolve().parent
QUESTION = "What is 17 * 23?"
DRAFTS, CRITICS = 3, 12  # wave 2 outlasts the poll that kills it by many lanes
CONFIG = """
[loop]
coordinator = "plugin_loop:CritiqueLoop"
seed = 11
max_concurrency = 2
drafts = {drafts}
critics = {critics}
{extra}
[backend]
kind = "simulated"
accuracy = 0.6
latency_ms = [{latency}]
lanes_per_request = 1
"""


def write_config(folder: Path, name: str, *, extra: str = "", latency: str = "0, 0") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(CONFIG.format(extra=extra, latency=latency, drafts=DRAFTS, critics=CRITICS))
    return path


def events(runs: Path, run_id: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (runs / run_id / "events.jsonl").read_text().splitlines()]


def forget_plugin() -> None:
    """As a fresh process: no `plugin_loop` imported, no folder of it on sys.path."""
    sys.modules.pop("plugin_loop", None)
    sys.path[:] = [p for p in sys.path if not (p and (Path(p) / "plugin_loop.py").is_file())]


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's folder holding the plugin loop; sys.path and sys.modules restored after."""
    shutil.copy(HERE / "plugin_loop.py", tmp_path / "plugin_loop.py")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI adds the config's folder
    forget_plugin()
    yield tmp_path
    sys.modules.pop("plugin_loop", None)


# -- in process ----------------------------------------------------------------------------------------


def test_a_plugin_loop_runs_through_the_cli_and_its_log_tells_its_story(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, runs = write_config(folder, "happy"), folder / "runs"
    assert (
        main(
            [
                "run",
                str(config),
                "--question",
                QUESTION,
                "--runs-dir",
                str(runs),
                "--run-id",
                "happy",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)

    log = events(runs, "happy")
    types = [e["type"] for e in log]
    assert log[0]["data"]["coordinator"] == "plugin_loop:CritiqueLoop"
    assert log[0]["data"]["config"]["loop"]["drafts"] == DRAFTS, "the loop's keys are recorded"

    # Two waves, each with its own fingerprint; the loop's note sits between them.
    waves = [e for e in log if e["type"] == "wave.started"]
    assert [e["wave"] for e in waves] == [1, 2]
    prints = [e["data"]["fingerprint"] for e in waves]
    assert all(prints) and prints[0] != prints[1]
    [note] = [e for e in log if e["type"].startswith("loop.critique.")]
    assert note["type"] == "loop.critique.drafted" and note["wave"] == 1
    barrier_1 = next(i for i, e in enumerate(log) if e["type"] == "wave.barrier" and e["wave"] == 1)
    assert barrier_1 < log.index(note) < log.index(waves[1])
    drafts = sorted(
        (e for e in log if e["type"] == "lane.completed" and e["wave"] == 1), key=lambda e: e["lane"]
    )
    assert note["data"] == {"answers": [e["data"]["answer"] for e in drafts], "completed": DRAFTS}
    assert types.count("lane.completed") == DRAFTS + CRITICS
    assert types[-2:] == ["reduce.completed", "run.completed"]

    # The result: the vote over wave 2, the loop's own detail as `outcome`.
    assert result["status"] == "answered" and result["reducer"] == "majority_vote"
    assert result["outcome"] == {"drafts": note["data"]["answers"], "critique_wave": 2}
    assert sum(result["votes"].values()) == CRITICS
    assert next(e for e in log if e["type"] == "reduce.completed")["wave"] == 2

    assert main(["tail", "happy", "--runs-dir", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(log), "one line per event"
    [line] = [line for line in lines if "loop.critique.drafted" in line]
    assert json.dumps(note["data"]) in line and "wave=1" in line

    assert main(["show", "happy", "--runs-dir", str(runs), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["outcome"] == result["outcome"]
    assert shown["answer"] == result["answer"]


@pytest.mark.parametrize("cwd", ["the plugin's folder", "another folder"])
def test_resume_tail_and_show_find_the_plugin_of_a_run(
    folder: Path, cwd: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `orchestrator run` found the loop beside its config; the commands that take a run id
    # find it again in a fresh process, from that folder or from anywhere else.
    config, runs = write_config(folder, "later"), folder / "runs"
    assert (
        main(
            [
                "run",
                str(config),
                "--question",
                QUESTION,
                "--runs-dir",
                str(runs),
                "--run-id",
                "later",
                "--json",
            ]
        )
        == 0
    )
    capsys.readouterr()
    forget_plugin()
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(folder if cwd == "the plugin's folder" else elsewhere)
    for command in ("show", "tail", "resume"):
        assert main([command, "later", "--runs-dir", str(runs)]) == 0, capsys.readouterr().err
        forget_plugin()
    assert main(["reduce", "later", "--runs-dir", str(runs), "--reducer", "majority_vote", "--json"]) == 0, (
        capsys.readouterr().err
    )
    capsys.readouterr()


def test_an_unknown_loop_key_of_the_plugin_is_refused_naming_it(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = folder / "runs"
    typo = write_config(folder, "typo", extra="critiques = 4\n")
    assert main(["run", str(typo), "--question", QUESTION, "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "loop.critiques" in err and "unknown key" in err
    assert len(err.strip().splitlines()) == 1
    assert not runs.exists(), "a refused config leaves no run behind"

    assert main(["validate", str(typo)]) == 2
    assert "loop.critiques" in capsys.readouterr().err

    wrong = write_config(folder, "wrong")
    wrong.write_text(wrong.read_text().replace(f"drafts = {DRAFTS}", 'drafts = "3"'))
    assert main(["validate", str(wrong)]) == 2
    assert "loop.drafts" in capsys.readouterr().err


def test_a_plugin_run_from_python_is_tailed_and_shown_by_the_cli_without_its_loop(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run from Python with the working directory elsewhere: the loop is found beside its
    # config, as the CLI finds it, and the run records that folder.
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    runs = folder / "runs"
    config = lanefold.load_config(write_config(folder, "py"))
    result = lanefold.run_sync(config, QUESTION, runs_dir=runs, run_id="py")
    assert result.status == "answered"
    assert events(runs, "py")[0]["data"]["config_dir"] == str(folder.resolve())

    # Printing the record needs no loop: the loop's file is gone, a fresh process reads it.
    (folder / "plugin_loop.py").unlink()
    code, out, err = finish(cli(elsewhere, "tail", "py", "--runs-dir", str(runs)))
    assert (code, err) == (0, "")
    assert len(out.splitlines()) == len(events(runs, "py"))
    code, out, err = finish(cli(elsewhere, "show", "py", "--runs-dir", str(runs), "--json"))
    assert (code, err) == (0, "")
    assert json.loads(out)["answer"] == result.answer
    code, out, err = finish(cli(elsewhere, "resume", "py", "--runs-dir", str(runs), "--json"))
    assert (code, err) == (0, ""), "a finished run returns its record, running no loop"


def test_resuming_an_unfinished_plugin_run_without_its_loop_says_how_to_find_it(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = folder / "runs"
    config = write_config(folder, "cut")
    assert (
        main(
            ["run", str(config), "--question", QUESTION, "--runs-dir", str(runs), "--run-id", "cut", "--json"]
        )
        == 0
    )
    capsys.readouterr()
    log = runs / "cut" / "events.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    first_barrier = next(i for i, line in enumerate(lines) if '"type":"wave.barrier"' in line)
    log.write_text("".join(lines[: first_barrier + 1]))  # as if killed after wave 1
    moved = folder / "moved"
    moved.mkdir()
    (folder / "plugin_loop.py").rename(moved / "plugin_loop.py")
    code, _, err = finish(cli(folder / "runs", "resume", "cut", "--runs-dir", str(runs)))
    assert code == 2
    [line] = err.splitlines()
    assert "cannot import 'plugin_loop:CritiqueLoop'" in line
    assert f"run from {folder.resolve()} or put the folder that holds it on PYTHONPATH" in line
    assert len(log.read_text().splitlines()) == first_barrier + 1, "nothing written"
    code, out, err = finish(cli(moved, "resume", "cut", "--runs-dir", str(runs), "--json"))
    assert code == 0, err  # from the folder that holds the loop now, it goes on
    assert json.loads(out)["resumes"] == 1


def test_a_verifier_beside_a_config_is_found_from_python_as_from_the_cli(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (folder / "my_checks.py").write_text(
        "def check(question, text, answer):\n    return 1.0 if answer == '391' else 0.0\n"
    )
    path = folder / "judged.toml"
    path.write_text(
        '[loop]\nk = 4\nreducer = "judge_argmax"\n[judge]\n'
        'verifier = "my_checks:check"\n[backend]\nkind = "simulated"\n'
    )
    elsewhere = folder / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    try:
        result = lanefold.run_sync(lanefold.load_config(path), QUESTION, runs_dir=folder / "runs")
    finally:
        sys.modules.pop("my_checks", None)
    assert result.reducer == "judge_argmax" and result.answer == "391"
    assert set(result.scores.values()) <= {0.0, 1.0}


PLAIN_PARAMS = """
from typing import ClassVar
from pydantic import BaseModel
from lanefold import LoopContext, Outcome

class Params(BaseModel):  # a plain model: pydantic's default ignores unknown keys
    n: int = 1

class Plain:
    name: ClassVar[str] = "plain"
    Params: ClassVar[type[BaseModel]] = Params

    def __init__(self, params: Params) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        raise AssertionError("never run")
"""


def test_an_unknown_loop_key_is_refused_whatever_the_plugins_params_allow(folder: Path) -> None:
    (folder / "plain_loop.py").write_text(PLAIN_PARAMS)
    path = folder / "plain.toml"
    path.write_text('[loop]\ncoordinator = "plain_loop:Plain"\nnn = 2\n[backend]\nkind = "simulated"\n')
    try:
        with pytest.raises(lanefold.ConfigError) as caught:
            lanefold.load_config(path)
        assert str(caught.value) == f"{path}: loop.nn: unknown key"
        path.write_text('[loop]\ncoordinator = "plain_loop:Plain"\nn = 2\n[backend]\nkind = "simulated"\n')
        assert lanefold.load_config(path).loop_params.model_dump() == {"n": 2}
    finally:
        sys.modules.pop("plain_loop", None)


def test_schema_lists_each_registered_loops_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    variants = {v["title"]: v for v in schema["$defs"]["LoopSection"]["oneOf"]}
    sample = variants["[loop] of parallel_sample"]
    assert {"k", "reducer", "min_quorum", "tie_break", "weighting"} <= set(sample["properties"])
    assert {"coordinator", "seed", "max_concurrency"} <= set(sample["properties"])
    assert sample["additionalProperties"] is False


# -- a real crash: SIGKILL mid wave 2, then resume --------------------------------------------------


def wave_2_completed_in(log: Path) -> int:
    if not log.exists():
        return 0
    count = 0
    for line in log.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:  # the line being written
            continue
        count += event["type"] == "lane.completed" and event.get("wave") == 2
    return count


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    """A user's folder with the plugin, an uninterrupted run `base`, and a run `crash` killed
    with SIGKILL once wave 2 had landed a lane (its other lanes in flight or not yet sent).

    Each test crashes its own run: the log records the config's folder and resume imports
    the loop from there, so a copied folder would still resume with the original's loop.
    """
    folder = tmp_path / "user"
    folder.mkdir()
    shutil.copy(HERE / "plugin_loop.py", folder / "plugin_loop.py")
    runs = folder / "runs"
    code, _, err = finish(
        cli(
            folder,
            "run",
            str(write_config(folder, "base")),
            "--question",
            QUESTION,
            "--runs-dir",
            str(runs),
            "--run-id",
            "base",
            "--json",
        )
    )
    assert code == 0, err

    config = write_config(folder, "crash", latency="100, 200")
    proc = cli(
        folder, "run", str(config), "--question", QUESTION, "--runs-dir", str(runs), "--run-id", "crash"
    )
    log = runs / "crash" / "events.jsonl"
    deadline = time.monotonic() + 60  # a bound on a hang, not a measured time
    try:
        while wave_2_completed_in(log) < 1:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"the run never reached wave 2 (exit {proc.poll()})")
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    return folder


@pytest.mark.slow
def test_sigkill_mid_wave_then_resume_gives_the_uninterrupted_answer(crashed: Path) -> None:
    runs = crashed / "runs"
    before = events(runs, "crash")
    done_before = {(e["wave"], e["lane"]) for e in before if e["type"] == "lane.completed"}
    assert any(w == 2 for w, _ in done_before)
    assert not any(e["type"] == "wave.barrier" and e["wave"] == 2 for e in before), (
        "killed before wave 2 ended"
    )

    code, out, err = finish(cli(crashed, "resume", "crash", "--runs-dir", str(runs), "--json"))
    assert code == 0, err
    resumed = json.loads(out)
    base = events(runs, "base")[-1]["data"]["result"]
    assert (resumed["answer"], resumed["votes"], resumed["outcome"]) == (
        base["answer"],
        base["votes"],
        base["outcome"],
    )
    assert resumed["resumes"] == 1

    after = events(runs, "crash")
    completed = Counter((e["wave"], e["lane"]) for e in after if e["type"] == "lane.completed")
    assert set(completed) == {(1, lane) for lane in range(DRAFTS)} | {(2, lane) for lane in range(CRITICS)}
    assert set(completed.values()) == {1}, "no lane completed twice"
    assert [e["type"] for e in after].count("loop.critique.drafted") == 1, "the note is not rewritten"
    assert [e["wave"] for e in after if e["type"] == "wave.started"] == [1, 2]

    # Completed lanes were never sent again; the ones cut off or never sent were.
    resent = {(e["wave"], e["lane"]) for e in after[len(before) :] if e["type"] == "lane.dispatched"}
    assert resent == set(completed) - done_before


@pytest.mark.slow
def test_resume_with_a_changed_loop_is_refused_naming_the_wave(crashed: Path) -> None:
    runs = crashed / "runs"
    plugin = crashed / "plugin_loop.py"
    original = plugin.read_text()
    plugin.write_text(original.replace("Earlier drafts answered", "The drafts said"))
    before = len(events(runs, "crash"))
    code, _, err = finish(cli(crashed, "resume", "crash", "--runs-dir", str(runs)))
    assert code == 2, err
    [line] = err.strip().splitlines()
    assert "wave 2" in line and "another spec" in line
    added = [e["type"] for e in events(runs, "crash")[before:]]
    assert "lane.dispatched" not in added, "refused before a lane was sent"


@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_resumable_with_the_code_that_started_it(crashed: Path) -> None:
    # The refusal says "resume it with the code that started it": doing so must work.
    runs = crashed / "runs"
    plugin = crashed / "plugin_loop.py"
    original = plugin.read_text()
    plugin.write_text(original.replace("Earlier drafts answered", "The drafts said"))
    code, _, err = finish(cli(crashed, "resume", "crash", "--runs-dir", str(runs)))
    assert code == 2, err
    plugin.write_text(original)
    code, out, err = finish(cli(crashed, "resume", "crash", "--runs-dir", str(runs), "--json"))
    assert code == 0, err
    base = events(runs, "base")[-1]["data"]["result"]
    assert json.loads(out)["answer"] == base["answer"]


PLUGIN_KEYS = {
    "loop.coordinator": '[loop]\ncoordinator = "{module}:Loop"\n',
    "loop.reducer": '[loop]\nreducer = "{module}:Reducer"\n',
    "judge.verifier": '[loop]\nreducer = "judge_argmax"\n[judge]\nverifier = "{module}:score"\n',
}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize(
    "body",
    ["import sys\nsys.exit(0)\n", "raise SystemExit('bye')\n"],
    ids=["sys.exit(0)", "SystemExit('bye')"],
)
@pytest.mark.parametrize("key", PLUGIN_KEYS)
def test_a_plugin_module_that_exits_at_import_is_a_config_error_naming_its_key(
    key: str, body: str, command: str, tmp_path: Path
) -> None:
    # In a real process: an exit at import must not become the command's own exit (0, nothing
    # created, no word said), whichever key names the module.
    import subprocess

    (tmp_path / "exits_at_import.py").write_text(body)
    config = tmp_path / "loop.toml"
    config.write_text(PLUGIN_KEYS[key].format(module="exits_at_import") + '[backend]\nkind = "simulated"\n')
    argv = [command, str(config)] + (
        ["--question", QUESTION, "--runs-dir", "runs"] if command == "run" else []
    )
    done = subprocess.run(
        [sys.executable, "-m", "lanefold", *argv],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(HERE.parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.splitlines()
    assert f"{key}: cannot import 'exits_at_import:" in line
    assert "SystemExit" in line and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()
