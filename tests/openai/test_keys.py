"""The API key never leaks: refused at build time when malformed, redacted wherever echoed.

A key a `.env` file left a `\\r` on, or one with a space, a control or a non-ASCII character,
is a ConfigError naming the variable. A valid key that the server echoes (in an error body
across the 500-character cut, upper-cased, escaped, as a prefix, or inside a completion) is
scanned for through every output: the event log, results and errors, stdout and stderr of the
command, the library's logging, and what `orchestrator serve` answers its clients.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from openai_stub import Recorded, Stub, choices_body, make_backend
from starlette.responses import JSONResponse, PlainTextResponse, Response

import lanefold
from lanefold.backends.openai import OpenAIBackend, OpenAIConfig
from lanefold.backends.openai._errors import Redactor
from lanefold.primitives import ConfigError, LanefoldError
from lanefold.serve._app import create_app

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
VAR = "LF_TEST_API_KEY"
KEY = "Sk-Live_9Qx\"7\\Ab/Cd+Ef=Gh%Ij'Kl-Mn4Op"  # quotes, a backslash, %, / and + to escape
BASE = "Sk-Live-9Qx7AbCdEfGhIjKl"
BAD = {
    "crlf": BASE + "\r",
    "crlf-whole": BASE + "\r\n",
    "leading space": " " + BASE,
    "newline": BASE + "\n",
    "tab": "\t" + BASE,
    "non-ascii": BASE[:9] + "é" + BASE[9:],
    "control": BASE[:9] + "\x01" + BASE[9:],
    "delete": BASE + "\x7f",
}


def runs_of(key: str) -> set[str]:
    """Every 8-character run of `key` as it could be written: as is, JSON- (once or twice),
    repr- or percent-escaped; lower case, for a case-blind scan."""
    forms = {
        key,
        json.dumps(key)[1:-1],
        json.dumps(json.dumps(key))[1:-1],
        repr(key)[1:-1],
        urllib.parse.quote(key, safe=""),
        key.strip(),
    }
    return {form[i : i + 8].lower() for form in forms for i in range(len(form) - 7)}


def assert_no_leak(texts: list[str], key: str = KEY) -> None:
    runs = runs_of(key)
    found = [(run, text[:120]) for text in texts for run in runs if run in text.lower()]
    assert found == [], f"the key leaked: {found[:5]}"


def strings(value: Any) -> Iterator[str]:
    """Every string inside decoded JSON (keys too): what a reader of the log sees unescaped."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def log_texts(folder: Path) -> list[str]:
    texts = []
    for path in folder.rglob("*.jsonl"):
        raw = path.read_text()
        texts.append(raw)
        for line in raw.splitlines():
            texts += list(strings(json.loads(line)))
    return texts


# -- the echoing server ----------------------------------------------------------------------------


def _completion(rec: Recorded, key: str) -> Response:
    text = f"Your key is {key}, or {key.upper()}, {key[:12]} for short. Answer: 391"
    return JSONResponse(choices_body(rec, [text] * rec.n))


ECHOES: dict[str, Callable[[Recorded, str], Response]] = {
    # 490 characters, then the key: the 500-character cut falls inside it.
    "cut": lambda rec, key: JSONResponse({"error": {"message": "x" * 490 + key + " refused"}}, 401),
    "upper": lambda rec, key: JSONResponse({"error": {"message": f"no key {key.upper()}"}}, 400),
    "json": lambda rec, key: JSONResponse({"error": {"message": f"got {json.dumps(key)}"}}, 500),
    "repr": lambda rec, key: PlainTextResponse(f"KeyError({key!r})", 500),
    "percent": lambda rec, key: JSONResponse({"detail": f"/auth?k={urllib.parse.quote(key)}"}, 503),
    "prefix": lambda rec, key: JSONResponse({"error": {"message": f"key {key[:12]}... revoked"}}, 400),
    "completion": _completion,
}
NOT_FATAL = [name for name in ECHOES if name != "cut"]


