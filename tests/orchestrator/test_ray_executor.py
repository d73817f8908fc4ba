"""Questions on a real local Ray cluster (started here, on loopback): the same eval as in one
process, question for question; a worker killed by its pid mid-eval is replaced and its runs
resume from the shared log, no completed lane dispatched again, no spend counted twice.

The simulated backend's answers are a function of the prompt and the lane's seed (a
re-dispatched lane says the same thing), so results compare exactly; nothing here times.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import lanefold
import lanefold.cli._main as cli
from lanefold import read_run
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import QuestionResult, read_results
from lanefold.evaluate._item import Item
from lanefold.execution._ray_executor import RayExecutor
from lanefold.primitives import ConfigError

ray = pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Any:
    """One local cluster for the module: two CPUs, on 127.0.0.1, no dashboard."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level=logging.WARNING,
        object_store_memory=100 * 1024 * 1024,
    )
    yield ray
    ray.shutdown()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # one backend per test for time; run_many's test runs on trio


def config(latency_ms: tuple[float, float] = (1, 3), k: int = 4) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": k, "seed": 3, "max_concurrency": k},
            "backend": {
                "kind": "simulated",
                "accuracy": 0.6,
                "answer": "391",
                "distractors": ["381", "401"],
                "latency_ms": list(latency_ms),
            },
            "log": {"fsync": "never"},
        }
    )


def items(n: int) -> list[Item]:
    return [Item(i, f"Question number {i}?", "391", source=f"<test>:{i + 1}") for i in range(n)]


def same(a: QuestionResult, b: QuestionResult) -> dict[str, Any]:
    """What a question's row says, without where and how long it ran."""
    keep = ("index", "answer", "correct", "status", "lanes", "lane_answers", "lane_correct", "tokens", "cost")
    assert a.run_id == b.run_id
    return {key: getattr(a, key) for key in keep}


def rows(folder: Path, eval_id: str, url: str | None = None) -> dict[int, QuestionResult]:
    """An eval's rows from its store: files under `folder`, or the database at `url`."""
    return read_results(lanefold.open_store(url, folder).eval_record(eval_id))


