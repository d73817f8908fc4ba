"""`orchestrator serve` on the command line: its flags, one line and a distinct exit code for
each way it cannot start, and Ctrl-C with requests in flight (a real process on loopback)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import lanefold.cli._serve as serve_cli
from lanefold.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "backend.toml"
    path.write_text('[backend]\nkind = "simulated"\nlatency_ms = [60000, 60000]\n')
    return path


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_a_port_out_of_range_is_a_usage_error(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--backend-config", str(config), "--port", "99999"])
    assert exit_.value.code == 2
    assert "99999 is not a port" in capsys.readouterr().err


def test_a_port_in_use_is_one_line_and_exit_1(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--backend-config", str(config), "--port", str(port)])
    assert code == 1
    assert one_line(capsys.readouterr().err) == (
        f"orchestrator serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_without_the_serve_extra_the_install_line(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` now fails as if absent
    code = main(["serve", "--backend-config", str(config)])
    assert code == 2
    assert "pip install 'lanefold[serve]'" in one_line(capsys.readouterr().err)


def test_an_unset_key_variable_is_a_config_error(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LANEFOLD_TEST_SERVE_KEY", raising=False)
    code = main(["serve", "--backend-config", str(config), "--api-key-env", "LANEFOLD_TEST_SERVE_KEY"])
    assert code == 2
    assert "LANEFOLD_TEST_SERVE_KEY" in one_line(capsys.readouterr().err)


BASE_KEY = "Sk-Live-9Qx7AbCdEfGhIjKl"
BAD_KEYS = {  # what the openai backend refuses of its api_key_env; serve used to take each
    "empty": "",
    "crlf": BASE_KEY + "\r\n",
    "cr": BASE_KEY + "\r",
    "lf": BASE_KEY + "\n",
    "leading space": " " + BASE_KEY,
    "trailing space": BASE_KEY + " ",
    "tab": "\t" + BASE_KEY,
    "non-ascii": BASE_KEY[:9] + "é" + BASE_KEY[9:],
    "control": BASE_KEY[:9] + "\x01" + BASE_KEY[9:],
    "delete": BASE_KEY + "\x7f",
}


@pytest.mark.parametrize("value", BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_a_key_the_openai_backend_refuses_is_refused_by_serve_too(
    value: str, config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Such a server used to start, then answer 401 to every client sending the key.
    from lanefold.backends.openai import OpenAIBackend, OpenAIConfig
    from lanefold.primitives import ConfigError

    monkeypatch.setattr(serve_cli, "serve", lambda backend, **kw: pytest.fail("it started"))
    monkeypatch.setenv("LANEFOLD_TEST_SERVE_KEY", value)
    code = main(["serve", "--backend-config", str(config), "--api-key-env", "LANEFOLD_TEST_SERVE_KEY"])
    line = one_line(capsys.readouterr().err)
    assert code == 2
    with pytest.raises(ConfigError) as backend:  # the same check, the same words
        OpenAIBackend(
            OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="LANEFOLD_TEST_SERVE_KEY")
        )
    assert line == f"orchestrator serve: --api-key-env: {backend.value}"
    assert "LANEFOLD_TEST_SERVE_KEY" in line
    assert value.strip() not in line or not value.strip()  # the key itself is never shown


def test_flags_reach_the_server(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(serve_cli, "serve", lambda backend, **kw: calls.append(kw))
    assert main(["serve", "--backend-config", str(config)]) == 0
    assert capsys.readouterr().err == ""
    assert calls[-1]["api_key"] is None
    assert calls[-1]["max_body_bytes"] == 1 << 20
    assert calls[-1]["max_waiting"] is None
    monkeypatch.setenv("LANEFOLD_TEST_SERVE_KEY", "k-123")
    assert (
        main(
            [
                "serve",
                "--backend-config",
                str(config),
                "--host",
                "0.0.0.0",
                "--api-key-env",
                "LANEFOLD_TEST_SERVE_KEY",
                "--max-body-bytes",
                "2048",
                "--max-waiting",
                "3",
            ]
        )
        == 0
    )
    assert capsys.readouterr().err == ""
    assert (calls[-1]["api_key"], calls[-1]["max_body_bytes"], calls[-1]["max_waiting"]) == ("k-123", 2048, 3)
    assert main(["serve", "--backend-config", str(config), "--host", "::1"]) == 0
    assert capsys.readouterr().err == ""  # loopback: no key needed


LOOP = '[loop]\nk = 2\n[backend]\nkind = "simulated"\n'


@pytest.mark.parametrize(
    ("flags", "needs"),
    [
        (["--backend-config", "backend.toml"], "--api-key-env"),
        (["--loops", "loops"], "--keys or --api-key-env"),
        (["--loop", "vote=loops/vote.toml", "--backend-config", "backend.toml"], "--keys or --api-key-env"),
    ],
    ids=["backend", "loops", "loop and backend"],
)
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "example.com"])
def test_a_host_beyond_loopback_without_a_key_is_refused_as_the_view_refuses_it(
    config: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    needs: str,
    host: str,
) -> None:
    # `serve --loops DIR --host 0.0.0.0` used to warn and serve every loop to anyone.
    (config.parent / "loops").mkdir()
    (config.parent / "loops" / "vote.toml").write_text(LOOP)
    monkeypatch.chdir(config.parent)
    monkeypatch.setattr(serve_cli, "serve", lambda backend, **kw: pytest.fail("it started"))
    monkeypatch.setattr(serve_cli, "serve_loops", lambda loops, store, **kw: pytest.fail("it started"))
    code = main(["serve", *flags, "--host", host])
    assert code == 2
    assert one_line(capsys.readouterr().err) == (
        f"orchestrator serve: --host {host}: not loopback; serving beyond this machine needs {needs}"
    )


def test_loops_beyond_loopback_with_a_keys_file_start(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (config.parent / "loops").mkdir()
    (config.parent / "loops" / "vote.toml").write_text(LOOP)
    (config.parent / "keys.toml").write_text('[[keys]]\nname = "a"\nsha256 = "' + "0" * 64 + '"\n')
    monkeypatch.chdir(config.parent)
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(serve_cli, "serve_loops", lambda loops, store, **kw: calls.append(kw))
    assert main(["serve", "--loops", "loops", "--keys", "keys.toml", "--host", "0.0.0.0"]) == 0
    assert capsys.readouterr().err == ""
    assert calls[-1]["keys_file"] == "keys.toml" and calls[-1]["host"] == "0.0.0.0"


@pytest.mark.slow
def test_ctrl_c_with_requests_in_flight_stops_quietly_within_seconds(config: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "LANEFOLD_TEST_SERVE_KEY": "k-123"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator",
            "serve",
            "--backend-config",
            str(config),
            "--port",
            str(port),
            "--api-key-env",
            "LANEFOLD_TEST_SERVE_KEY",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/v1"
    auth = {"Authorization": "Bearer k-123"}
    answers: dict[str, Any] = {}

    def ask(name: str, stream: bool) -> None:
        body = {"prompt": "Q", "max_tokens": 4, "stream": stream}
        try:
            r = httpx.post(f"{url}/completions", json=body, headers=auth, timeout=60)
        except httpx.TransportError as exc:  # asserted on below, not lost in the thread
            answers[name] = (0, repr(exc))
        else:
            answers[name] = (r.status_code, r.text)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"{url}/models", timeout=1).status_code == 401
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.1)
        askers = [threading.Thread(target=ask, args=(name, name == "stream")) for name in ("whole", "stream")]
        for asker in askers:
            asker.start()
        time.sleep(1.0)  # both are in flight: the backend takes 60 s per request
        assert not answers
        proc.send_signal(signal.SIGINT)
        stopped = time.monotonic()
        out, err = proc.communicate(timeout=20)
        took = time.monotonic() - stopped
        for asker in askers:
            asker.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert took < 10, took  # not the 60 s the requests would have taken
    assert "Traceback" not in err + out
    assert "ERROR" not in err
    # Neither had its first token (the stream's status line waits for it): both are told why.
    for name in ("whole", "stream"):
        status, text = answers[name]
        assert status == 503, text
        assert json.loads(text)["error"]["code"] == "server_shutting_down"


def test_the_bound_port_takes_connections_before_the_server_runs() -> None:
    """`listen` listens at once: a client told the address (the line `serve` and `view` print
    before uvicorn starts) is queued, never refused, however slowly the server starts."""
    import socket

    from lanefold.serve import listen

    sock = listen("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            pass  # connected: waiting in the backlog, not refused
    finally:
        sock.close()
