"""The `orchestrator` command and the Python API, end to end over the simulated backend.

Most tests call `lanefold._cli.main` in-process (what the `orchestrator` script calls); a
few run the command in a subprocess where only a real process shows the behaviour (a second
process following a log, Ctrl-C, a clean stdout).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import lanefold
from lanefold._cli import main
from lanefold.primitives.events import SCHEMA_VERSION

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
        [sys.executable, "-m", "lanefold._cli", *map(str, argv)],
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


# -- run ------------------------------------------------------------------------------------------


def test_run_json_prints_one_result_object(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = cli(
        capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "fresh", "--json"
    )
    assert outcome.code == 0
    assert outcome.err == ""
    result = outcome.json
    _check_result(result)
    assert result["run_id"] == "fresh"
    assert Path(result["events"]).resolve() == events_path(runs, "fresh").resolve()
    k, prompt, output = 8, 40, 60  # from examples/simulated.toml
    assert result["lanes_completed"] + result["lanes_failed"] == k
    assert sum(result["votes"].values()) == result["lanes_completed"]
    assert result["answer"] == max(result["votes"], key=result["votes"].get)
    usage, cost = result["usage"], result["cost"]
    # shares_prefix: the wave's prompt is computed once, served from the prefix K-1 times
    assert usage["prefill_tokens"] == prompt
    assert usage["cached_prefill_tokens"] == (k - 1) * prompt
    assert usage["decode_tokens"] == result["lanes_completed"] * output
    assert usage["verifier_tokens"] == 0
    # priced line by line from [pricing]: 0.15 / 0.075 / 0.60 USD per million tokens
    assert cost["prefill"] == pytest.approx(prompt * 0.15e-6)
    assert cost["cached_prefill"] == pytest.approx((k - 1) * prompt * 0.075e-6)
    assert cost["decode"] == pytest.approx(usage["decode_tokens"] * 0.60e-6)
    assert cost["verifier"] == 0


def test_run_without_shared_prefix_pays_every_prefill(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example_variant(tmp_path, {"backend": {"shares_prefix": False, "latency_ms": [0, 0]}})
    result = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--json").json
    assert result["usage"]["prefill_tokens"] == 8 * 40
    assert result["usage"]["cached_prefill_tokens"] == 0
    assert result["cost"]["cached_prefill"] == 0


def test_run_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    done = command(
        "run", "examples/simulated.toml", "--question", QUESTION, "--runs-dir", runs, "--json", "-v"
    )
    assert done.code == 0, done.err
    result = done.json  # with --json, nothing but the JSON reaches stdout (even with -v)
    _check_result(result)
    assert result["answer"] == "391"
    assert Path(result["events"]).parent.parent == runs
    assert log_events(result["events"])[-1]["type"] == "run.completed"


def test_run_is_deterministic_for_a_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", tmp_path / "a", "--json").json
    second = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", tmp_path / "b", "--json").json
    assert first["run_id"] != second["run_id"]
    for key in ("answer", "votes", "winner_lane", "lanes_completed", "usage", "cost"):
        assert first[key] == second[key], key


def test_run_without_json_prints_a_summary(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    outcome = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "plain")
    assert outcome.code == 0
    assert "391" in outcome.out and "plain" in outcome.out
    assert outcome.err == ""


def test_run_with_an_existing_run_id_exits_2(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = events_path(runs, "done").read_bytes()
    again = cli(
        capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "done", "--json"
    )
    assert again.code == 2
    assert "done" in again.error_line
    assert again.out == ""
    assert events_path(runs, "done").read_bytes() == before


@pytest.mark.parametrize("question", ["", "   "])
def test_run_with_an_empty_question_exits_2(
    question: str, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = cli(capsys, "run", EXAMPLE, "--question", question, "--runs-dir", runs)
    assert outcome.code == 2
    assert "question" in outcome.error_line
    assert not runs.exists()


@pytest.mark.parametrize("run_id", ["../x", "a/b", "..", "ABSOLUTE", "a/../b", ".hidden", "a b", "x\\y", ""])
def test_run_rejects_run_ids_that_are_not_plain_names(
    run_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "nest" / "runs"
    if run_id == "ABSOLUTE":
        run_id = str(tmp_path / "abs")
    outcome = cli(
        capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", run_id, "--json"
    )
    assert outcome.code == 2
    assert "run id" in outcome.error_line
    assert outcome.out == ""
    assert sorted(p.name for p in tmp_path.rglob("*")) == [], "nothing may be written"


@pytest.mark.parametrize("subcommand", ["resume", "show", "tail"])
@pytest.mark.parametrize("run_id", ["../done", "a/b", "..", "ABSOLUTE"])
def test_other_commands_reject_run_ids_that_are_not_plain_names(
    finished: Outcome, subcommand: str, run_id: str, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every path these ids could reach holds a real log, so only the id check stops them.
    inner = runs / "inner"
    good = events_path(runs, "done").read_bytes()
    for folder in (inner / "a" / "b", runs):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "events.jsonl").write_bytes(good)
    if run_id == "ABSOLUTE":
        run_id = str(runs / "done")
    outcome = cli(capsys, subcommand, run_id, "--runs-dir", inner)
    assert outcome.code == 2
    assert "run id" in outcome.error_line
    assert outcome.out == ""


# -- show and resume --------------------------------------------------------------------------------


def test_show_and_resume_print_the_runs_object(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = events_path(runs, "done")
    before = log.read_bytes()
    shown = cli(capsys, "show", "done", "--runs-dir", runs, "--json")
    resumed = cli(capsys, "resume", "done", "--runs-dir", runs, "--json")
    assert (shown.code, resumed.code) == (0, 0)
    # show adds every reduction of the run, its own first
    shown_json = shown.json
    reductions = shown_json.pop("reductions")
    assert [r["reduction"] for r in reductions] == [1]
    assert reductions[0]["winner"] == finished.json["answer"]
    assert shown_json == finished.json
    assert resumed.json == finished.json
    assert resumed.out == finished.out
    assert log.read_bytes() == before, "show and resume of a finished run append nothing"


def test_resume_of_a_finished_run_calls_no_backend(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = tmp_path / "calls.txt"
    config = example_variant(tmp_path, {"backend": {"call_log": str(calls), "latency_ms": [0, 0]}})
    ran = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "counted", "--json"
    )
    assert ran.code == 0
    made = calls.read_text().splitlines()
    assert len(made) == 8  # one attempt per lane, no faults
    assert cli(capsys, "resume", "counted", "--runs-dir", runs).code == 0
    assert calls.read_text().splitlines() == made


def test_show_without_json_is_readable(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = cli(capsys, "show", "done", "--runs-dir", runs)
    assert shown.code == 0
    assert "391" in shown.out
    assert "{" not in shown.out.splitlines()[0]


@pytest.mark.parametrize("subcommand", ["resume", "show", "tail"])
def test_unknown_run_id_exits_2(subcommand: str, runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs.mkdir()
    outcome = cli(capsys, subcommand, "unknown-id", "--runs-dir", runs)
    assert outcome.code == 2
    assert "unknown-id" in outcome.error_line
    assert outcome.out == ""
    assert list(runs.iterdir()) == [], "looking up a run must not create it"


def _corrupt(lines: list[str], kind: str, at: int) -> list[str]:
    """Lines with line number `at` (1-based) spoilt."""
    spoilt = list(lines)
    i = at - 1
    if kind == "garbage":
        spoilt[i] = "{not json"
    elif kind == "blank":
        spoilt[i] = ""
    elif kind == "duplicate":
        spoilt.insert(i, lines[i - 1])
    elif kind == "unknown-type":
        event = json.loads(lines[i])
        event["type"] = "lane.teleported"
        spoilt[i] = json.dumps(event)
    elif kind == "wrong-sequence":
        event = json.loads(lines[i])
        event["sequence"] += 5
        spoilt[i] = json.dumps(event)
    return spoilt


@pytest.mark.parametrize("finished_log", [True, False], ids=["finished", "unfinished"])
@pytest.mark.parametrize("kind", ["garbage", "blank", "duplicate", "unknown-type", "wrong-sequence"])
def test_a_corrupt_log_makes_resume_and_show_exit_2_naming_the_line(
    finished: Outcome, kind: str, finished_log: bool, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = relabel(log_lines(events_path(runs, "done")), "bad")
    if not finished_log:
        lines = lines[:12]  # a crash after some lanes landed: resumable, were it not corrupt
    log = events_path(runs, "bad")
    log.parent.mkdir()
    log.write_text("\n".join(_corrupt(lines, kind, at=5)) + "\n", encoding="utf-8")
    before = log.read_bytes()
    for subcommand in ("resume", "show", "tail"):
        outcome = cli(capsys, subcommand, "bad", "--runs-dir", runs, "--json")
        assert outcome.code == 2, subcommand
        assert re.search(r"events\.jsonl:5\b", outcome.error_line), outcome.error_line
        assert outcome.out == ""
    assert log.read_bytes() == before, "a corrupt log is left as it was found"


def test_resume_cuts_a_torn_tail_and_finishes(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = relabel(log_lines(events_path(runs, "done")), "torn")
    half = lines[12][: len(lines[12]) // 2]
    log = events_path(runs, "torn")
    log.parent.mkdir()
    log.write_text("\n".join(lines[:12]) + "\n" + half, encoding="utf-8")
    resumed = cli(capsys, "resume", "torn", "--runs-dir", runs, "--json")
    assert resumed.code == 0, resumed.err
    result = resumed.json
    original = finished.json
    assert result["answer"] == original["answer"]
    assert result["votes"] == original["votes"]
    events = log_events(log)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    marks = [e for e in events if e["type"] == "run.resumed"]
    assert len(marks) == 1
    assert marks[0]["data"]["torn_tail_bytes"] == len(half.encode())
    assert events[-1]["type"] == "run.completed"


# -- tail -------------------------------------------------------------------------------------------


def test_tail_prints_one_readable_line_per_event(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = log_events(events_path(runs, "done"))
    outcome = cli(capsys, "tail", "done", "--runs-dir", runs)
    assert outcome.code == 0
    printed = outcome.out.splitlines()
    assert len(printed) == len(events)
    for line, event in zip(printed, events, strict=True):
        assert line.startswith(f"#{event['sequence']} ")
        assert event["type"] in line
        assert not line.lstrip().startswith("{")


def test_tail_json_prints_the_logs_lines(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = log_lines(events_path(runs, "done"))
    outcome = cli(capsys, "tail", "done", "--runs-dir", runs, "--json")
    assert outcome.code == 0
    printed = outcome.out.splitlines()
    assert [json.loads(line) for line in printed] == [json.loads(line) for line in lines]
    assert printed == lines


@pytest.mark.timeout(60)  # a follower that never ends must fail, not hang
@pytest.mark.parametrize("as_json", [False, True])
def test_tail_follow_of_a_finished_run_exits_0(
    finished: Outcome, runs: Path, as_json: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = log_lines(events_path(runs, "done"))
    outcome = cli(capsys, "tail", "done", "--runs-dir", runs, "--follow", *(["--json"] if as_json else []))
    assert outcome.code == 0
    assert len(outcome.out.splitlines()) == len(lines)
    if as_json:
        assert outcome.out.splitlines() == lines


@pytest.mark.timeout(60)  # a follower that never ends must fail, not hang
def test_tail_follow_waits_for_a_run_that_has_not_started(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A wrapper that says "ready" once imports are done, so the follower is surely waiting
    # before the run exists; it then runs exactly what the `orchestrator` script runs.
    code = (
        "import sys; from lanefold._cli import main; print('ready', flush=True); sys.exit(main(sys.argv[1:]))"
    )
    follower = subprocess.Popen(
        [sys.executable, "-c", code, "tail", "later", "--runs-dir", str(runs), "--follow", "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdout.readline() == "ready\n"
        assert not runs.exists()
        ran = cli(
            capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--run-id", "later", "--json"
        )
        assert ran.code == 0
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert err == ""
    assert out.splitlines() == log_lines(events_path(runs, "later"))
    assert json.loads(out.splitlines()[-1])["type"] == "run.completed"


@pytest.mark.parametrize(
    ("wait", "why"),
    [
        ("nan", "is not a finite number of seconds"),
        ("inf", "is not a finite number of seconds"),
        ("-inf", "is not a finite number of seconds"),
        ("1e999", "is not a finite number of seconds"),
        ("-1", "is negative"),
        ("soon", "is not a number of seconds"),
    ],
)
def test_tail_wait_takes_a_finite_number_of_seconds(
    wait: str, why: str, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--wait nan` used to reach anyio's move_on_after and end in a ValueError traceback.
    with pytest.raises(SystemExit) as exit_:
        main(["tail", "later", "--runs-dir", str(runs), "--follow", f"--wait={wait}"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.splitlines() == [
        f"orchestrator tail: error: argument --wait: {wait!r} {why} (see orchestrator tail --help)"
    ]


def test_tail_follow_ends_on_ctrl_c_quietly_with_exit_0(finished: Outcome, runs: Path) -> None:
    # A run that has started and not ended: the follower waits for more. Every wait below is
    # on something the follower does (a line it prints), never on a clock: load cannot flake it.
    log = events_path(runs, "waiting")
    log.parent.mkdir()
    log.write_text(relabel(log_lines(events_path(runs, "done")), "waiting")[0] + "\n", encoding="utf-8")
    follower = subprocess.Popen(
        [sys.executable, "-m", "lanefold._cli", "tail", "waiting", "--runs-dir", str(runs), "--follow"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()  # printed from inside the follow loop
        assert first.startswith("#1 ") and "run.started" in first
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert err == ""
    assert out == ""


# -- failures -------------------------------------------------------------------------------------


def test_budget_too_small_for_the_quorum_exits_3(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example_variant(tmp_path, {"budget": {"max_tokens": 50}})
    outcome = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "poor", "--json"
    )
    assert outcome.code == 3
    assert "budget" in outcome.error_line
    assert outcome.out == ""
    events = log_events(events_path(runs, "poor"))
    assert [e["type"] for e in events[-2:]] == ["budget.exhausted", "run.failed"]
    assert not any(e["type"] == "lane.dispatched" for e in events)
    exhausted, failed = events[-2]["data"], events[-1]["data"]
    assert exhausted["limit"] == "max_tokens"
    assert exhausted["min_quorum"] == 3 and exhausted["k_fit"] < 3
    assert failed["exit_code"] == 3


def test_resume_of_a_failed_run_keeps_its_exit_code_and_log(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = example_variant(tmp_path, {"budget": {"max_tokens": 50}})
    assert (
        cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "poor").code == 3
    )
    log = events_path(runs, "poor")
    before = log.read_bytes()
    outcome = cli(capsys, "resume", "poor", "--runs-dir", runs, "--json")
    assert outcome.code == 3
    assert outcome.error_line and outcome.out == ""
    assert log.read_bytes() == before
    shown = cli(capsys, "show", "poor", "--runs-dir", runs, "--json")
    assert shown.json["status"] == "failed"


def test_a_run_whose_faults_exceed_retries_exits_1_with_a_complete_log(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attempts, k = 2, 8
    config = example_variant(
        tmp_path,
        {
            "backend": {"failure_rate": 1.0, "latency_ms": [0, 0]},
            "retry": {"max_attempts": attempts, "initial_backoff_s": 0.0, "max_backoff_s": 0.0},
        },
    )
    outcome = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "faulty", "--json"
    )
    assert outcome.code == 1
    assert outcome.error_line and outcome.out == ""
    events = log_events(events_path(runs, "faulty"))
    assert events[-1]["type"] == "run.failed"
    assert events[-1]["data"]["exit_code"] == 1
    failed = [e for e in events if e["type"] == "lane.failed"]
    per_lane = Counter(e["lane"] for e in failed)
    assert per_lane == dict.fromkeys(range(k), attempts)
    for lane in range(k):
        mine = [e for e in failed if e["lane"] == lane]
        assert [e["attempt"] for e in mine] == list(range(1, attempts + 1))
        assert [e["data"]["final"] for e in mine] == [False] * (attempts - 1) + [True]
        assert all(e["data"]["retryable"] for e in mine)
    dispatched = Counter((e["lane"], e["attempt"]) for e in events if e["type"] == "lane.dispatched")
    assert dispatched == Counter((e["lane"], e["attempt"]) for e in failed)
    barrier = [e for e in events if e["type"] == "wave.barrier"]
    assert len(barrier) == 1
    assert barrier[0]["data"] == {"completed": [], "failed": list(range(k))}


def test_a_runs_dir_that_is_a_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    runs.write_text("not a folder")
    outcome = cli(capsys, "run", EXAMPLE, "--question", QUESTION, "--runs-dir", runs, "--json")
    assert outcome.code == 2
    assert str(runs) in outcome.error_line
    assert outcome.out == ""


# -- judge + argmax ---------------------------------------------------------------------------------


def test_best_of_n_example_prices_the_judge_as_verifier(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = ROOT / "examples" / "best_of_n.toml"
    result = cli(
        capsys, "run", example, "--question", QUESTION, "--runs-dir", runs, "--run-id", "best", "--json"
    ).json
    _check_result(result)
    assert result["answer"] == "391"
    assert result["votes"] == {}
    assert set(result["scores"]) == {str(lane) for lane in range(result["lanes_completed"])}
    judged = [e for e in log_events(events_path(runs, "best")) if e["type"] == "judge.completed"]
    assert len(judged) == result["lanes_completed"]
    winner = str(result["winner_lane"])
    assert result["scores"][winner] == max(v for v in result["scores"].values() if v is not None)
    # one judge call per candidate: prompt_tokens (default 64) + judge_output_tokens (16)
    assert result["usage"]["verifier_tokens"] == result["lanes_completed"] * (64 + 16)
    assert result["cost"]["verifier"] == pytest.approx(result["usage"]["verifier_tokens"] * 0.30e-6)


VERIFIER = """
def score(question, text, answer):
    return 10.0 if answer == "391" else 1.0


