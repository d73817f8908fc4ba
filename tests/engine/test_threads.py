"""The engine's thread count where a config sets none (`default_threads`)."""

from __future__ import annotations

import pytest

from lanefold.backends.engine._engine import default_threads


@pytest.mark.parametrize(
    ("cores", "load", "threads"),
    [
        (1, 0.0, 1),  # one core: one thread, whatever else runs
        (2, 0.0, 1),  # a quiet 2-core machine: one core left for the loop, the server, the store
        (2, 1.2, 1),  # one of two cores busy elsewhere
        (2, 6.0, 1),  # at least one, however loaded
        (16, 0.0, 15),
        (16, 0.4, 15),
        (16, 3.4, 13),  # three cores busy elsewhere: none of torch's threads waits on them
    ],
)
def test_the_default_leaves_a_core_and_the_busy_ones(cores: int, load: float, threads: int) -> None:
    assert default_threads(cores, load) == threads


def test_a_config_without_threads_gets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from lanefold.backends.engine import _engine

    monkeypatch.setattr(_engine, "default_threads", lambda: 3)
    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(
        _engine, "resolve_model_path", lambda model: (_ for _ in ()).throw(RuntimeError("stop"))
    )
    with pytest.raises(RuntimeError, match="stop"):
        _engine.Engine.from_config(_engine.EngineConfig(model="smollm2-135m", device="cpu"))
    with pytest.raises(RuntimeError, match="stop"):
        _engine.Engine.from_config(_engine.EngineConfig(model="smollm2-135m", device="cpu", threads=2))
    assert seen == [3, 2]
