"""A loop over any allowed upstream model (issue 41 item 5): `[serve] models` in a loop file
opens it as `LOOP/MODEL`; the run goes over that model (the simulated backend's free-text name,
or the model an OpenAI-compatible upstream sees in its request body) and records it; a model
nobody listed is a 404 naming those a key may call; `/v1/models` lists each key's own."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import anyio
import anyio.from_thread
import anyio.lowlevel
import httpx
import openai
import pytest
from anyio.lowlevel import EventLoopToken
from cli_support import cli
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from lanefold.config import config_hash, parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import BACKENDS, ConfigError, register_backend
from lanefold.serve import loop_configs
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, load_keys
from tests.loopback import Loopback
from tests.openai.openai_stub import Recorded, Stub, choices_body

pytest.importorskip("starlette")

ALICE, BOB = "sk-alice-0123456789", "sk-bob-9876543210"
LOOP = """
[loop]
k = 4
max_concurrency = 4
seed = 7
[prompt]
template = "{question}"
[sampling]
max_tokens = 32
[extract]
method = "regex"
regex = 'Answer:\\s*(\\S+)'
[backend]
%(backend)s
[budget]
max_tokens = 20000
[pricing]
input_per_mtok = 1.0
output_per_mtok = 2.0
[serve]
models = ["gpt-4o-mini", "gpt-4.1-mini", "meta-llama/Llama-3.1-8B"]
[serve.pricing."gpt-4.1-mini"]
input_per_mtok = 10.0
output_per_mtok = 40.0
"""
SIMULATED = 'kind = "simulated"\nmodel = "gpt-4o"\nprompt_tokens = 20\noutput_tokens = 10'
COMBOS = ["vote/gpt-4o-mini", "vote/gpt-4.1-mini", "vote/meta-llama/Llama-3.1-8B"]


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _keys(folder: Path) -> Path:
    path = folder / "keys.toml"
    path.write_text(
        f'[[keys]]\nname = "alice"\nsha256 = "{_sha(ALICE)}"\nloops = ["vote"]\n'
        "budget = { max_tokens = 100000 }\n"
        f'[[keys]]\nname = "bob"\nsha256 = "{_sha(BOB)}"\nloops = ["vote/gpt-4o-mini"]\n'
    )
    return path


@contextmanager
def served(tmp_path: Path, backend: str = SIMULATED) -> Iterator[tuple[str, Path]]:
    """`serve --loops DIR --keys FILE`'s app on loopback: its base URL and runs folder."""
    folder = tmp_path / "loops"
    folder.mkdir(exist_ok=True)
    (folder / "vote.toml").write_text(LOOP % {"backend": backend})
    loops = loop_configs(folder)
    store = open_store(None, tmp_path / "runs")
    keys = load_keys(_keys(tmp_path), loops)
    pools = KeyPools(keys, store)
    pools.prepare()
    session = Session(store=store)
    app = create_gateway(session, loops, keys=keys, pools=pools)
    tokens: list[EventLoopToken] = []

    async def noting_its_loop(scope: Scope, receive: Receive, send: Send) -> None:
        if not tokens:
            tokens.append(anyio.lowlevel.current_token())
        await app(scope, receive, send)

    with Loopback(noting_its_loop) as server:
        try:
            yield server.base_url, tmp_path / "runs"
        finally:  # the backends it built (an HTTP client's connections), closed on their loop
            if tokens:
                anyio.from_thread.run(session.aclose, token=tokens[0])


@contextmanager
def _client(base_url: str, key: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
        yield client


def _ask(client: openai.OpenAI, model: str) -> str:
    """A chat to `model`; the run id its response names."""
    response = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "What is 17 * 23?"}]
    )
    return response.headers["x-lanefold-run-id"]


def test_the_sdk_calls_a_loop_over_a_listed_model_and_the_run_records_it(tmp_path: Path) -> None:
    with served(tmp_path) as (url, runs):
        with _client(url, ALICE) as client:
            ids = {model: _ask(client, model) for model in ["vote", *COMBOS]}
    store = open_store(None, runs)
    hashes = set()
    for model, run_id in ids.items():
        state = read_state(store, run_id)
        assert state.started is not None and state.result is not None
        assert state.started.model == model  # what the client asked for
        ran = model.partition("/")[2] or "gpt-4o"  # the loop's own model where none is named
        assert state.started.config["backend"]["model"] == ran
        assert "serve" not in state.started.config  # how a file is served is no part of a run
        hashes.add(state.started.config_hash)
    assert len(hashes) == 4  # each model's runs hash as a config of their own
    # The listed model's own prices, else [pricing]'s, decide what a run cost.
    priced = read_state(store, ids["vote/gpt-4.1-mini"])
    plain = read_state(store, ids["vote/gpt-4o-mini"])
    assert priced.started is not None and plain.started is not None
    assert priced.started.config["pricing"]["input_per_mtok"] == 10.0
    assert plain.started.config["pricing"]["input_per_mtok"] == 1.0
    assert priced.spend.tokens == plain.spend.tokens > 0
    assert priced.spend.cost_usd > plain.spend.cost_usd > 0
    # `list --model` finds a combination's runs by the name the client asked for.
    assert [s.run_id for s in store.list_runs(model="vote/gpt-4.1-mini")] == [ids["vote/gpt-4.1-mini"]]
    # The key's budget counted every run, whatever model it ran over.
    assert store.read_budget("key:alice").spent_tokens == sum(
        read_state(store, run_id).spend.tokens for run_id in ids.values()
    )


