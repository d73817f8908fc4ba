"""Runs of one Session on one engine decode their lanes in the same batches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import lanefold  # noqa: E402
from lanefold.backends.engine import EngineBackend  # noqa: E402
from lanefold.backends.engine._engine import Engine  # noqa: E402

CONFIG = {
    "loop": {"k": 4, "seed": 5},
    "prompt": {"template": "{question}"},
    "sampling": {"temperature": 1.0, "max_tokens": 12},
    "extract": {"method": "last_number"},
    "backend": {"kind": "simulated"},  # replaced by the engine given to the Session
}
QUESTIONS = ["abc " * 9, "xyz " * 5]


async def answers(
    engine: Engine, questions: list[str], runs: Path, *, concurrency: int
) -> dict[int, list[str | None]]:
    config = lanefold.parse_config(CONFIG)
    backend = EngineBackend(engine=engine)
    texts: dict[int, list[str | None]] = {}
    async with lanefold.Session(config, backend=backend, runs_dir=runs) as session:
        async for result in session.run_many(questions, concurrency=concurrency):
            assert result.index is not None
            texts[result.index] = [lane.answer for lane in result.lanes]
    await backend.aclose()  # given to the session, so the session left it open
    return texts


@pytest.mark.anyio
async def test_concurrent_runs_share_decode_steps(make_engine: Callable[..., Engine], tmp_path: Path) -> None:
    alone_steps = 0
    alone: dict[int, list[str | None]] = {}
    for i, question in enumerate(QUESTIONS):
        engine = make_engine()
        alone[i] = (await answers(engine, [question], tmp_path / f"alone{i}", concurrency=1))[0]
        alone_steps += engine.metrics.decode_steps
    shared = make_engine()
    together = await answers(shared, QUESTIONS, tmp_path / "together", concurrency=2)
    assert together == alone  # same seeds, same lanes, whatever they shared
    assert shared.metrics.decode_steps < alone_steps  # lanes of both questions in one batch
    assert shared.pool.num_free == shared.pool.num_blocks
