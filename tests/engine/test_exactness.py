"""The paged engine computes exactly what a full recompute computes, step after step."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from reference import reference_logits
from tiny import TINY, Told, tiny_checkpoint

from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._scheduler import Step
from lanefold.primitives import LaneRequest, SamplingParams

ATOL = 1e-4


def record_steps(engine: Engine) -> list[tuple[list[int], torch.Tensor]]:
    """Wrap the runner so every computed (tokens, logits) row is kept."""
    seen: list[tuple[list[int], torch.Tensor]] = []
    run = engine.runner.run

    def recording(step: Step) -> torch.Tensor:
        logits = run(step)
        seen.extend((list(s.tokens), row.clone()) for s, row in zip(step.sequences, logits, strict=True))
        return logits

    engine.runner.run = recording  # type: ignore[method-assign]
    return seen


def assert_matches_reference(seen: list[tuple[list[int], torch.Tensor]], seed: int = 0) -> None:
    checkpoint = tiny_checkpoint(seed)
    assert seen
    for tokens, row in seen:
        expected = reference_logits(checkpoint, tokens)[-1]
        torch.testing.assert_close(row, expected, atol=ATOL, rtol=0)


PROMPT = [(7 * i + 3) % 256 for i in range(37)]  # 37 tokens: no block size above 1 divides it


@pytest.mark.parametrize("block_size", [1, 16, 5])
def test_greedy_decode_matches_full_recompute_at_every_step(
    make_engine: Callable[..., Engine], block_size: int
) -> None:
    engine = make_engine(block_size=block_size)
    seen = record_steps(engine)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    engine.generate(PROMPT, params, [LaneRequest(0, 0, 12)])
    assert len(seen) == 12  # one prefill, then a decode per further token
    assert_matches_reference(seen)


@pytest.mark.parametrize("cap_tokens", [1 << 20, 20, 0])
def test_a_lone_lane_growing_and_rejoined_matches_full_recompute(
    make_engine: Callable[..., Engine], cap_tokens: int
) -> None:
    # A short prompt with a long answer, so the lone sequence's contiguous context (its `Lane`)
    # outgrows its capacity twice; another request arrives mid-decode (a prefill, then steps
    # of two), finishes first, and the first decodes alone again from a lane gathered afresh.
    # A cap of 20 tokens: the lane grows to 20, not past it, then the paged path takes over.
    # Cap 0: no lane is ever made, and the lone sequence decodes over the paged blocks.
    engine = make_engine(block_size=4)
    runner = engine.runner
    runner._prefix_cap = cap_tokens * runner._kept_block_bytes // runner.block_size
    seen = record_steps(engine)
    lanes: list[int] = []
    run = engine.runner.run

    def counting(step: Step) -> torch.Tensor:
        logits = run(step)
        lanes.append(0 if engine.runner._lane is None else engine.runner._lane[1].keys.shape[2])
        return logits

    engine.runner.run = counting  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=24)
    first = engine.add_request(PROMPT[:3], params, [LaneRequest(0, 0, 24)])
    for _ in range(10):
        engine.step()
    short = SamplingParams(temperature=0.0, max_tokens=4)
    second = engine.add_request(PROMPT[3:9], short, [LaneRequest(0, 0, 4)])
    while not (first.finished and second.finished):
        engine.step()
    assert_matches_reference(seen)
    if cap_tokens > 20:
        assert len(set(lanes) - {0}) >= 3  # grown at least twice while alone
        assert lanes[10] == 0  # dropped at the second request's prefill
        assert lanes[-1] > 0  # and gathered again once the first was alone
    elif cap_tokens:
        assert max(lanes) == 20  # grown to the cap, not past it
        assert lanes[-1] == 0  # past 20 tokens: the paged path
    else:
        assert set(lanes) == {0}


@pytest.mark.parametrize("block_size", [1, 16, 5])
def test_forked_sampled_branches_match_full_recompute(
    make_engine: Callable[..., Engine], block_size: int
) -> None:
    engine = make_engine(block_size=block_size)
    seen = record_steps(engine)
    params = SamplingParams(temperature=1.0, max_tokens=10)
    request = engine.generate(PROMPT, params, [LaneRequest(i, 100 + i, 10) for i in range(4)])
    assert len({tuple(s.output_ids) for s in request.sequences}) > 1  # the branches diverged
    assert_matches_reference(seen)


def test_prefix_cache_hit_and_concurrent_requests_match_full_recompute(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(block_size=4)
    seen = record_steps(engine)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    engine.generate(PROMPT, params, [LaneRequest(0, 0, 6)])
    first = engine.add_request([*PROMPT, 1, 2, 3], params, [LaneRequest(0, 0, 6)])
    second = engine.add_request([*PROMPT[:20], 9, 9], params, [LaneRequest(0, 0, 6)])
    while not (first.finished and second.finished):
        engine.step()
    assert first.metrics.prompt_tokens_cached == 36  # 9 full blocks of the first prompt
    assert second.metrics.prompt_tokens_cached == 20
    assert_matches_reference(seen)


@pytest.mark.parametrize("prefix_cap", [1 << 30, 0])
def test_forks_of_requests_arriving_mid_decode_match_full_recompute(
    make_engine: Callable[..., Engine], prefix_cap: int
) -> None:
    # A small pool, so the second wave reuses the blocks the first freed; a request arriving
    # mid-decode puts a prefill between decodes and two groups of forks in one step. The
    # runner's all-layer copies of shared prompts are kept (no cap) or never made (cap 0).
    engine = make_engine(block_size=4, num_blocks=40)
    engine.runner._prefix_cap = prefix_cap
    seen = record_steps(engine)
    params = SamplingParams(temperature=1.0, max_tokens=8)
    engine.generate(PROMPT[::-1], params, [LaneRequest(i, i, 8) for i in range(3)])
    arrive_mid_decode(engine)
    assert_matches_reference(seen)


def arrive_mid_decode(engine: Engine) -> None:
    """Forks of one prompt; three steps in, forks of another join; both run to the end."""
    params = SamplingParams(temperature=1.0, max_tokens=8)
    first = engine.add_request(PROMPT, params, [LaneRequest(i, 10 + i, 8) for i in range(3)])
    for _ in range(3):
        engine.step()
    second = engine.add_request(PROMPT[5:], params, [LaneRequest(i, 20 + i, 8) for i in range(3)])
    while not (first.finished and second.finished):
        engine.step()
    assert engine.pool.num_free == engine.pool.num_blocks


def test_preempted_branches_recompute_to_the_same_result(
    make_engine: Callable[..., Engine],
) -> None:
    params = SamplingParams(temperature=0.8, max_tokens=24)
    lanes = [LaneRequest(i, i, 24) for i in range(6)]
    roomy = make_engine(block_size=4, num_blocks=200).generate(PROMPT, params, lanes)
    tight_engine = make_engine(block_size=4, num_blocks=30)  # 16 blocks hold one lane
    seen = record_steps(tight_engine)
    tight = tight_engine.generate(PROMPT, params, lanes)
    assert tight_engine.scheduler.preemptions > 0
    assert tight.metrics.recomputed_tokens > 0
    assert [s.output_ids for s in tight.sequences] == [s.output_ids for s in roomy.sequences]
    assert tight_engine.pool.num_free == tight_engine.pool.num_blocks
    assert_matches_reference(seen)


def test_a_large_vocabulary_head_taken_in_slices_equals_one_product() -> None:
    from dataclasses import replace

    import torch.nn.functional as F

    from lanefold.backends.engine._model import build_model

    args = replace(TINY, vocab_size=5000)  # over two slices of 2048 rows
    model = build_model(tiny_checkpoint(args=args), torch.device("cpu"), torch.float32)
    hidden = torch.randn(8, args.hidden_size, generator=torch.Generator().manual_seed(3))
    logits = model.logits(hidden)
    assert logits.shape == (8, 5000)
    torch.testing.assert_close(logits, F.linear(hidden, model.lm_head.weight), atol=1e-5, rtol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_and_two_rows_through_the_fused_rows_and_the_kernels_equal_the_plain_products(
    make_engine: Callable[..., Engine], threads: int
) -> None:
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    engine = make_engine()
    model = engine.model
    assert all(w.qkv is not None and w.gate_up is not None for w in model.layer_weights())
    hidden = torch.randn(3, TINY.hidden_size, generator=torch.Generator().manual_seed(4))
    for rows in (1, 2, 3):  # the kernels, then torch's product
        expected = F.linear(hidden[:rows], model.lm_head.weight)
        torch.testing.assert_close(model.logits(hidden[:rows]), expected, atol=1e-5, rtol=0)
    seen = record_steps(engine)  # two lanes decode through the fused products
    params = SamplingParams(temperature=0.8, max_tokens=6)
    engine.generate(PROMPT, params, [LaneRequest(i, i, 6) for i in range(2)])
    assert len(seen) == 1 + 2 * 5
    assert_matches_reference(seen)


def test_weights_replaced_or_rewritten_after_the_build_are_not_read_from_a_stale_layout() -> None:
    import torch.nn.functional as F

    from lanefold.backends.engine._model import build_model

    model = build_model(tiny_checkpoint(), torch.device("cpu"), torch.float32)
    projection = model.model.layers[0].self_attn.q_proj
    projection.weight = torch.nn.Parameter(projection.weight.detach() * 2, requires_grad=False)
    weights = model.layer_weights()
    assert weights[0].qkv is None and weights[0].q is projection.weight  # a part at a time
    assert weights[1].qkv is not None
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # in place: read as it is now
    hidden = torch.randn(1, TINY.hidden_size, generator=torch.Generator().manual_seed(4))
    expected = F.linear(hidden, model.lm_head.weight)
    torch.testing.assert_close(model.logits(hidden), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["bf16-arithmetic", "fp32-arithmetic", "amx-tiles"])
def test_bfloat16_forks_and_mid_decode_arrivals_stay_within_rounding_of_the_reference(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # bf16 is the fast dtype on CPUs with AVX512-BF16 or AMX. The reference runs in fp32 on the
    # same bf16-rounded weights, so what is left is activation rounding: about 0.02 mean and
    # 0.09 max on logits of std ~1.2 here. Losing one of 40 context tokens moves them 0.2 mean
    # and 0.7 max, so these bounds tell rounding from a wrong cache. The ways a CPU may run
    # bf16: its own bf16 products (on a CPU with AMX, the decode steps' through its tiles), or
    # (where it would only emulate them) fp32 on upcasts.
    import dataclasses

    import lanefold.backends.engine._arith as arith
    from lanefold.backends.engine import _tiled_step
    from lanefold.backends.engine._tiles import Tiles
    from lanefold.backends.engine._weights import Checkpoint

    native = mode != "fp32-arithmetic"
    monkeypatch.setattr(arith, "native_half", lambda dtype: native)
    args = TINY
    measure = None
    if mode == "amx-tiles":
        if not (arith.packs(torch.bfloat16, torch.device("cpu")) and _tiled_step.ready()):
            pytest.skip("this CPU has no AMX tiles (or torch no oneDNN)")
        # every side a multiple of 32, heads of 32: the prompt's keys and values as tiles too
        args = dataclasses.replace(TINY, vocab_size=288, num_heads=2, num_kv_heads=1, head_dim=32)
        measure = Told(tiles_faster=True)
    # (with AMX, a pool roomy enough that the runner keeps the prompts, and so their tiles)
    blocks = 200 if mode == "amx-tiles" else 60
    engine = make_engine(block_size=4, num_blocks=blocks, dtype=torch.bfloat16, args=args, measure=measure)
    assert engine.runner._work == (torch.bfloat16 if native else torch.float32)
    if mode == "amx-tiles":
        model = engine.runner.model
        assert all(isinstance(c, Tiles) for w in model.layer_weights() for c in w.packed or ())
        assert model.head_packed is not None and isinstance(model.head_packed[2], Tiles)
    seen = record_steps(engine)
    arrive_mid_decode(engine)
    if mode == "amx-tiles":  # the K forks' steps took the whole-step call over the tiles
        assert engine.runner.model._tile_stack() is not None
    exact = tiny_checkpoint(0, args)
    rounded = Checkpoint(exact.args, {k: v.bfloat16().float() for k, v in exact.tensors.items()})
    assert len(seen) > 30
    for tokens, row in seen:
        assert row.dtype == torch.float32  # logits leave the model in fp32 for the sampler
        error = (row - reference_logits(rounded, tokens)[-1]).abs()
        assert error.max() < 0.25 and error.mean() < 0.05, (len(tokens), error.max(), error.mean())


def test_an_emulated_dtype_multiplies_several_rows_in_fp32_and_a_lone_row_in_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch.nn.functional as F

    import lanefold.backends.engine._arith as arith

    monkeypatch.setattr(arith, "native_half", lambda dtype: False)
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(64, 32, generator=g).bfloat16()
    rows = torch.randn(6, 32, generator=g).bfloat16()
    exact = F.linear(rows.float(), weight.float()).bfloat16()
    assert torch.equal(arith.linear(rows, weight), exact)
    # one or two rows go through `_products`, which accumulate in fp32 on any CPU
    torch.testing.assert_close(arith.linear(rows[:2], weight), exact[:2], atol=0.02, rtol=0.01)
    assert arith.compute_dtype(torch.bfloat16, torch.device("cpu")) == torch.float32
    assert arith.compute_dtype(torch.float32, torch.device("cpu")) == torch.float32
    assert arith.compute_dtype(torch.bfloat16, torch.device("meta")) == torch.bfloat16
    monkeypatch.setattr(arith, "native_half", lambda dtype: True)
    assert torch.equal(arith.linear(rows, weight), F.linear(rows, weight))


def test_a_bf16_model_on_a_native_bf16_cpu_multiplies_three_rows_and_more_by_packed_copies() -> None:
    import torch.nn.functional as F

    import lanefold.backends.engine._arith as arith
    from lanefold.backends.engine._model import build_model

    if not arith.packs(torch.bfloat16, torch.device("cpu")):
        pytest.skip("this CPU has no native bf16 (or torch no oneDNN): nothing is packed")
    model = build_model(tiny_checkpoint(), torch.device("cpu"), torch.bfloat16)
    weights = model.layer_weights()
    assert all(w.packed is not None for w in weights) and model.head_packed is not None
    g = torch.Generator().manual_seed(6)
    hidden = torch.randn(5, TINY.hidden_size, generator=g).bfloat16()
    for rows in (3, 5):  # oneDNN on its own layout gives torch's bf16 product, bit for bit
        w = weights[0]
        assert w.qkv is not None and w.packed is not None
        assert torch.equal(arith.linear(hidden[:rows], w.qkv, w.packed[0]), F.linear(hidden[:rows], w.qkv))
        expected = F.linear(hidden[:rows], model.lm_head.weight).float()
        assert torch.equal(model.logits(hidden[:rows]), expected)
    with torch.no_grad():  # written in place: the copies are stale and dropped, never read
        model.model.layers[1].mlp.down_proj.weight.mul_(2)
        model.lm_head.weight.mul_(2)
    weights = model.layer_weights()
    assert weights[1].packed is None and weights[0].packed is not None
    assert torch.equal(model.logits(hidden), F.linear(hidden, model.lm_head.weight).float())


def test_a_bf16_model_held_to_avx2_by_onednns_own_setting_keeps_no_packed_copies() -> None:
    """`ONEDNN_MAX_CPU_ISA=AVX2` (or an AVX2-only CPU) leaves oneDNN unable to pack bf16 while
    the CPU itself says it has native bf16: the model is built without copies (it raised in
    oneDNN's reorder before) and decodes several lanes through torch's products."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = (
        "import torch\n"
        "from tiny import tiny_checkpoint\n"
        "from lanefold.backends.engine._arith import onednn_bf16\n"
        "from lanefold.backends.engine._engine import Engine\n"
        "from lanefold.backends.engine._model import build_model\n"
        "from lanefold.primitives import LaneRequest, SamplingParams\n"
        "model = build_model(tiny_checkpoint(), torch.device('cpu'), torch.bfloat16)\n"
        "assert not onednn_bf16() and model.head_packed is None\n"
        "assert all(w.packed is None for w in model.layer_weights())\n"
        "params = SamplingParams(temperature=0.0, max_tokens=3)\n"
        "Engine(model, block_size=4, num_blocks=64).generate([1, 2, 3, 4, 5], params, "
        "[LaneRequest(i, i, 3) for i in range(4)])\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=99)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_lone_lanes_layers_in_one_compiled_call_match_full_recompute(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """A lone lane's decode step runs every layer in one compiled call (`lane_layers`: the
    products, its own attention over the lane, the K/V writes): fp32 logits as the full
    recompute's, bf16 within the rounding bounds of the bf16 test above."""
    pytest.importorskip("numba")
    import lanefold.backends.engine._model as model_module
    from lanefold.backends.engine._weights import Checkpoint

    taken: list[int] = []
    whole = model_module.lane_layers

    def counted(*args: object, **kwargs: object) -> torch.Tensor | None:
        made = whole(*args, **kwargs)  # type: ignore[arg-type]
        taken.append(made is not None)
        return made

    monkeypatch.setattr(model_module, "lane_layers", counted)
    # the loops, not torch's products (which a measurement picks where they read faster)
    engine = make_engine(block_size=4, dtype=dtype, measure=Told(torch_faster=False))
    assert engine.decode_paths().lone_lane == "loops"
    seen = record_steps(engine)
    engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=20), [LaneRequest(0, 0, 20)])
    assert len(taken) == 19 and all(taken)  # every decode step, none refused
    if dtype == torch.float32:
        assert_matches_reference(seen)
        return
    exact = tiny_checkpoint(0)
    rounded = Checkpoint(exact.args, {k: v.bfloat16().float() for k, v in exact.tensors.items()})
    for tokens, row in seen:
        error = (row - reference_logits(rounded, tokens)[-1]).abs()
        assert error.max() < 0.25 and error.mean() < 0.05, (len(tokens), error.max(), error.mean())