def echo(*names: str) -> Callable[[Recorded], Response]:
    """Answer each request with the next of `names`' echoes of the key it was sent."""
    turn = count()

    def reply(rec: Recorded) -> Response:
        key = rec.headers.get("authorization", "").removeprefix("Bearer ")
        return ECHOES[names[next(turn) % len(names)]](rec, key)

    return reply


def raw_config(url: str, k: int = 3, **backend: Any) -> dict[str, Any]:
    return {
        "loop": {"k": k, "max_concurrency": k, "seed": 7, "min_quorum": 1},
        "prompt": {"template": "Question: {question}\nAnswer with a number.\n"},
        "sampling": {"temperature": 0.8, "max_tokens": 32},
        "extract": {"method": "last_number"},
        "backend": {"kind": "openai", "base_url": url, "model": "m", "api_key_env": VAR, **backend},
        "retry": {"max_attempts": 2, "initial_backoff_s": 0.01, "max_backoff_s": 0.02},
    }


# -- the redactor ----------------------------------------------------------------------------------


@given(
    st.text(),
    st.text(),
    st.integers(0, len(KEY) - 8),
    st.integers(8, len(KEY)),
    st.sampled_from([str, str.upper, str.lower, str.swapcase]),
    st.sampled_from(
        [
            lambda k: k,
            lambda k: json.dumps(k)[1:-1],
            lambda k: repr(k)[1:-1],
            lambda k: urllib.parse.quote(k, safe=""),
        ]
    ),
)
def test_any_8_characters_of_the_key_in_any_case_or_escape_are_cut_out(
    before: str,
    after: str,
    start: int,
    length: int,
    case: Callable[[str], str],
    escape: Callable[[str], str],
) -> None:
    piece = escape(case(KEY[start : start + length]))
    out = Redactor(KEY)(before + piece + after)
    assert_no_leak([out])
    assert "[redacted]" in out


@given(st.text())
def test_text_without_8_characters_of_the_key_is_left_alone(text: str) -> None:
    if not any(run in text.lower() for run in runs_of(KEY)):
        assert Redactor(KEY)(text) == text
    assert Redactor(None)(text) == text


def test_a_key_shorter_than_8_characters_is_cut_out_whole() -> None:
    assert Redactor("abc12")("x abc12 ABC12 abc1 y") == "x [redacted] [redacted] abc1 y"


# -- a malformed key is refused when the backend is built ------------------------------------------


@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
async def test_a_malformed_key_is_a_config_error_naming_only_the_variable(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=VAR)
    with pytest.raises(ConfigError, match=VAR) as direct:
        OpenAIBackend(config, environ={VAR: value})
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(VAR, value)
    with pytest.raises(ConfigError, match=VAR) as through_run:
        await lanefold.run(lanefold.parse_config(raw_config("http://127.0.0.1:9/v1")), "Q", runs_dir=tmp_path)
    texts = [str(direct.value), str(through_run.value), *log_texts(tmp_path)]
    texts += ["".join(traceback.format_exception(e)) for e in (direct.value, through_run.value)]
    assert_no_leak(texts + [r.getMessage() for r in caplog.records], value)


def test_a_valid_key_is_sent_and_hidden_from_reprs() -> None:
    config = OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env=VAR)
    b = OpenAIBackend(config, environ={VAR: KEY})
    client = b._client
    assert client.headers["authorization"] == f"Bearer {KEY}"
    assert_no_leak([repr(b), repr(vars(b)), repr(client), repr(client.headers), repr(b._redact)])


# -- (a) through lanefold.run ------------------------------------------------------------------


@pytest.mark.parametrize("name", ECHOES)
async def test_an_echoed_key_leaks_into_no_output_of_a_run(
    stub: tuple[Stub, str],
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, url = stub
    server.reply = echo(name)
    monkeypatch.setenv(VAR, KEY)
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="lanefold")
    texts: list[str] = []
    try:
        result = await lanefold.run(lanefold.parse_config(raw_config(url)), "Q?", runs_dir=tmp_path)
        texts.append(result.model_dump_json())
    except LanefoldError as exc:
        texts += [str(exc), repr(exc), "".join(traceback.format_exception(exc))]
    logged = log_texts(tmp_path)
    out, err = capsys.readouterr()
    texts += [*logged, out, err]
    texts += [record.getMessage() for record in caplog.records]
    texts += [repr(record.__dict__) for record in caplog.records]
    assert server.requests and all(KEY in r.headers["authorization"] for r in server.requests)
    assert_no_leak(texts)
    assert "[redacted]" in "".join(logged)  # the echo reached the log, cut out


