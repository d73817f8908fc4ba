"""The model ids `serve` answers to: the backend's `kind:model` name and the bare model name
configs use (`engine:smollm2-135m` and `smollm2-135m`), or only a name given with
`--model-name`; anything else is 404 `model_not_found`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from lanefold.primitives import LaneOutcome, Sample, SampleRequest, Usage
from lanefold.serve._app import create_app, served_names

pytestmark = pytest.mark.anyio


class Named:
    """A backend called `name` that answers "ok"."""

    max_lanes_per_request = None

    def __init__(self, name: str) -> None:
        self.name = name

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return 1

    async def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        for lane in request.lanes:
            yield Sample(lane.lane, "ok", "stop", Usage(1, 0, 1))

    async def aclose(self) -> None:
        pass


async def status(app: Any, model: str) -> tuple[int, Any]:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://served") as client:
        done = await client.post("/v1/completions", json={"prompt": "Q", "model": model})
        chat = await client.post(
            "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "Q"}]}
        )
    assert chat.status_code == done.status_code
    return done.status_code, done.json()


@pytest.mark.parametrize(
    ("backend", "model_name", "answers", "refuses"),
    [
        # the default (`orchestrator serve` without --model-name): both names
        (
            "engine:smollm2-135m",
            "engine:smollm2-135m",
            ["engine:smollm2-135m", "smollm2-135m"],
            ["engine", "smollm2", "openai:smollm2-135m", ""],
        ),
        (
            "openai:org/model:v1",
            "openai:org/model:v1",
            ["openai:org/model:v1", "org/model:v1"],
            ["model:v1", "org/model"],
        ),
        # a backend with no kind prefix, and a name given with --model-name: that name only
        ("simulated", "simulated", ["simulated"], ["", "sim"]),
        ("engine:smollm2-135m", "tiny", ["tiny"], ["engine:smollm2-135m", "smollm2-135m"]),
    ],
)
async def test_serve_answers_to_its_names_only(
    backend: str, model_name: str, answers: list[str], refuses: list[str]
) -> None:
    app = create_app(Named(backend), model_name=model_name)
    assert served_names(Named(backend), model_name) == frozenset(answers)
    for model in answers:
        code, body = await status(app, model)
        assert code == 200, body
        assert body["model"] == model_name  # answered as the served id, as vLLM does
    for model in refuses:
        code, body = await status(app, model)
        assert code == 404, model
        assert body["error"]["code"] == "model_not_found"
        assert body["error"]["param"] == "model"


async def test_models_lists_the_served_id() -> None:
    app = create_app(Named("engine:smollm2-135m"), model_name="engine:smollm2-135m")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://served") as client:
        listed = (await client.get("/v1/models")).json()
    assert [m["id"] for m in listed["data"]] == ["engine:smollm2-135m"]


def test_orchestrator_serve_answers_to_the_bare_name_a_config_uses(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import lanefold.cli._main as cli_module
    import lanefold.cli._serve as serve_cli

    config = tmp_path / "backend.toml"  # a config names its model bare, as every config does
    config.write_text(
        '[backend]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "smollm2-135m"\n'
    )
    calls: list[tuple[Any, dict[str, Any]]] = []
    monkeypatch.setattr(serve_cli, "serve", lambda backend, **kw: calls.append((backend, kw)))
    assert cli_module.main(["serve", "--backend-config", str(config)]) == 0
    ((backend, kw),) = calls
    assert kw["model_name"] == "openai:smollm2-135m"
    assert served_names(backend, kw["model_name"]) == {"openai:smollm2-135m", "smollm2-135m"}
