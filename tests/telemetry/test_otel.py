"""The `otel` hook: each run as a trace, received by an OTLP/HTTP endpoint on loopback.

The receiver is a plain HTTP server that decodes what arrives at `/v1/traces` with the
OpenTelemetry protocol's own protobuf definitions (`opentelemetry-proto`), so what is checked is
what the SDK's exporter actually sent: spans, their parents and their attributes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import lanefold
from lanefold.cli import main
from lanefold.primitives import ConfigError
from lanefold.telemetry import OtelHook, flush_all, trace_id_of


class Receiver:
    """Spans received, each as a dict: name, trace and span ids, parent, attributes, status."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.posts = 0
        self.headers: list[dict[str, str]] = []  # each post's, names lower-cased
        self.lock = threading.Lock()

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self.lock:
            self.posts += 1
            for resource in request.resource_spans:
                service = {a.key: _value(a.value) for a in resource.resource.attributes}
                for scope in resource.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "trace_id": int.from_bytes(span.trace_id, "big"),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex() or None,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "status": span.status.code,
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "service": service.get("service.name"),
                            }
                        )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["trace_id"] == trace_id_of(run_id)]


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, str]]:
    got = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/traces":
                got.headers.append({k.lower(): v for k, v in self.headers.items()})
                got.take(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield got, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _config(k: int = 3, **extra: Any) -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {"loop": {"k": k}, "backend": {"kind": "simulated", "latency_ms": [0, 0]}, **extra}
    )


def _children(spans: list[dict[str, Any]], parent: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in spans if s["parent"] == parent["span_id"]]