# -- (b) through the command, in a subprocess ------------------------------------------------------


def cli(*args: str, value: str = KEY) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, VAR: value, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "lanefold", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize("names", [NOT_FATAL, ["cut"]], ids=["every echo", "fatal cut"])
def test_an_echoed_key_leaks_into_no_output_of_the_command(
    stub: tuple[Stub, str], names: list[str], tmp_path: Path
) -> None:
    server, url = stub
    server.reply = echo(*names)
    config = tmp_path / "loop.json"
    config.write_text(json.dumps(raw_config(url, k=len(names), n="never")))  # an echo a lane
    runs = str(tmp_path / "runs")
    done = [cli("run", str(config), "--question", "Q?", "--runs-dir", runs, "--run-id", "r1", "-v")]
    done += [cli("tail", "r1", "--runs-dir", runs, *flag) for flag in ((), ("--json",))]
    done += [cli("show", "r1", "--runs-dir", runs, *flag) for flag in ((), ("--json",))]
    logged = log_texts(tmp_path / "runs")
    assert len(server.requests) >= len(names)
    assert all(p.returncode in (0, 1, 4) for p in done), [(p.returncode, p.stderr) for p in done]
    assert all("Traceback" not in p.stderr for p in done)
    assert_no_leak([text for p in done for text in (p.stdout, p.stderr)] + logged)
    assert "[redacted]" in "".join(logged)


@pytest.mark.slow
@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
def test_the_command_refuses_a_malformed_key_in_one_line(value: str, tmp_path: Path) -> None:
    config = tmp_path / "loop.json"
    config.write_text(json.dumps(raw_config("http://127.0.0.1:9/v1")))
    done = cli(
        "run", str(config), "--question", "Q?", "--runs-dir", str(tmp_path / "runs"), "-v", value=value
    )
    assert done.returncode == 2, done.stderr
    assert VAR in done.stderr and "Traceback" not in done.stderr
    assert_no_leak([done.stdout, done.stderr, *log_texts(tmp_path)], value)


@pytest.mark.slow
def test_serve_refuses_a_malformed_key_before_it_listens(tmp_path: Path) -> None:
    config = tmp_path / "backend.json"
    config.write_text(json.dumps({"backend": raw_config("http://127.0.0.1:9/v1")["backend"]}))
    done = cli("serve", "--backend-config", str(config), "--port", "9", value=BAD["crlf"])
    assert done.returncode == 2, done.stderr
    assert VAR in done.stderr and "Traceback" not in done.stderr
    assert_no_leak([done.stdout, done.stderr], BAD["crlf"])


# -- (c) through orchestrator serve's answers -------------------------------------------------------


async def served(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://served") as client:
        return await client.post(path, json=body)


@pytest.mark.parametrize("name", ECHOES)
async def test_an_echoed_key_leaks_into_no_answer_of_serve(
    stub: tuple[Stub, str], name: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, url = stub
    server.reply = echo(name)
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    async with make_backend(url, api_key_env=VAR, environ={VAR: KEY}) as upstream:
        app = create_app(upstream, model_name="m")
        for stream in (False, True):
            for path, body in (
                ("/v1/completions", {"prompt": "Q?"}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Q?"}]}),
            ):
                r = await served(app, path, {**body, "n": 2, "stream": stream})
                texts += [r.text, repr(r.headers)]
                assert (r.status_code == 200) == (name == "completion"), r.text
    assert len(server.requests) >= 4
    assert_no_leak(texts + [record.getMessage() for record in caplog.records])
    assert "[redacted]" in "".join(texts)
