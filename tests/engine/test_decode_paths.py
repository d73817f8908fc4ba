"""Which way the engine's decode steps go (`_decode_paths`): chosen once per machine, model, dtype
and threads, a trial's answer kept and reused, and recorded with every lane (issue 39)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("numba")

from tiny import TINY, Told, tiny_checkpoint  # noqa: E402

from lanefold.backends.engine import EngineBackend, _decode_paths  # noqa: E402
from lanefold.backends.engine._decode_paths import DecodePaths, Shape, choose_paths, paths_dir  # noqa: E402
from lanefold.backends.engine._engine import Engine  # noqa: E402
from lanefold.backends.engine._model import build_model  # noqa: E402
from lanefold.primitives import LaneRequest, Sample, SampleRequest, SamplingParams, sample_all  # noqa: E402

CPU = torch.device("cpu")
FIELDS = {
    "device", "cpu", "dtype", "threads", "products", "packed", "lone_lane", "shared_prefix", "forks",
    "arithmetic", "attention", "decided", "key", "trials",
}  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder of the test's own, and a process that has chosen nothing yet."""
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_decode_paths, "_CHOSEN", {})
    yield tmp_path / "cache"


def _new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a later process starts with: nothing chosen in memory, only the cache folder."""
    monkeypatch.setattr(_decode_paths, "_CHOSEN", {})


def test_every_lane_says_which_decode_paths_its_steps_took(make_engine: Callable[..., Engine]) -> None:
    """The defect: the engine picked among its kernels by CPU features and timing trials and
    nothing told the user which ran. Each lane's `extra` now carries the model's choice."""
    engine = make_engine()
    request = SampleRequest(
        prompt="hello",
        params=SamplingParams(temperature=0.8, max_tokens=4),
        lanes=tuple(LaneRequest(lane=i, seed=i, max_tokens=4) for i in range(3)),
    )
    samples = anyio.run(sample_all, EngineBackend(engine=engine), request)
    assert all(isinstance(s, Sample) for s in samples)
    for sample in samples:
        assert isinstance(sample, Sample)
        paths = sample.extra["decode_paths"]
        assert paths == engine.decode_paths().record() and set(paths) == FIELDS
        assert paths["device"] == "cpu" and paths["dtype"] == "float32"
        assert paths["threads"] == torch.get_num_threads()
    json.dumps(samples[0].extra)  # (it goes into the run's log as it is)


_LOAD = """
import json, sys
import torch
from tiny import tiny_checkpoint
from lanefold.backends.engine import _decode_paths
from lanefold.backends.engine._model import build_model
from lanefold.backends.engine._trials import Trial
if sys.argv[1] == "noisy":  # a measurement now would say the opposite of the kept one
    def opposite(self, threads, dtype, width):
        return Trial(not json.loads(sys.argv[2])["torch_faster"], {})
    _decode_paths._Measured.products = opposite
