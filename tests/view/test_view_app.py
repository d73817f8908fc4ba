"""`orchestrator view` over HTTP, without a browser: pages, refusals, the key, the live feed."""

from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from cli_support import ROOT, Outcome, cli
from starlette.testclient import TestClient

import lanefold
from lanefold import AnyEvent
from lanefold.execution import open_store
from lanefold.view._app import create_app


def _client(runs: Path, **options: object) -> TestClient:
    return TestClient(create_app(open_store(None, runs), **options))  # type: ignore[arg-type]


def test_the_runs_list_shows_the_run(finished: Outcome, runs: Path) -> None:
    page = _client(runs).get("/")
    assert page.status_code == 200
    assert "data-run='done'" in page.text and "data-status='answered'" in page.text
    assert ">391<" in page.text and ">0.50<" in page.text  # the agreement: 4 of 8
    assert "https://" not in page.text and "http://" not in page.text  # nothing from the internet


def test_a_run_page_shows_lanes_votes_and_the_bill_show_json_gives(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = cli(capsys, "show", "done", "--runs-dir", runs, "--json").json
    page = _client(runs).get("/runs/done").text
    states = re.findall(r"data-lane='(\d+)' data-wave='(\d+)' data-state='(\w+)'", page)
    assert len(states) == shown["lanes_completed"] and {s for *_, s in states} == {"landed"}
    votes = dict(re.findall(r"data-answer='([^']*)' data-votes='([^']*)'", page))
    assert {k: int(v) for k, v in votes.items()} == shown["votes"]
    bill = dict(
        re.findall(r"data-line='(\w+)'><th>\w+</th><td><span class=usd data-usd=\"([0-9.e-]+)\"", page)
    )
    assert {k: float(v) for k, v in bill.items()} == shown["cost"]  # exact, beside the money shown
    assert "id=timeline" in page and "id=config" in page


def test_an_unknown_run_is_a_404_page(finished: Outcome, runs: Path) -> None:
    page = _client(runs).get("/runs/nope")
    assert page.status_code == 404 and "no run 'nope'" in html.unescape(page.text)


def test_a_spliced_log_shows_the_cli_refusal_and_the_view_stays_up(
    finished: Outcome, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = runs / "done" / "events.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:3] + lines[4:]) + "\n")  # one event cut out
    refused = cli(capsys, "show", "done", "--runs-dir", runs)
    client = _client(runs)
    page = client.get("/runs/done")
    assert page.status_code == 422
    assert refused.error_line in html.unescape(page.text)
    assert client.get("/").status_code == 200


def test_the_key_is_asked_for_and_a_wrong_one_refused(finished: Outcome, runs: Path) -> None:
    client = _client(runs, api_key="sesame")
    assert client.get("/").status_code == 401 and "type=password" in client.get("/").text
    assert client.get("/", headers={"Authorization": "Bearer sesame"}).status_code == 200
    assert client.post("/login", data={"key": "wrong"}).status_code == 401
    assert client.post("/login", data={"key": "sesame"}).status_code == 200  # redirected to the list
    assert client.get("/runs/done").status_code == 200  # the cookie
    assert client.get("/static/view.js").status_code == 200


def test_a_non_loopback_host_without_a_key_is_refused(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused = cli(capsys, "view", "--runs-dir", runs, "--host", "0.0.0.0")
    assert refused.code == 2
    assert refused.error_line.startswith("orchestrator view: --host 0.0.0.0: not loopback")


def test_a_finished_run_s_live_feed_gives_its_parts_and_ends(finished: Outcome, runs: Path) -> None:
    with _client(runs).stream("GET", "/live/runs/done") as feed:
        body = "".join(feed.iter_text())
    kinds = re.findall(r"^event: (\w+)$", body, re.M)
    assert kinds[-1] == "end" and "parts" in kinds
    last = json.loads(re.findall(r"^data: (.*)$", body, re.M)[-2])
    assert last["waves"].count("data-state='landed'") == 8


def test_the_runs_list_pages(tmp_path: Path) -> None:
    store = open_store(None, tmp_path / "none")
    page = TestClient(create_app(store)).get("/?page=3")
    assert page.status_code == 200 and "rel=prev" in page.text and "rel=next" not in page.text


def test_an_interrupted_run_shows_its_lanes_and_the_resume_command(tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {
            "loop": {"k": 8, "max_concurrency": 4, "seed": 21, "min_quorum": 8},
            "backend": {"kind": "simulated", "latency_ms": [40, 120]},
        }
    )

    async def cut() -> None:
        with anyio.CancelScope() as scope:

            def observe(event: AnyEvent) -> None:
                if event.type == "lane.completed":
                    scope.cancel()

            await lanefold.run(config, "17*23?", runs_dir=tmp_path, run_id="cut", observer=observe)

    anyio.run(cut)
    store = open_store(None, tmp_path)
    page = TestClient(create_app(store, resume_flags=["--runs-dir", str(tmp_path)])).get("/runs/cut").text
    states = set(re.findall(r"data-state='(\w+)'", page))
    assert "interrupted" in states and "landed" in states
    assert f"<pre id=resume>orchestrator resume cut --runs-dir {tmp_path}</pre>" in page


def test_a_killed_run_shows_the_resume_command(tmp_path: Path) -> None:
    """A run a kill cut off has no `run.interrupted`; unfinished with no writer, it is stopped,
    and its page says how to continue it."""
    config = lanefold.parse_config({"loop": {"k": 4}, "backend": {"kind": "simulated"}})
    lanefold.run_sync(config, "17*23?", runs_dir=tmp_path, run_id="killed")
    events = tmp_path / "killed" / "events.jsonl"
    lines = events.read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if '"lane.completed"' in line)
    events.write_text("".join(lines[: first + 1]))  # as a kill leaves it: no writer, no ending
    store = open_store(None, tmp_path)
    page = TestClient(create_app(store, resume_flags=["--runs-dir", str(tmp_path)])).get("/runs/killed").text
    assert "<b id=status>stopped</b>" in page
    assert f"<pre id=resume>orchestrator resume killed --runs-dir {tmp_path}</pre>" in page


def test_a_postgresql_run_s_page_and_live_feed(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "examples" / "simulated.toml")
    ran = cli(capsys, "run", example, "--question", "What is 17 * 23?", "--store", pg_url, "--run-id", "pg")
    assert ran.code == 0, ran.err
    client = TestClient(create_app(open_store(pg_url)))
    landed = r"data-lane='\d+' data-wave='\d+' data-state='landed'"  # the lanes, not their waterfall bars
    assert len(re.findall(landed, client.get("/runs/pg").text)) == 8
    assert "data-run='pg'" in client.get("/").text
    with client.stream("GET", "/live/runs/pg") as feed:
        body = "".join(feed.iter_text())
    assert re.findall(r"^event: (\w+)$", body, re.M)[-1] == "end"


def test_a_time_without_a_zone_filters_as_utc(finished: Outcome, runs: Path) -> None:
    client = _client(runs)
    assert "data-run='done'" in client.get("/?since=2000-01-01").text
    assert "data-run='done'" not in client.get("/?since=2999-01-01").text
    assert client.get("/?since=yesterday").status_code == 400


def test_the_command_serves_until_ctrl_c_and_exits_0(finished: Outcome, runs: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "lanefold", "view", "--runs-dir", str(runs), "--port", "0"]
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True) as server:
        assert server.stderr is not None
        said = server.stderr.readline()  # the one line saying where, once the port is bound
        url = re.search(r"http://127\.0\.0\.1:\d+/", said)
        assert url is not None, said
        with httpx.Client() as client:
            assert "data-run='done'" in client.get(url.group(0)).text
        server.send_signal(signal.SIGINT)
        assert server.wait(20) == 0
        assert "Traceback" not in server.stderr.read()


def test_a_postgresql_run_s_lanes_arrive_on_the_feed_while_it_goes(pg_url: str, tmp_path: Path) -> None:
    config = (ROOT / "examples" / "simulated.toml").read_text()
    config = config.replace("max_concurrency = 8", "max_concurrency = 2")
    config = config.replace("latency_ms = [20, 120]", "latency_ms = [200, 300]")
    (tmp_path / "slow.toml").write_text(config)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "lanefold", "run", str(tmp_path / "slow.toml"), "--question", "17 * 23?"]
    store = open_store(pg_url)
    with subprocess.Popen(
        [*argv, "--store", pg_url, "--run-id", "going"], env=env, stdout=subprocess.DEVNULL
    ) as writer:
        deadline = time.monotonic() + 30
        while not store.exists("going"):
            assert time.monotonic() < deadline and writer.poll() is None, "the run did not start"
            time.sleep(0.05)
        with TestClient(create_app(store)).stream("GET", "/live/runs/going") as feed:
            body = "".join(feed.iter_text())
        assert writer.wait(30) == 0
    landed = [
        json.loads(data)["waves"].count("data-state='landed'")
        for kind, data in re.findall(r"^event: (\w+)\ndata: (.*)$", body, re.M)
        if kind == "parts"
    ]
    assert len(set(landed)) > 2 and landed[-1] == 8  # lanes arrived a few at a time, then all


