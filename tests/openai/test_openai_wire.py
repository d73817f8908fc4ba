"""What goes on the wire: chat vs completions bodies, passthroughs, logprobs; the config."""

from __future__ import annotations

from typing import Any

import pytest
from openai_stub import Stub, make_backend
from pydantic import ValidationError

from lanefold.backends import openai as openai_backend
from lanefold.backends.openai import OpenAIConfig
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams, sample_all

pytestmark = pytest.mark.anyio

PARAMS = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=24, stop=("\n\n", "END"))


def req(k: int = 1, params: SamplingParams = PARAMS) -> SampleRequest:
    return SampleRequest("Q?", params, tuple(LaneRequest(i, 77 + i, 24) for i in range(k)))


async def test_chat_body(stub: tuple[Stub, str]) -> None:
    server, url = stub
    b = make_backend(
        url,
        model="qwen",
        system_prompt="Be brief.",
        headers={"X-Team": "lanes"},
        extra_body={"top_k": 40, "repetition_penalty": 1.1},
        api_key_env="K",
        environ={"K": "secret"},
    )
    async with b:
        (out,) = await sample_all(b, req())
    (rec,) = server.requests
    assert rec.path == "/v1/chat/completions"
    assert rec.body == {
        "model": "qwen",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Q?"},
        ],
        "max_tokens": 24,
        "temperature": 0.3,
        "top_p": 0.9,
        "seed": 77,
        "stop": ["\n\n", "END"],
        "top_k": 40,
        "repetition_penalty": 1.1,
    }
    assert rec.headers["x-team"] == "lanes"
    assert rec.headers["authorization"] == "Bearer secret"
    assert isinstance(out, Sample)
    assert out.text == "seed 77 choice 0"
    assert out.logprobs is None


async def test_completions_body(stub: tuple[Stub, str]) -> None:
    server, url = stub
    params = SamplingParams(max_tokens=24, logprobs=True, top_k=5, ignore_eos=True)
    async with make_backend(url, api="completions") as b:
        out = await sample_all(b, req(3, params))
    (rec,) = server.requests
    assert rec.path == "/v1/completions"
    assert rec.body["prompt"] == "Q?"
    assert "messages" not in rec.body
    assert rec.body["n"] == 3
    assert rec.body["logprobs"] == 1
    assert rec.body["top_k"] == 5
    assert rec.body["ignore_eos"] is True
    assert "stop" not in rec.body
    assert "authorization" not in rec.headers
    assert [s.text for s in out if isinstance(s, Sample)] == [f"seed 77 choice {i}" for i in range(3)]
    assert all(isinstance(s, Sample) and s.logprobs == (-0.5,) * 4 for s in out)
    assert {s.extra["usage_apportioned_by"] for s in out if isinstance(s, Sample)} == {"tokens"}


async def test_chat_logprobs_requested_and_returned(stub: tuple[Stub, str]) -> None:
    server, url = stub
    async with make_backend(url) as b:
        (out,) = await sample_all(b, req(1, SamplingParams(logprobs=True)))
    assert server.requests[0].body["logprobs"] is True
    assert isinstance(out, Sample)
    assert out.logprobs == (-0.5,) * 4


def test_public_names() -> None:
    # read_api_key: the one check of a key from the environment (serve and validate use it)
    # PooledTransport: the backend's own transport, for a caller passing one of its own settings
    assert openai_backend.__all__ == (
        "BackendEvent",
        "OpenAIBackend",
        "OpenAIConfig",
        "PooledTransport",
        "read_api_key",
    )


def test_config_defaults() -> None:
    c = OpenAIConfig(base_url="http://127.0.0.1:8000/v1/", model="m")
    assert c.kind == "openai"
    assert c.base_url == "http://127.0.0.1:8000/v1"
    assert (c.api, c.n, c.max_n, c.api_key_env, c.system_prompt) == ("chat", "auto", 16, None, None)


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"surprise": 1}, "Extra inputs"),
        ({"kind": "engine"}, "openai"),
        ({"base_url": "ftp://h/v1"}, "http"),
        ({"base_url": "http://user:pw@h/v1"}, "credentials"),
        ({"base_url": "http://h/v1?key=abc"}, "query"),
        ({"api": "responses"}, "chat"),
        ({"n": "sometimes"}, "auto"),
        ({"max_n": 0}, "greater than or equal to 1"),
        ({"timeout_s": 0}, "greater than 0"),
        ({"api_key_env": "sk-abc123"}, "pattern"),
        ({"headers": {"Authorization": "Bearer x"}}, "api_key_env"),
        ({"headers": {"X-Team": "lanes\r"}}, "printable ASCII"),
        ({"headers": {"X-Team": "lané"}}, "printable ASCII"),
        ({"headers": {"X Team": "lanes"}}, "not a valid header name"),
        # A header whose name says it carries a secret is named by its variable (headers_env):
        # the config is recorded in every run's run.started.
        ({"headers": {"api-key": "k-123"}}, "headers_env"),
        ({"headers": {"X-Goog-Api-Key": "k-123"}}, "headers_env"),
        ({"headers": {"X-Auth-Token": "k-123"}}, "headers_env"),
        ({"headers": {"Cookie": "session=k-123"}}, "headers_env"),
        ({"headers_env": {"X Key": "K"}}, "not a valid header name"),
        ({"headers_env": {"api-key": "sk-abc123!"}}, "not an environment variable's name"),
        ({"headers_env": {"Authorization": "K"}, "api_key_env": "K"}, "api_key_env or headers_env"),
        ({"extra_body": {"n": 4}}, "extra_body may not set"),
        ({"extra_body": {"max_tokens": 4}}, "extra_body may not set"),
    ],
)
def test_config_refuses(fields: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        OpenAIConfig(**{"base_url": "http://127.0.0.1:8000/v1", "model": "m", **fields})


async def test_headers_env_sends_each_header_from_its_variable_and_the_config_holds_the_name(
    stub: tuple[Stub, str],
) -> None:
    server, url = stub
    secret = "azure-secret-0123456789"
    b = make_backend(url, headers_env={"api-key": "AZURE_KEY"}, environ={"AZURE_KEY": secret})
    async with b:
        await sample_all(b, req())
    assert server.requests[0].headers["api-key"] == secret
    config = OpenAIConfig(base_url=url, model="m", headers_env={"api-key": "AZURE_KEY"})
    assert secret not in config.model_dump_json() and "AZURE_KEY" in config.model_dump_json()
    assert config.build_errors({}) == ["headers_env.api-key: environment variable AZURE_KEY is not set"]
    assert config.build_errors({"AZURE_KEY": secret}) == []