torch.set_num_threads(1)
model = build_model(tiny_checkpoint(), torch.device("cpu"), torch.float32)
print(json.dumps(model.decode_paths().record()))
"""


def test_a_later_load_in_another_process_measures_nothing_and_goes_the_same_way(cache: Path) -> None:
    """The defect: two timing trials at every load, so a user's path (and its rounding)
    depended on the noise of the moment. The first load measures and keeps the answer; a later
    process with the same key reads it back and goes the same way, whatever a measurement
    would say now."""
    path = [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}

    def load(*argv: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD, *argv], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return dict(json.loads(done.stdout.splitlines()[-1]))

    first = load("quiet")
    assert first["decided"] == "measured" and set(first["trials"]) == {"products"}
    kept = json.loads((paths_dir() / f"{first['key']}.json").read_text())
    later = load("noisy", json.dumps(kept))
    assert later["decided"] == "cached"
    assert {k: v for k, v in later.items() if k != "decided"} == {
        k: v for k, v in first.items() if k != "decided"
    }


def test_a_choice_is_kept_per_machine_model_dtype_and_threads(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    told = Told(torch_faster=True)
    monkeypatch.setattr(_decode_paths, "_Measured", lambda: told)
    shape = Shape.of(TINY)
    first = choose_paths(shape, torch.float32, CPU, 1)
    assert (first.decided, first.products, told.asked) == ("measured", "torch", 1)
    assert choose_paths(shape, torch.float32, CPU, 1).decided == "cached"  # this process's
    _new_process(monkeypatch)
    again = choose_paths(shape, torch.float32, CPU, 1)
    assert (again.decided, again.products, told.asked) == ("cached", "torch", 1)  # the file's
    others = [
        choose_paths(shape, torch.float32, CPU, 2),
        choose_paths(shape, torch.bfloat16, CPU, 1),
        choose_paths(Shape(128, 16, False), torch.float32, CPU, 1),
    ]
    keys = {first.key, *(p.key for p in others)}
    assert len(keys) == 4 and {p.name.removesuffix(".json") for p in paths_dir().iterdir()} <= keys
    import lanefold.backends.engine._arith as arith

    here = arith.native_half
    # another machine: bf16 emulated where this one has it natively, native where it emulates it
    monkeypatch.setattr(arith, "native_half", lambda dtype: not here(dtype))
    assert choose_paths(shape, torch.float32, CPU, 1).key not in keys


def test_a_cache_that_cannot_be_written_is_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache folder would go
    monkeypatch.setenv("LANEFOLD_CACHE", str(blocked))
    monkeypatch.setattr(_decode_paths, "_CHOSEN", {})
    told = Told()
    monkeypatch.setattr(_decode_paths, "_Measured", lambda: told)
    paths = choose_paths(Shape.of(TINY), torch.float32, CPU, 1)
    assert (paths.decided, paths.products, told.asked) == ("measured", "loops", 1)
    _new_process(monkeypatch)
    assert choose_paths(Shape.of(TINY), torch.float32, CPU, 1).decided == "measured"  # measured again
    assert told.asked == 2


@pytest.mark.parametrize("damage", ["torn", "another choice's"])
def test_a_kept_choice_that_does_not_read_back_as_this_ones_is_measured_again_and_replaced(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    told = Told(torch_faster=False)
    monkeypatch.setattr(_decode_paths, "_Measured", lambda: told)
    shape = Shape.of(TINY)
    key = choose_paths(shape, torch.float32, CPU, 1).key
    path = paths_dir() / f"{key}.json"
    if damage == "torn":
        path.write_bytes(path.read_bytes()[:40])
    else:  # a file that claims this key but was made for other inputs (edited, another machine)
        kept = json.loads(path.read_text())
        kept["inputs"]["threads"] = 7
        kept["torch_faster"] = True
        path.write_text(json.dumps(kept))
    _new_process(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="lanefold.backends.engine._decode_paths"):
        again = choose_paths(shape, torch.float32, CPU, 1)
    assert (again.decided, again.products, told.asked) == ("measured", "loops", 2)
    assert "measuring again" in caplog.text and str(path) in caplog.text
    assert json.loads(path.read_text())["inputs"]["threads"] == 1  # whole again, and this key's
    _new_process(monkeypatch)
    assert choose_paths(shape, torch.float32, CPU, 1).decided == "cached"


def test_where_rules_decide_nothing_is_measured(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bf16 model on a CPU that only emulates bf16 (an AVX2 machine): the loops for one and two
    rows (nothing for torch to read faster), no packed copies, fp32 arithmetic; on a GPU every
    product is torch's."""
    import lanefold.backends.engine._arith as arith

    monkeypatch.setattr(arith, "native_half", lambda dtype: False)
    told = Told(torch_faster=True)
    paths = choose_paths(Shape.of(TINY), torch.bfloat16, CPU, 1, measure=told)
    assert told.asked == 0 and paths.decided == "rules" and not paths.trials
    assert (paths.products, paths.packed, paths.lone_lane, paths.arithmetic) == (
        "loops",
        "none",
        "loops",
        "float32",
    )
    assert not paths_dir().exists()  # nothing to keep
    gpu = choose_paths(Shape.of(TINY), torch.bfloat16, torch.device("cuda"), 1)
    assert (gpu.device, gpu.products, gpu.lone_lane, gpu.shared_prefix, gpu.decided) == (
        "cuda", "torch", "layers", "torch", "rules",
    )  # fmt: skip


