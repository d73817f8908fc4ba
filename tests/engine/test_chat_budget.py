"""A chat request's hold counts what the engine sends: the conversation through the model's chat
template (issue 38), so a key's hard budget holds on the gateway's chat path as on the CLI's."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from tiny import byte_tokenizer

from lanefold.backends.engine import EngineBackend
from lanefold.backends.engine._engine import Engine
from lanefold.config import LoopConfig, parse_config
from lanefold.execution import Session, open_store, read_state
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, load_keys

pytest.importorskip("starlette")
from starlette.testclient import TestClient

# ChatML, as SmolLM2's template writes it (without its default system turn): 32 bytes more
# than the `<|role|>` markers a hold used to guess for one user turn.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
KEY = "chat-key-0123456789"


def _engine(make_engine: Callable[..., Engine]) -> EngineBackend:
    engine = make_engine()
    tokenizer = byte_tokenizer()
    tokenizer.chat_template = CHATML
    engine.tokenizer = tokenizer
    return EngineBackend(engine=engine)


def _loop(sampled: int = 8, **budget: Any) -> LoopConfig:
    return parse_config(
        {
            "loop": {"k": 1, "min_quorum": 1, "seed": 3},
            "prompt": {"template": "{question}"},
            "sampling": {"max_tokens": sampled},
            "budget": budget,
        }
    )


def test_a_chat_runs_hold_is_what_the_engine_prefills(
    make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    backend = _engine(make_engine)

    async def go() -> Any:
        async with Session(_loop(max_tokens=62), backend=backend, runs_dir=tmp_path) as session:
            return await session.run("2+2?", conversation=[], run_id="chat")

    result = anyio.run(go)
    state = read_state(open_store(None, tmp_path), "chat")
    (wave,) = state.waves.values()
    sent = 54  # "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", a token a byte
    assert wave.info.prompt_tokens == sent
    (lane,) = wave.lanes.values()
    assert lane.usage is not None and lane.usage.input_tokens == sent
    assert not any(e.type == "budget.overrun" for e in state_events(tmp_path))
    assert result.usage.prefill_tokens + result.usage.decode_tokens == state.spend.tokens <= 62


def state_events(runs: Path) -> list[Any]:
    from lanefold.primitives import parse_event

    return [parse_event(line) for line in (runs / "chat" / "events.jsonl").read_bytes().splitlines()]


def test_a_keys_hard_budget_holds_on_the_chat_path(
    make_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    """Defect: a key limited to 50 tokens paid 62 for one chat request (its hold counted the
    prompt without the template's 32 bytes)."""
    runs = tmp_path / "runs"
    store = open_store(None, runs)
    keys_path = tmp_path / "keys.toml"
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    keys_path.write_text(f'[[keys]]\nname = "chat"\nsha256 = "{sha}"\nbudget = {{max_tokens = 50}}\n')
    loops = {"tiny": _loop()}
    keys = load_keys(keys_path, loops)
    pools = KeyPools(keys, store)
    pools.prepare()
    app = create_gateway(Session(store=store, backend=_engine(make_engine)), loops, keys=keys, pools=pools)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "2+2?"}]}
    with TestClient(app, base_url="http://gateway/v1") as client:
        answer = client.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert answer.status_code == 429, answer.text
    assert answer.json()["error"]["code"] == "insufficient_quota"
    spent = sum(read_state(store, s.run_id).spend.tokens for s in store.list_runs())
    assert spent <= 50


@pytest.mark.slow
def test_a_keys_hard_budget_holds_on_smollm2s_chat_path(smollm2: Engine, tmp_path: Path) -> None:
    """The issue's own case: SmolLM2's template adds its default system turn (about 17 tokens)
    around a chat; a key limited to 50 tokens never pays more than 50, whatever it is asked, and
    a request it funds is held exactly what SmolLM2 prefills."""
    runs = tmp_path / "runs"
    store = open_store(None, runs)
    keys_path = tmp_path / "keys.toml"
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    keys_path.write_text(
        f'[[keys]]\nname = "small"\nsha256 = "{sha}"\nbudget = {{max_tokens = 50}}\n'
        f'[[keys]]\nname = "big"\nsha256 = "{hashlib.sha256(b"big-key-0123456789").hexdigest()}"\n'
        "budget = {max_tokens = 5000}\n"
    )
    loops = {"smol": _loop(16)}  # SmolLM2's 38 prompt tokens here and 16 more: 54 past 50
    keys = load_keys(keys_path, loops)
    pools = KeyPools(keys, store)
    pools.prepare()
    backend = EngineBackend(engine=smollm2)
    app = create_gateway(Session(store=store, backend=backend), loops, keys=keys, pools=pools)
    body = {"model": "smol", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    with TestClient(app, base_url="http://gateway/v1") as client:
        for _ in range(3):
            small = client.post("/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
            assert small.status_code in (200, 429), small.text
        big = client.post(
            "/chat/completions", json=body, headers={"Authorization": "Bearer big-key-0123456789"}
        )
    # Funded: an answer, or a run told as one without (SmolLM2 may write no 'Answer:' line).
    assert big.status_code == 200 or big.json()["error"]["code"] == "no_answer", big.text
    paid = [read_state(store, s.run_id).spend.tokens for s in store.list_runs() if s.caller == "small"]
    assert sum(paid) <= 50, paid  # (it had paid about 60 for one request)
    (run,) = [s for s in store.list_runs() if s.caller == "big"]
    state = read_state(store, run.run_id)
    (wave,) = state.waves.values()
    (lane,) = wave.lanes.values()
    assert lane.usage is not None  # (the engine's prefix cache may serve part of it: cached)
    assert wave.info.prompt_tokens == lane.usage.input_tokens + lane.usage.cached_input_tokens > 17
    assert store.read_budget("key:big").spent_tokens == state.spend.tokens  # type: ignore[attr-defined]