@pytest.mark.anyio
async def test_a_run_is_a_trace_of_waves_and_lane_attempts(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    got, url = receiver
    hook = OtelHook(OtelHook.Params(endpoint=url, service_name="tests"))
    result = await lanefold.run(_config(k=3), "What is 2 + 2?", runs_dir=tmp_path, hooks=[hook])
    assert flush_all(10.0)
    spans = got.of_run(result.run_id)
    (run,) = [s for s in spans if s["parent"] is None]
    assert run["name"] == "lanefold.run parallel_sample" and run["service"] == "tests"
    assert run["attributes"]["lanefold.run_id"] == result.run_id
    assert "lanefold.answer" not in run["attributes"]  # content only with capture_content
    assert run["attributes"]["lanefold.status"] == result.status == "answered"
    (wave,) = _children(spans, run)
    assert wave["name"] == "lanefold.wave sample" and wave["attributes"]["lanefold.wave"] == 1
    lanes = _children(spans, wave)
    assert sorted(s["attributes"]["lanefold.lane"] for s in lanes) == [0, 1, 2]
    for lane in lanes:
        attrs = lane["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"]
        assert lane["name"] == f"chat {attrs['gen_ai.request.model']}"
        assert attrs["gen_ai.response.finish_reasons"] == ["stop"]
        assert run["start"] <= wave["start"] <= lane["start"] <= lane["end"] <= wave["end"] <= run["end"]
    # the bill, as the result counts it: prefill + cached prefill in, decode out
    usage = result.usage
    assert sum(s["attributes"]["gen_ai.usage.output_tokens"] for s in lanes) == usage.decode_tokens
    assert (
        sum(s["attributes"]["lanefold.usage.cached_prefill_tokens"] for s in lanes)
        == usage.cached_prefill_tokens
    )
    assert (
        run["attributes"]["gen_ai.usage.input_tokens"] == usage.prefill_tokens + usage.cached_prefill_tokens
    )


@pytest.mark.anyio
async def test_judge_calls_and_failed_lanes_are_spans(receiver: tuple[Receiver, str], tmp_path: Path) -> None:
    got, url = receiver
    config = _config(
        k=4,
        backend={"kind": "simulated", "latency_ms": [0, 0], "failure_rate": 0.5},
        retry={"max_attempts": 1},
        loop={"k": 4, "min_quorum": 1, "reducer": "judge_argmax"},
        judge={"template": "Score it: {candidate}"},
    )
    hook = OtelHook(OtelHook.Params(endpoint=url))
    result = await lanefold.run(config, "What is 3 + 4?", runs_dir=tmp_path, hooks=[hook])
    assert flush_all(10.0)
    spans = got.of_run(result.run_id)
    judged = [s for s in spans if s["name"] == "lanefold.judge"]
    assert judged and all("lanefold.candidate_lane" in s["attributes"] for s in judged)
    failed = [s for s in spans if s["attributes"].get("error.type")]
    sampled = [s for s in failed if s["attributes"]["lanefold.wave.purpose"] == "sample"]
    assert len(sampled) == result.lanes_failed > 0
    assert all(s["status"] == 2 for s in failed)  # STATUS_CODE_ERROR


@pytest.mark.anyio
async def test_a_resumed_run_continues_its_trace(receiver: tuple[Receiver, str], tmp_path: Path) -> None:
    got, url = receiver
    config = _config(
        k=6, backend={"kind": "simulated", "latency_ms": [40, 60]}, loop={"k": 6, "max_concurrency": 2}
    )
    hook = OtelHook(OtelHook.Params(endpoint=url))
    async with lanefold.Session(config, runs_dir=tmp_path, hooks=[hook]) as session:
        with anyio.move_on_after(0.1):
            await session.run("What is 5 + 5?", run_id="cut")
        result = await session.resume("cut")
    assert flush_all(10.0)
    spans = got.of_run("cut")
    runs = [s for s in spans if s["parent"] is None]
    assert len(runs) == 2  # the first process's segment and the resumed one, one trace
    assert {s["attributes"]["lanefold.resumed"] for s in runs} == {False, True}
    assert {s["attributes"]["lanefold.status"] for s in runs} == {"interrupted", "answered"}
    assert result.answer is not None


def test_the_command_line_exports_with_otel_endpoint(
    receiver: tuple[Receiver, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got, url = receiver
    config = tmp_path / "loop.toml"
    config.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n')
    assert (
        main(
            [
                "run",
                str(config),
                "--question",
                "What is 1 + 1?",
                "--runs-dir",
                str(tmp_path),
                "--json",
                "--otel-endpoint",
                url,
            ]
        )
        == 0
    )
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert flush_all(10.0)
    assert len(got.of_run(run_id)) == 1 + 1 + 2  # run, wave, two lanes


def test_a_hooks_table_names_it_and_its_keys_are_checked(
    receiver: tuple[Receiver, str], tmp_path: Path
) -> None:
    got, url = receiver
    config = lanefold.parse_config(
        {"loop": {"k": 2}, "backend": {"kind": "simulated"}, "hooks": [{"kind": "otel", "endpoint": url}]}
    )
    result = lanefold.run_sync(config, "What is 6 + 1?", runs_dir=tmp_path)
    assert flush_all(10.0)
    assert len(got.of_run(result.run_id)) == 4
    with pytest.raises(ConfigError, match=r"hooks\[1\]\.endpoin: unknown key|hooks\[1\].*endpoin"):
        lanefold.parse_config({"hooks": [{"kind": "otel", "endpoin": url}]}).build_hooks()


def test_a_bad_endpoint_flag_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "loop.toml"
    config.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n')
    code = main(
        ["run", str(config), "--question", "Q?", "--runs-dir", str(tmp_path), "--otel-endpoint", "not a url"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("orchestrator run: --otel-endpoint: ") and err.count("\n") == 1
    assert not any(tmp_path.glob("*/events.jsonl"))  # refused before a run was created


@pytest.mark.anyio
async def test_an_endpoint_that_is_down_changes_nothing(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hook = OtelHook(OtelHook.Params(endpoint=f"http://127.0.0.1:{port}", timeout_s=0.5))
    seeded = _config(k=4, loop={"k": 4, "seed": 7})
    with_hook = await lanefold.run(seeded, "What is 8 + 1?", runs_dir=tmp_path / "a", hooks=[hook])
    without = await lanefold.run(seeded, "What is 8 + 1?", runs_dir=tmp_path / "b")
    assert (with_hook.answer, with_hook.votes) == (without.answer, without.votes)
    assert flush_all(2.0) is False or True  # it may or may not have given up yet: the run did not wait


def test_the_gateway_exports_each_request_as_a_trace(receiver: tuple[Receiver, str], tmp_path: Path) -> None:
    """`serve --loops --otel-endpoint --otel-content`: a request's run arrives as a trace, as
    `run`'s does, in the trace of the client's `traceparent` and with its prompt and answer."""
    pytest.importorskip("starlette")
    import socket
    import subprocess
    import sys
    import time

    import httpx

    got, url = receiver
    (tmp_path / "loops").mkdir()
    (tmp_path / "loops" / "vote.toml").write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["serve", "--loops", "loops", "--runs-dir", "runs", "--port", str(port), "--otel-endpoint", url]
    args.append("--otel-content")
    trace, client_span = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    process = subprocess.Popen(
        [sys.executable, "-m", "lanefold", *args],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.HTTPError:
                assert process.poll() is None and time.monotonic() < deadline, "the gateway did not start"
                time.sleep(0.05)
        body = {"model": "vote", "messages": [{"role": "user", "content": "What is 1 + 1?"}]}
        traceparent = {"traceparent": f"00-{trace:032x}-{client_span:016x}-01", "X-Request-ID": "trace-me-1"}
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers=traceparent,
            timeout=30,
        )
        run_id = response.headers["x-lanefold-run-id"]
        while len(_in_trace(got, trace)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        process.terminate()
        process.wait(20)
    spans = _in_trace(got, trace)
    assert len(spans) == 1 + 1 + 2  # run, wave, two lanes
    assert {s["attributes"]["lanefold.run_id"] for s in spans} == {run_id}
    (run,) = [s for s in spans if s["parent"] == f"{client_span:016x}"]
    # who asked and for what (issue 41 item 6): the model the client named, its request's id
    assert run["attributes"]["lanefold.requested_model"] == "vote"
    assert run["attributes"]["lanefold.request_id"] == "trace-me-1"
    assert response.headers["x-request-id"] == "trace-me-1"
    assert json.loads(run["attributes"]["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "What is 1 + 1?"}]}
    ]
    (answer,) = json.loads(run["attributes"]["gen_ai.output.messages"])
    assert answer["parts"][0]["content"] == response.json()["choices"][0]["message"]["content"]


def _in_trace(got: Receiver, trace_id: int) -> list[dict[str, Any]]:
    with got.lock:
        return [s for s in got.spans if s["trace_id"] == trace_id]


def test_resume_on_the_command_line_continues_the_trace_the_run_recorded(
    receiver: tuple[Receiver, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A gateway run cut off, resumed by `orchestrator resume --otel-endpoint`: the segment is
    one more child of the client's span, in the client's trace (docs/otel.md)."""
    got, url = receiver
    trace, client_span = 0x5B8AA5A2D2C872E8321CF37308D69DF2, 0x051581BF3CB55C13
    context = {"traceparent": f"00-{trace:032x}-{client_span:016x}-01"}
    config = _config(
        k=6, backend={"kind": "simulated", "latency_ms": [40, 60]}, loop={"k": 6, "max_concurrency": 2}
    )

    async def cut() -> None:
        async with lanefold.Session(config, runs_dir=tmp_path) as session:
            with anyio.move_on_after(0.1):
                await session.run("What is 5 + 5?", run_id="cut", trace_context=context)

    anyio.run(cut)
    assert main(["resume", "cut", "--runs-dir", str(tmp_path), "--json", "--otel-endpoint", url]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] is not None
    assert flush_all(10.0)
    spans = _in_trace(got, trace)
    assert spans and {s["attributes"]["lanefold.run_id"] for s in spans} == {"cut"}
    (run,) = [s for s in spans if s["parent"] == f"{client_span:016x}"]
    assert run["attributes"]["lanefold.resumed"] is True
    assert not got.of_run("cut")  # nothing in a trace of the run's own


def test_otel_content_without_an_endpoint_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "loop.toml"
    config.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n')
    code = main(["run", str(config), "--question", "Q?", "--runs-dir", str(tmp_path), "--otel-content"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("orchestrator run: --otel-content: ") and err.count("\n") == 1
    assert not any(tmp_path.glob("*/events.jsonl"))  # refused before a run was created


@pytest.mark.parametrize("name", ["x-api-key", "Authorization", "X-Auth-Token", "api-key", "Cookie"])
def test_a_secret_header_in_a_hooks_table_is_refused_naming_it(name: str) -> None:
    # docs/otel.md showed `headers = { "x-api-key" = "..." }`: the key went into run.started,
    # `show --json` and the view.
    secret = "otel-secret-0123456789"
    with pytest.raises(ConfigError) as refused:
        lanefold.parse_config(
            {"hooks": [{"kind": "otel", "endpoint": "http://127.0.0.1:4318", "headers": {name: secret}}]},
            source="loop.toml",
        )
    message = str(refused.value)
    assert message.startswith(f"loop.toml: hooks[1].headers: header {name!r} carries a secret")
    assert "headers_env" in message and secret not in message and "\n" not in message
    with pytest.raises(ValidationError, match="headers_env"):  # from Python too
        OtelHook.Params(endpoint="http://127.0.0.1:4318", headers={name: secret})


def test_headers_env_sends_the_header_and_nothing_records_its_value(
    receiver: tuple[Receiver, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from starlette.testclient import TestClient

    from lanefold.execution import open_store
    from lanefold.view._app import create_app

    got, url = receiver
    secret = "otel-secret-0123456789"
    monkeypatch.setenv("LANEFOLD_TEST_OTEL_KEY", secret)
    config = tmp_path / "loop.toml"
    config.write_text(
        '[loop]\nk = 2\n[backend]\nkind = "simulated"\n[[hooks]]\nkind = "otel"\n'
        f'endpoint = "{url}"\nheaders = {{ "x-team" = "lanes" }}\n'
        'headers_env = { "x-api-key" = "LANEFOLD_TEST_OTEL_KEY" }\n'
    )
    runs = tmp_path / "runs"
    argv = ["run", str(config), "--question", "What is 1 + 1?", "--runs-dir", str(runs), "--json"]
    assert main(argv) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    assert flush_all(10.0)
    assert got.headers and all(h["x-api-key"] == secret and h["x-team"] == "lanes" for h in got.headers)
    log = (runs / run_id / "events.jsonl").read_text()
    assert "LANEFOLD_TEST_OTEL_KEY" in log and secret not in log  # the variable's name, never its value
    for command in ("show", "tail"):
        assert main([command, run_id, "--runs-dir", str(runs), "--json"]) == 0
        assert secret not in capsys.readouterr().out
    page = TestClient(create_app(open_store(None, runs))).get(f"/runs/{run_id}")
    assert page.status_code == 200 and secret not in page.text
    monkeypatch.delenv("LANEFOLD_TEST_OTEL_KEY")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "headers_env.x-api-key: environment variable LANEFOLD_TEST_OTEL_KEY is not set" in err


def test_a_log_written_with_a_secret_header_before_the_rule_stays_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Logs are never deprecated: one whose recorded [[hooks]] holds a header named as a secret
    # (as a release before this rule could write) is still shown; a config given today is not.
    from lanefold.primitives import hash_config

    config = tmp_path / "loop.toml"
    config.write_text(
        '[loop]\nk = 2\n[backend]\nkind = "simulated"\n[[hooks]]\nkind = "otel"\n'
        'endpoint = "http://127.0.0.1:9"\nheaders = { "x-team" = "lanes" }\ntimeout_s = 0.1\n'
    )
    runs = tmp_path / "runs"
    argv = ["run", str(config), "--question", "What is 1 + 1?", "--runs-dir", str(runs), "--json"]
    assert main(argv) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    log = runs / run_id / "events.jsonl"
    lines = log.read_text().splitlines()
    started = json.loads(lines[0])
    started["data"]["config"]["hooks"][0]["headers"] = {"X-Auth-Token": "written-before"}
    started["data"]["config_hash"] = hash_config(started["data"]["config"])
    log.write_text("\n".join([json.dumps(started), *lines[1:]]) + "\n")
    assert main(["show", run_id, "--runs-dir", str(runs)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    with pytest.raises(ConfigError, match="carries a secret"):
        lanefold.parse_config(started["data"]["config"])


def test_serve_otel_content_is_for_the_loop_gateway(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend served alone makes no runs, so no spans to put content on: one line, exit 2."""
    pytest.importorskip("starlette")
    backend = tmp_path / "backend.toml"
    backend.write_text('[backend]\nkind = "simulated"\n')
    assert main(["serve", "--backend-config", str(backend), "--otel-content"]) == 2
    err = capsys.readouterr().err
    assert err == "orchestrator serve: --otel-content: traces are of runs; give --loops DIR too\n"
    assert main(["serve", "--loops", str(tmp_path), "--otel-content"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orchestrator serve: --otel-content: ") and err.count("\n") == 1