def broken(question, text, answer):
    raise ValueError("the verifier fell over")
"""


def _verifier_config(folder: Path, spec: str) -> Path:
    return example_variant(
        folder,
        {
            "loop": {"reducer": "judge_argmax", "min_quorum": 1},
            "judge": {"verifier": spec},
            "backend": {"latency_ms": [0, 0]},
        },
    )


def test_a_python_verifier_scores_without_an_llm_wave(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lanefold_test_verifier.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _verifier_config(tmp_path, "lanefold_test_verifier:score")
    result = cli(
        capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "verified", "--json"
    ).json
    assert result["answer"] == "391"
    assert result["usage"]["verifier_tokens"] == 0
    assert result["usage"]["requests"] == 1, "no second wave of backend calls"
    judged = [e["data"] for e in log_events(events_path(runs, "verified")) if e["type"] == "judge.completed"]
    assert {d["judge"] for d in judged} == {"lanefold_test_verifier:score"}
    assert sorted(d["score"] for d in judged) == sorted(result["scores"].values())


def test_an_unimportable_verifier_exits_2(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _verifier_config(tmp_path, "lanefold_no_such_module:score")
    outcome = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "noverifier")
    assert outcome.code == 2
    assert "judge.verifier" in outcome.error_line


def test_a_verifier_that_raises_leaves_a_complete_log(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "lanefold_test_verifier.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = _verifier_config(tmp_path, "lanefold_test_verifier:broken")
    try:
        outcome = cli(capsys, "run", config, "--question", QUESTION, "--runs-dir", runs, "--run-id", "broken")
    finally:
        events = log_events(events_path(runs, "broken"))
    # A verifier that raises abstains, with its reason in the record; with every candidate
    # abstaining the run ends without an answer: completed, status no_answer, exit 4.
    last = events[-1]
    assert last["type"] == "run.completed"
    assert last["data"]["result"]["status"] == "no_answer"
    assert last["data"]["result"]["answer"] is None
    assert "no candidate got a score" in last["data"]["result"]["reason"]
    assert outcome.code == 4
    assert outcome.err == ""
    judged = [e["data"] for e in events if e["type"] == "judge.completed"]
    assert judged and all(j["score"] is None and "verifier raised" in j["detail"] for j in judged)


# -- the event log ----------------------------------------------------------------------------------


def test_every_event_has_the_envelope(finished: Outcome, runs: Path) -> None:
    events = log_events(events_path(runs, "done"))
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert len({e["id"] for e in events}) == len(events)
    for event in events:
        assert event["specversion"] == "1.0"
        assert event["schemaversion"] == SCHEMA_VERSION
        assert isinstance(event["id"], str) and event["id"]
        assert isinstance(event["source"], str) and event["source"]
        assert re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", event["type"])
        assert event["run_id"] == "done"
        assert RFC3339_UTC.fullmatch(event["time"]), event["time"]
        when = datetime.fromisoformat(event["time"])
        assert when.utcoffset() == timedelta(0)
        assert set(event) <= {
            "specversion",
            "schemaversion",
            "id",
            "source",
            "type",
            "time",
            "sequence",
            "run_id",
            "wave",
            "lane",
            "attempt",
            "data",
        }
        if event["type"].startswith("lane."):
            assert {"wave", "lane", "attempt"} <= set(event)
        if event["type"].startswith("run."):
            assert "lane" not in event
    kinds = [e["type"] for e in events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed"
    for expected in ("wave.started", "lane.dispatched", "lane.completed", "wave.barrier", "reduce.completed"):
        assert expected in kinds
    for event in events:
        if event["type"] == "lane.completed":
            usage = event["data"]["usage"]
            assert {"gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"} <= set(usage)


def test_run_started_holds_the_resolved_config_and_its_hash(finished: Outcome, runs: Path) -> None:
    started = log_events(events_path(runs, "done"))[0]
    assert started["type"] == "run.started"
    config = lanefold.load_config(EXAMPLE)
    assert started["data"]["config"] == config.model_dump(mode="json")
    assert started["data"]["config_hash"] == lanefold.config_hash(config)
    assert started["data"]["question"] == QUESTION
    # resolved: the recorded config alone rebuilds the same config
    again = lanefold.parse_config(started["data"]["config"])
    assert lanefold.config_hash(again) == started["data"]["config_hash"]


def test_run_completed_holds_the_printed_result(finished: Outcome, runs: Path) -> None:
    last = log_events(events_path(runs, "done"))[-1]
    assert last["data"]["result"] == finished.json


# -- the Python API ---------------------------------------------------------------------------------


def test_run_sync_returns_a_run_result(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = lanefold.run_sync(lanefold.load_config(EXAMPLE), QUESTION, runs_dir=runs)
    assert isinstance(result, lanefold.RunResult)
    assert result.answer == "391"
    assert sum(result.votes.values()) == result.lanes_completed
    assert isinstance(result.usage, lanefold.UsageBreakdown)
    assert isinstance(result.cost, lanefold.CostBreakdown)
    assert result.usage.prefill_tokens == 40
    assert result.cost.total > 0
    assert result.events is not None and Path(result.events).is_file()
    assert capsys.readouterr() == ("", ""), "the library prints nothing"
    # the same object the CLI prints
    shown = cli(capsys, "show", result.run_id, "--runs-dir", runs, "--json")
    shown_json = shown.json
    assert shown_json.pop("reductions")[0]["reducer"] == "majority_vote"
    assert shown_json == result.model_dump(mode="json")
    again = lanefold.resume_sync(result.run_id, runs_dir=runs)
    assert again == result


def test_run_sync_raises_the_error_tree(runs: Path, tmp_path: Path) -> None:
    config = lanefold.load_config(example_variant(tmp_path, {"budget": {"max_tokens": 50}}))
    with pytest.raises(lanefold.BudgetExhaustedError) as caught:
        lanefold.run_sync(config, QUESTION, runs_dir=runs)
    assert caught.value.exit_code == 3
    with pytest.raises(lanefold.RunNotFoundError):
        lanefold.resume_sync("never-ran", runs_dir=runs)
    with pytest.raises(lanefold.ConfigError):
        lanefold.run_sync(config, QUESTION, runs_dir=runs, run_id="../escape")


@pytest.mark.anyio
async def test_async_run_and_resume(runs: Path) -> None:
    config = lanefold.load_config(EXAMPLE)
    result = await lanefold.run(config, QUESTION, runs_dir=runs, run_id="async")
    assert isinstance(result, lanefold.RunResult)
    assert result.run_id == "async"
    assert result.answer == "391"
    assert result.votes and result.usage.decode_tokens == result.lanes_completed * 60
    assert await lanefold.resume("async", runs_dir=runs) == result
    # a path is accepted where a config is
    other = await lanefold.run(EXAMPLE, QUESTION, runs_dir=runs, run_id="by-path")
    assert (other.answer, other.votes) == (result.answer, result.votes)