def test_a_lone_lane_over_amx_tiles_matches_its_layer_by_layer_step_and_the_reference(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU with AMX a bf16 lone lane's decode step reads the tiles too: every layer in one
    compiled call (`tiled_lane_layers`), where layer by layer it takes the staged calls. The two
    differ only in attention's arithmetic (the loop's against SDPA's, both fp32, where a bf16
    rounding may then flip), so their logits agree closer than the reference's rounding bounds;
    and both are within those."""
    import dataclasses

    import lanefold.backends.engine._arith as arith
    import lanefold.backends.engine._model as model_module
    from lanefold.backends.engine import _tiled_step
    from lanefold.backends.engine._weights import Checkpoint

    if not (arith.packs(torch.bfloat16, torch.device("cpu")) and _tiled_step.ready()):
        pytest.skip("this CPU has no AMX tiles (or torch no oneDNN)")
    args = dataclasses.replace(TINY, vocab_size=288, num_heads=2, num_kv_heads=1, head_dim=32)
    # the loops' one-call step is not what is tested here
    monkeypatch.setattr(model_module, "lane_layers", lambda *a, **k: None)
    fused = model_module.tiled_lane_layers
    runs = []
    for whole in (True, False):
        taken: list[bool] = []

        def counted(*a: object, whole: bool = whole, taken: list[bool] = taken, **k: object) -> object:
            made = fused(*a, **k) if whole else None  # type: ignore[arg-type]
            taken.append(made is not None)
            return made

        monkeypatch.setattr(model_module, "tiled_lane_layers", counted)
        engine = make_engine(block_size=4, dtype=torch.bfloat16, args=args, measure=Told(tiles_faster=True))
        assert engine.decode_paths().lone_lane == "tiles"
        assert engine.runner.model._tile_stack() is not None
        seen = record_steps(engine)
        engine.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=20), [LaneRequest(0, 0, 20)])
        assert len(taken) == 19 and all(taken) == whole  # every decode step, none refused
        runs.append(seen)
    exact = tiny_checkpoint(0, args)
    rounded = Checkpoint(exact.args, {k: v.bfloat16().float() for k, v in exact.tensors.items()})
    assert len(runs[0]) == len(runs[1]) == 20
    for (tokens, row), (other_tokens, other) in zip(*runs, strict=True):
        assert tokens == other_tokens
        apart = (row - other).abs()  # (0.06 max, 0.012 mean here; an attention 5% off: 0.16, 0.044)
        assert apart.max() < 0.1 and apart.mean() < 0.02, (len(tokens), apart.max(), apart.mean())
        error = (row - reference_logits(rounded, tokens)[-1]).abs()
        assert error.max() < 0.25 and error.mean() < 0.05, (len(tokens), error.max(), error.mean())


def test_the_forks_whole_step_over_amx_tiles_equals_the_layer_by_layer_step(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """K forks of one prompt on a CPU with AMX decode every layer in one compiled call
    (`tiled_layers`); layer by layer through the same tiles the logits are the same, bit for bit."""
    import dataclasses

    import lanefold.backends.engine._arith as arith
    import lanefold.backends.engine._model as model_module
    from lanefold.backends.engine import _tiled_step

    if not (arith.packs(torch.bfloat16, torch.device("cpu")) and _tiled_step.ready()):
        pytest.skip("this CPU has no AMX tiles (or torch no oneDNN)")
    args = dataclasses.replace(TINY, vocab_size=288, num_heads=2, num_kv_heads=1, head_dim=32)
    params = SamplingParams(temperature=1.0, max_tokens=6)
    lanes = [LaneRequest(i, 30 + i, 6) for i in range(5)]
    runs = []
    calls = {"whole": 0}
    whole = model_module.tiled_layers

    def counted(*a: object, **k: object) -> object:
        made = whole(*a, **k)  # type: ignore[arg-type]
        calls["whole"] += made is not None
        return made

    for fused in (True, False):
        monkeypatch.setattr(model_module, "tiled_layers", counted if fused else lambda *a, **k: None)
        engine = make_engine(
            block_size=4, num_blocks=200, dtype=torch.bfloat16, args=args, measure=Told(tiles_faster=True)
        )
        assert engine.decode_paths().forks == "tiles"
        seen = record_steps(engine)
        engine.generate(PROMPT, params, lanes)
        runs.append(seen)
    assert calls["whole"] >= 4  # every decode step after the first forks' prefill
    assert len(runs[0]) == len(runs[1])
    for (tokens, row), (other_tokens, other) in zip(*runs, strict=True):
        assert tokens == other_tokens
        assert torch.equal(row, other)