def _answer(rec: Recorded) -> Response:
    return JSONResponse(choices_body(rec, ["Answer: 391"] * rec.n))


def test_an_openai_upstream_is_sent_the_model_the_client_chose(tmp_path: Path) -> None:
    stub = Stub(reply=_answer)
    with Loopback(stub.app()) as upstream:
        backend = f'kind = "openai"\nbase_url = "{upstream.base_url}"\nmodel = "gpt-4o"'
        with served(tmp_path, backend) as (url, runs):
            with _client(url, ALICE) as client:
                run_id = _ask(client, "vote/gpt-4.1-mini")
                sent_then = len(stub.requests)
                own = _ask(client, "vote")
    chosen = {r.body["model"] for r in stub.requests[:sent_then]}
    assert chosen == {"gpt-4.1-mini"}
    assert {r.body["model"] for r in stub.requests[sent_then:]} == {"gpt-4o"}
    store = open_store(None, runs)
    state = read_state(store, run_id)
    assert state.result is not None and state.result.get("answer") == "391"
    assert state.started is not None and state.started.config["backend"]["model"] == "gpt-4.1-mini"
    assert read_state(store, own).started.config["backend"]["model"] == "gpt-4o"  # type: ignore[union-attr]


def test_a_model_not_listed_is_404_naming_the_ones_the_key_may_call(tmp_path: Path) -> None:
    with served(tmp_path) as (url, runs), _client(url, ALICE) as alice_client, _client(url, BOB) as bob:
        with pytest.raises(openai.NotFoundError) as alice:
            _ask(alice_client, "vote/gpt-5")
        with pytest.raises(openai.NotFoundError) as other:
            _ask(bob, "vote/gpt-4.1-mini")
        with pytest.raises(openai.NotFoundError) as bare:
            _ask(bob, "vote")  # bob's key names one combination, not the loop
        bob_runs = _ask(bob, "vote/gpt-4o-mini")
    assert alice.value.code == other.value.code == bare.value.code == "model_not_found"
    assert str(alice.value.body["message"]).endswith(  # type: ignore[index]
        "loop 'vote' serves " + ", ".join(COMBOS)
    )
    assert str(other.value.body["message"]).endswith("loop 'vote' serves vote/gpt-4o-mini")  # type: ignore[index]
    store = open_store(None, runs)
    assert [s.run_id for s in store.list_runs()] == [bob_runs]  # a refusal leaves no run


def test_v1_models_lists_what_each_key_may_call(tmp_path: Path) -> None:
    with served(tmp_path) as (url, _), _client(url, ALICE) as alice_client, _client(url, BOB) as bob_client:
        alice = [m.id for m in alice_client.models.list()]
        bob = [m.id for m in bob_client.models.list()]
        nobody = httpx.get(f"{url}/models")
    assert alice == ["vote", *COMBOS]
    assert bob == ["vote/gpt-4o-mini"]
    assert nobody.status_code == 401


def test_serve_models_is_checked_where_the_file_is_read(tmp_path: Path) -> None:
    base = {"backend": {"kind": "simulated"}}
    with pytest.raises(ConfigError, match=r"<config>: serve.pricing: 'gpt-5' is not in serve.models$"):
        parse_config({**base, "serve": {"models": ["a"], "pricing": {"gpt-5": {"input_per_mtok": 1.0}}}})
    with pytest.raises(ConfigError, match=r"<config>: serve.models: 'a' is listed twice$"):
        parse_config({**base, "serve": {"models": ["a", "a"]}})
    # `[serve]` is no part of the recorded config: a file that gains it hashes as before.
    assert config_hash(parse_config({**base, "serve": {"models": ["a"]}})) == config_hash(parse_config(base))
    with pytest.raises(ConfigError, match=r"a loop's name has no '/'"):
        loop_configs(None, [f"a/b={tmp_path / 'x.toml'}"])


def test_serve_refuses_a_listed_model_it_cannot_run_before_the_port_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "loops"
    folder.mkdir()
    (folder / "vote.toml").write_text('[backend]\nkind = "engine"\n[serve]\nmodels = ["no-such-model"]\n')
    refused = cli(capsys, "serve", "--loops", str(folder), "--runs-dir", str(tmp_path / "runs"))
    assert refused.code == 2
    assert refused.error_line.startswith(
        f"orchestrator serve: {folder / 'vote.toml'}: serve.models 'no-such-model': backend.model: model "
    )


class _NoModel(BaseModel):
    """A backend's config with no `model` key: nothing for `[serve] models` to set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["no_model"] = "no_model"

    def build(self) -> None:  # never built: the config is refused first
        raise AssertionError("built")


def test_serve_models_needs_a_backend_with_a_model() -> None:
    saved = BACKENDS.snapshot()
    try:
        register_backend("no_model")(_NoModel)
        parse_config({"backend": {"kind": "no_model"}})  # without [serve], as before
        with pytest.raises(
            ConfigError, match=r'serve.models: backend kind "no_model" has no model to choose'
        ):
            parse_config({"backend": {"kind": "no_model"}, "serve": {"models": ["a"]}})
    finally:
        BACKENDS.restore(saved)