def test_no_cluster_at_auto_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the module's cluster starts (first in the file): "auto" finds none to join."""
    if ray.is_initialized():
        pytest.skip("a cluster of this process is running")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # not another process's cluster either
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    dataset = tmp_path / "q.jsonl"
    dataset.write_text('{"question": "Q?", "answer": "391"}\n')
    assert (
        cli.main(
            [
                "eval",
                "examples/simulated.toml",
                "--dataset",
                str(dataset),
                "--runs-dir",
                str(tmp_path / "runs"),
                "--executor",
                "ray",
                "--ray-address",
                "auto",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--ray-address auto: Could not find any running Ray instance" in err, err
    assert not (tmp_path / "runs").exists()  # said before anything was written


@pytest.mark.anyio
async def test_200_questions_on_two_workers_equal_one_process(cluster: Any, tmp_path: Path) -> None:
    cfg, questions = config(), items(200)
    await run_eval(cfg, questions, eval_id="e", runs_dir=tmp_path / "local", concurrency=8)
    summary = await run_eval(
        cfg, questions, eval_id="e", runs_dir=tmp_path / "ray", concurrency=4, executor=RayExecutor(workers=2)
    )
    local, remote = rows(tmp_path / "local", "e"), rows(tmp_path / "ray", "e")
    assert sorted(remote) == list(range(200)) and summary.n == 200
    assert [same(remote[i], local[i]) for i in range(200)] == [same(local[i], local[i]) for i in range(200)]


@pytest.mark.anyio
@pytest.mark.parametrize("store", ["files", "postgresql"])
async def test_a_worker_killed_mid_eval_is_replaced_and_no_lane_runs_twice(
    cluster: Any, tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    """On PostgreSQL the dead worker's writer lock is an advisory lock that dies with its
    connection; on files, an OS lock that dies with its process."""
    url = request.getfixturevalue("pg_url") if store == "postgresql" else None
    cfg, questions = config(latency_ms=(20, 200)), items(32)  # lanes land far apart
    await run_eval(cfg, questions, eval_id="e", runs_dir=tmp_path / "local", concurrency=8)
    killed: list[int] = []

    record = lanefold.open_store(url, tmp_path / "ray")

    def midway(run_id: str) -> bool:
        """Some lane of the run completed, the run did not."""
        if not record.exists(run_id):
            return False
        types = [event.type for event in read_run(record, run_id)[0]]
        return "lane.completed" in types and "run.completed" not in types

    def kill_one(row: QuestionResult) -> None:
        if killed or len(rows(tmp_path / "ray", "e", url)) < 4:
            return  # kill once, with questions done and others in flight
        for name in sorted(
            a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "lanefold"
        ):
            worker = ray.get_actor(name, namespace="lanefold")
            pid = ray.get(worker.pid.remote())
            if any(midway(run_id) for run_id in ray.get(worker.jobs.remote())):
                os.kill(pid, signal.SIGKILL)  # a worker holding a run half done
                killed.append(pid)
                return

    summary = await run_eval(
        cfg,
        questions,
        eval_id="e",
        runs_dir=tmp_path / "ray",
        concurrency=4,
        executor=RayExecutor(workers=2),
        on_result=kill_one,
        store=url,
    )
    assert killed and summary.n == 32 and summary.failed == 0
    local, remote = rows(tmp_path / "local", "e"), rows(tmp_path / "ray", "e", url)
    resumed = 0
    assert (tmp_path / "ray" / "e.0").exists() == (url is None)  # the runs are where asked
    for i in range(32):
        events = read_run(record, f"e.{i}")[0]
        completed: set[tuple[int, int]] = set()
        dispatched_after = collections.Counter[tuple[int, int]]()
        for event in events:
            key = (event.wave or 0, event.lane or 0)
            if event.type == "lane.completed":
                completed.add(key)
            elif event.type == "lane.dispatched" and key in completed:
                dispatched_after[key] += 1
        assert not dispatched_after, f"run e.{i}: completed lanes dispatched again"
        resumed += any(event.type == "run.resumed" for event in events)
        a, b = remote[i], local[i]
        assert (a.answer, a.correct, a.lane_answers) == (b.answer, b.correct, b.lane_answers)
        # Spend not doubled: decode as in one process (each completed lane billed once), the
        # prompt tokens too, though a prompt sent again after the kill was computed again
        # where one process found it cached; the holds of lanes cut off are `cut_off`.
        prompt = a.tokens["prefill"] + a.tokens["cached_prefill"]
        assert (a.tokens["decode"], a.tokens["verifier"], prompt) == (
            b.tokens["decode"],
            b.tokens["verifier"],
            b.tokens["prefill"] + b.tokens["cached_prefill"],
        ), f"run e.{i}"
        assert a.tokens["cut_off"] == 0 or any(e.type == "run.resumed" for e in events)
    assert resumed >= 1  # the kill landed mid-run: some run went on from its log


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_session_run_many_on_workers(cluster: Any, tmp_path: Path) -> None:
    questions = [f"Question number {i}?" for i in range(12)]
    async with lanefold.Session(config(), runs_dir=tmp_path / "l") as session:
        local = {r.index: r async for r in session.run_many(questions, run_ids=[f"q-{i}" for i in range(12)])}
    async with lanefold.Session(
        config(), runs_dir=tmp_path / "r", executor=RayExecutor(workers=2)
    ) as session:
        remote = {
            r.index: r
            async for r in session.run_many(questions, concurrency=2, run_ids=[f"q-{i}" for i in range(12)])
        }
    assert sorted(remote) == list(range(12))
    for i in range(12):
        assert (remote[i].run_id, remote[i].answer, remote[i].usage) == (
            local[i].run_id,
            local[i].answer,
            local[i].usage,
        )


def test_the_eval_command_on_workers(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "q.jsonl"
    dataset.write_text(
        "".join(f'{{"question": "Question number {i}?", "answer": "391"}}\n' for i in range(24))
    )
    summaries = []
    for executor in (
        ["--executor", "local"],
        ["--executor", "ray", "--workers", "2", "--ray-address", "auto"],
    ):
        folder = tmp_path / executor[1]
        assert (
            cli.main(
                [
                    "eval",
                    "examples/simulated.toml",
                    "--dataset",
                    str(dataset),
                    "--runs-dir",
                    str(folder),
                    "--eval-id",
                    "e",
                    "--json",
                    *executor,
                ]
            )
            == 0
        )
        summaries.append(json.loads(capsys.readouterr().out))
        assert len(rows(folder, "e")) == 24
    local, remote = summaries
    for key in ("n", "correct", "abstentions", "failed", "tokens", "cost", "pass_at_k"):
        assert remote[key] == local[key], key


def test_bad_executor_input(cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--workers: must be at least 1"):
        RayExecutor(workers=0)
    with pytest.raises(ConfigError, match="executor: unknown executor 'dask'"):
        lanefold.Session(config(), executor="dask")
    dataset = tmp_path / "q.jsonl"
    dataset.write_text('{"question": "Q?", "answer": "391"}\n')
    base = ["eval", "examples/simulated.toml", "--dataset", str(dataset), "--runs-dir", str(tmp_path)]
    for extra, message in (
        (["--executor", "spark"], "--executor: unknown executor 'spark'"),
        (["--workers", "2"], "--workers: only with --executor ray"),
        (["--ray-address", "auto"], "--ray-address: only with"),
        (["--executor", "ray", "--workers", "0"], "--workers: must be"),
    ):
        assert cli.main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob("*/eval.json"))  # nothing written


def test_missing_ray_is_one_line_with_the_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install 'lanefold\[scale\]'"):
        RayExecutor()


# -- an address that does not answer: one line, exit 2, within --ray-connect-timeout ----------------


def _eval_joining(address: str, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`orchestrator eval --executor ray --ray-address ADDRESS` in its own process (Ray is the
    process's: the module's cluster must not be the one found)."""
    dataset = tmp_path / "q.jsonl"
    dataset.write_text('{"question": "Q?", "answer": "391"}\n')
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "lanefold",
            "eval",
            "examples/simulated.toml",
            "--dataset",
            str(dataset),
            "--runs-dir",
            str(tmp_path / "runs"),
            "--executor",
            "ray",
            "--ray-address",
            address,
            *flags,
        ],
        cwd=ROOT,
        env={**env, "RAY_TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )  # a hang guard: today's bound is the flag's seconds


@pytest.mark.slow
def test_an_address_nothing_listens_on_is_one_line_at_once(tmp_path: Path) -> None:
    # It used to retry for more than 240 s. Refused at the TCP probe: no wait for the bound.
    done = _eval_joining("127.0.0.1:1", tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("orchestrator eval: --ray-address 127.0.0.1:1: nothing answers at ")
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_an_address_that_is_not_ray_is_one_line_within_the_connect_timeout(tmp_path: Path) -> None:
    # A server that accepts and says nothing (not Ray's GCS): Ray would wait on it for
    # minutes; the command gives up at --ray-connect-timeout. On 127.0.0.2, an address Ray
    # dials as given (127.0.0.1 it would replace by this machine's address).
    with socket.socket() as server:
        try:
            server.bind(("127.0.0.2", 0))
        except OSError:
            pytest.skip("127.0.0.2 is not a loopback address here")
        server.listen(8)
        address = f"127.0.0.2:{server.getsockname()[1]}"
        done = _eval_joining(address, tmp_path, "--ray-connect-timeout", "2")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"orchestrator eval: --ray-address {address}: no Ray cluster answered within 2 s "
        "(--ray-connect-timeout)"
    ]  # Ray's own retry lines held back
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--ray-connect-timeout", "5"], "--ray-connect-timeout: only with --executor ray"),
        (["--executor", "ray", "--ray-connect-timeout", "0"], "'0' is no time at all"),
        (["--executor", "ray", "--ray-connect-timeout", "nan"], "'nan' is not a finite number"),
        (["--executor", "ray", "--ray-connect-timeout", "-3"], "'-3' is negative"),
    ],
)
def test_the_connect_timeout_is_a_number_of_seconds_for_ray(
    flags: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = tmp_path / "q.jsonl"
    dataset.write_text('{"question": "Q?", "answer": "391"}\n')
    argv = ["eval", "examples/simulated.toml", "--dataset", str(dataset), "--runs-dir", str(tmp_path), *flags]
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage error
        code = exit_.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2 and said in err and err.count("\n") == 1, err
    with pytest.raises(ConfigError, match="--ray-connect-timeout: must be a number of seconds"):
        RayExecutor(connect_timeout_s=float("inf"))


WRITING_HOOK = '''
from pydantic import BaseModel


class Writing:
    """Appends each event's type to a file: a hook on a worker has no way back but the disk."""

    class Params(BaseModel):
        path: str

    def __init__(self, params):
        self.path = params.path

    def on_event(self, event):
        with open(self.path, "a") as file:
            file.write(f"{event.run_id} {event.type}\\n")
'''


@pytest.mark.anyio
async def test_config_hooks_are_built_on_the_workers(cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "ray_writing_hook.py").write_text(WRITING_HOOK)
    seen = tmp_path / "seen.txt"
    raw = config().model_dump(mode="json")
    raw["hooks"] = [{"kind": "ray_writing_hook:Writing", "path": str(seen)}]
    loop = lanefold.parse_config(raw, folder=tmp_path)
    async with lanefold.Session(loop, runs_dir=tmp_path / "r", executor=RayExecutor(workers=2)) as session:
        results = [r async for r in session.run_many([f"Q{i}?" for i in range(4)], concurrency=2)]
    assert len(results) == 4
    lines = seen.read_text().splitlines()
    ended = sorted(line.split()[0] for line in lines if line.endswith(" run.completed"))
    assert ended == sorted(r.run_id for r in results)


@pytest.mark.anyio
async def test_hooks_given_in_python_run_on_the_workers(cluster: Any, tmp_path: Path) -> None:
    """A Session's own hooks travel to its workers by pickle, as its verifier does."""
    (tmp_path / "ray_writing_hook.py").write_text(WRITING_HOOK)
    sys.path.insert(0, str(tmp_path))
    try:
        import ray_writing_hook  # the module the worker imports by name, from the driver's paths

        seen = tmp_path / "seen.txt"
        hook = ray_writing_hook.Writing(ray_writing_hook.Writing.Params(path=str(seen)))
        loop = lanefold.parse_config(config().model_dump(mode="json"), folder=tmp_path)
        async with lanefold.Session(
            loop, runs_dir=tmp_path / "r", executor=RayExecutor(workers=2), hooks=[hook]
        ) as session:
            results = [r async for r in session.run_many([f"Q{i}?" for i in range(4)], concurrency=2)]
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ray_writing_hook", None)
    assert len(results) == 4
    ended = sorted(
        line.split()[0] for line in seen.read_text().splitlines() if line.endswith(" run.completed")
    )
    assert ended == sorted(r.run_id for r in results)