def test_the_budgets_page_on_files_shows_spend_refusals_and_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A named budget on the files store, as `budget show` reads it: spent, the runs spending
    from it (their `run.started` pools), and the requests it refused."""
    runs = tmp_path / "runs"
    assert cli(capsys, "budget", "set", "fleet", "--max-tokens", "700", "--runs-dir", runs).code == 0
    config = (
        (ROOT / "examples" / "simulated.toml")
        .read_text()
        .replace("[budget]\n", '[budget]\nshared = "fleet"\n')
    )
    (tmp_path / "fleet.toml").write_text(config)
    ran = cli(
        capsys, "run", tmp_path / "fleet.toml", "--question", "What is 17 * 23?", "--runs-dir", runs, "--json"
    )
    assert ran.code == 0, ran.err
    refused = cli(
        capsys, "run", tmp_path / "fleet.toml", "--question", "What is 17 * 23?", "--runs-dir", runs
    )
    assert refused.code == 3, refused.err  # the rest cannot fund its quorum: no run, a refusal
    shown = cli(capsys, "budget", "show", "fleet", "--runs-dir", runs, "--json").json
    page = _client(runs).get("/budgets").text
    row = re.search(r"<tr data-budget='fleet'>(.*?)</tr>", page, re.S)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert int(cells[2]) == shown["spent_tokens"] > 0
    assert "<td class=refused>1</td>" in row.group(1) and shown["refusals"] == 1
    assert ran.json["run_id"] in row.group(1)
    assert [s.run_id for s in open_store(None, runs).list_runs()] == [ran.json["run_id"]]