@pytest.mark.parametrize("torch_faster", [False, True])
def test_the_paths_recorded_are_the_paths_taken(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, torch_faster: bool
) -> None:
    """What the choice says is what a lone lane's steps do: every decode step in one compiled
    call where the loops read faster; layer by layer through torch's products where torch's do."""
    import lanefold.backends.engine._layers as layers
    import lanefold.backends.engine._model as model_module

    calls = {"lane_layers": 0, "torch_rows": 0}

    def counting(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*a: Any, **k: Any) -> Any:
            calls[name] += 1
            return real(*a, **k)

        return counted

    monkeypatch.setattr(model_module, "lane_layers", counting("lane_layers", model_module.lane_layers))
    monkeypatch.setattr(layers, "torch_rows", counting("torch_rows", layers.torch_rows))
    engine = make_engine(measure=Told(torch_faster=torch_faster))
    paths = engine.decode_paths()
    assert (paths.products, paths.lone_lane) == (("torch", "layers") if torch_faster else ("loops", "loops"))
    engine.generate(list(range(20)), SamplingParams(temperature=0.0, max_tokens=6), [LaneRequest(0, 0, 6)])
    if torch_faster:
        assert calls["lane_layers"] == 0 and calls["torch_rows"] >= 5 * TINY.num_layers * 3
    else:
        assert calls["lane_layers"] == 5 and calls["torch_rows"] == 0


def test_threads_changed_after_the_load_choose_the_products_again_and_keep_the_copies(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine left to the default threads follows the machine's load (`ThreadTuner`): at the
    new count its products are those chosen for that count; the packed copies made at load stay."""
    told = Told(torch_faster=False)
    monkeypatch.setattr(_decode_paths, "_Measured", lambda: told)
    torch.set_num_threads(1)
    model = build_model(tiny_checkpoint(), CPU, torch.bfloat16)
    loaded: DecodePaths = model.decode_paths()
    assert loaded.threads == 1 and loaded.products == "loops"
    told.torch_faster = True  # what the trial says at two threads
    torch.set_num_threads(2)
    retuned = model.decode_paths()
    assert retuned.threads == 2 and retuned.key != loaded.key
    assert retuned.packed == loaded.packed
    assert retuned.products == ("torch" if loaded.packed != "none" or retuned.dtype == "float32" else "loops")
    torch.set_num_threads(1)
    again = model.decode_paths()  # (kept in this process: nothing measured again)
    # A CPU that packs bf16 (AVX512-BF16, AMX) measures a trial at each count and keeps it; one
    # that emulates bf16 (AVX2 only) has no trial to run: its rules decide at every count.
    trialled = loaded.decided == "measured"
    assert again.decided == ("cached" if trialled else "rules")
    assert replace(again, decided=loaded.decided) == loaded
    assert told.asked == (2 if trialled else 0)


def test_show_json_says_which_decode_paths_a_run_took(
    make_engine: Callable[..., Engine], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's record says which way the engine went: `orchestrator show --json`'s `backend`
    names the backend and lists the decode paths its lanes recorded (one, as here, unless the
    engine's threads changed during the run)."""
    from lanefold.cli import main
    from lanefold.config import parse_config
    from lanefold.execution import Session

    engine = make_engine()
    config = parse_config(
        {
            "loop": {"k": 3, "min_quorum": 1, "seed": 3},
            "prompt": {"template": "{question}", "form": "raw"},
            "sampling": {"max_tokens": 4},
            "backend": {"kind": "engine"},
        }
    )

    async def go() -> Any:
        async with Session(config, backend=EngineBackend(engine=engine), runs_dir=tmp_path) as session:
            return await session.run("2+2?", run_id="paths")

    anyio.run(go)
    assert main(["show", "paths", "--runs-dir", str(tmp_path), "--json"]) in (0, 4)  # (4: no answer)
    shown = json.loads(capsys.readouterr().out)
    recorded = [engine.decode_paths().record()]
    assert shown["backend"] == {"name": "engine:smollm2-135m", "decode_paths": recorded}
