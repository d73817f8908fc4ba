"""The engine on every device at hand: exact against the reference, seeds independent of the batch.

CUDA cases are skipped where torch sees no CUDA device (`bench/gpu_check.sh` runs them on one).
"""

from __future__ import annotations

import pytest
import torch
from reference import reference_logits
from test_exactness import ATOL, record_steps
from tiny import byte_tokenizer, tiny_checkpoint

from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._model import build_model
from lanefold.primitives import LaneRequest, SamplingParams

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
    ),
]
PROMPT = [(7 * i + 3) % 256 for i in range(37)]


def engine_on(device: str, block_size: int = 8) -> Engine:
    model = build_model(tiny_checkpoint(0), torch.device(device), torch.float32)
    return Engine(model, num_blocks=128, block_size=block_size, tokenizer=byte_tokenizer())


@pytest.mark.parametrize("device", DEVICES)
def test_forked_lanes_match_the_reference_on_the_device(device: str) -> None:
    engine = engine_on(device)
    seen = record_steps(engine)
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=10, logprobs=True)
    request = engine.generate(PROMPT, params, [LaneRequest(i, 40 + i, 10) for i in range(4)])
    assert all(s.num_generated == 10 for s in request.sequences)
    checkpoint = tiny_checkpoint(0)
    for tokens, row in seen:
        assert row.device.type == device
        expected = reference_logits(checkpoint, tokens)[-1]
        torch.testing.assert_close(row.cpu(), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_a_lane_draws_the_same_tokens_alone_or_in_a_crowd_on_the_device(device: str) -> None:
    params = SamplingParams(temperature=0.8, top_k=30, max_tokens=16, stop=("zz",))
    alone = engine_on(device).generate(PROMPT, params, [LaneRequest(5, 99, 16)]).sequences[0]
    crowd = [LaneRequest(i, 99 if i == 5 else i, 16) for i in range(12)]
    beside = engine_on(device).generate(PROMPT, params, crowd).sequences[5]
    assert beside.output_ids == alone.output_ids
    assert beside.text == alone.text
