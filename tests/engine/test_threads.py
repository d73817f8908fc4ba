"""The engine's thread count where a config sets none (`default_threads`)."""

from __future__ import annotations

import os
import time

import pytest

from lanefold.backends.engine._engine import busy_cores, default_threads


@pytest.mark.parametrize(
    ("cores", "busy", "threads"),
    [
        (1, 0.0, 1),  # one core: one thread, whatever else runs
        (2, 0.0, 2),  # a quiet 2-core machine: both
        (2, 0.4, 2),
        (2, 1.1, 1),  # one of two cores busy elsewhere: none of torch's threads waits on it
        (2, 6.0, 1),  # at least one, however loaded
        (16, 0.0, 16),
        (16, 3.4, 13),
    ],
)
def test_the_default_leaves_out_the_busy_cores(cores: int, busy: float, threads: int) -> None:
    assert default_threads(cores, busy) == threads


def test_a_busy_core_is_seen() -> None:
    """A process spinning beside us is counted as about one busy core; our own work is not."""
    import subprocess
    import sys

    quiet = busy_cores(0.3)
    if quiet > (os.cpu_count() or 1) - 1.2:
        pytest.skip(f"{quiet:.1f} cores busy already: no room to see one more")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = busy_cores(0.3)
    finally:
        spin.kill()
        spin.wait()
    assert seen >= quiet + 0.6  # one more core busy (the machine may have other work)


def test_a_config_without_threads_gets_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from lanefold.backends.engine import _engine

    monkeypatch.setattr(_engine, "default_threads", lambda: 3)
    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(_engine, "build_model", lambda *a: (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError, match="stop"):
        _engine.Engine.from_config(_engine.EngineConfig(model="smollm2-135m", device="cpu"))
    with pytest.raises(RuntimeError, match="stop"):
        _engine.Engine.from_config(_engine.EngineConfig(model="smollm2-135m", device="cpu", threads=2))
    assert seen == [3, 2]


def test_a_long_lived_engine_follows_a_job_that_arrives() -> None:
    """The tuner of an engine left to the default drops a thread when another job takes a core,
    and takes it back when the job ends (a server started on a quiet machine)."""
    import subprocess
    import sys

    import torch

    from lanefold.backends.engine._engine import ThreadTuner

    cores = len(os.sched_getaffinity(0))
    if cores < 2 or busy_cores(0.3) > 0.5:
        pytest.skip("needs two cores and a machine quiet enough to see one job arrive")
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    tuner = ThreadTuner(every_s=0.3)
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.4)
        assert tuner.retune() == cores - 1
        assert torch.get_num_threads() == cores - 1
    finally:
        spin.kill()
        spin.wait()
    try:
        time.sleep(0.4)
        assert tuner.retune() == cores
    finally:
        torch.set_num_threads(before)
