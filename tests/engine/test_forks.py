"""Forked branches: greedy forks equal the prompt run alone; a seed fixes a branch's tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lanefold.backends.engine._engine import Engine
from lanefold.primitives import LaneRequest, SamplingParams

PROMPT = [(11 * i + 5) % 256 for i in range(29)]


def test_greedy_forked_branches_equal_the_prompt_run_alone(
    make_engine: Callable[..., Engine],
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=16)
    alone = make_engine().generate(PROMPT, params, [LaneRequest(0, 0, 16)])
    forked = make_engine().generate(PROMPT, params, [LaneRequest(i, i, 16) for i in range(8)])
    expected = alone.sequences[0].output_ids
    assert len(expected) == 16
    assert [s.output_ids for s in forked.sequences] == [expected] * 8


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_tokens=20),
        SamplingParams(temperature=0.7, top_k=20, max_tokens=20),
        SamplingParams(temperature=1.2, top_p=0.8, max_tokens=20),
    ],
)
def test_a_branch_yields_the_same_tokens_alone_or_beside_fifteen_others(
    make_engine: Callable[..., Engine], params: SamplingParams
) -> None:
    alone = make_engine(block_size=8).generate(PROMPT, params, [LaneRequest(3, 1234, 20)])
    crowd = [LaneRequest(i, 1234 if i == 3 else 500 + i, 20) for i in range(16)]
    beside = make_engine(block_size=8).generate(PROMPT, params, crowd)
    assert beside.sequences[3].output_ids == alone.sequences[0].output_ids
    assert len({tuple(s.output_ids) for s in beside.sequences}) > 8  # the others differ
    # another request decoding in the same batches does not change it either
    engine = make_engine(block_size=8)
    other = engine.add_request(PROMPT[::-1], params, [LaneRequest(0, 7, 20)])
    mine = engine.add_request(PROMPT, params, [LaneRequest(3, 1234, 20)])
    while not (other.finished and mine.finished):
        engine.step()
    assert mine.sequences[0].output_ids == alone.sequences[0].output_ids


def test_max_tokens_per_lane_and_stop_strings(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine()
    params = SamplingParams(temperature=1.0, max_tokens=30)
    lanes = [LaneRequest(0, 1, 3), LaneRequest(1, 2, 0), LaneRequest(2, 3, 30)]
    request = engine.generate(PROMPT, params, lanes)
    assert [s.num_generated for s in request.sequences] == [3, 0, 30]
    assert [s.finish_reason for s in request.sequences] == ["length"] * 3
    text = request.sequences[2].text
    stop = text[5:7]  # a stop string that the same seed is known to produce
    stopped = (
        make_engine()
        .generate(
            PROMPT,
            SamplingParams(temperature=1.0, max_tokens=30, stop=(stop,)),
            [LaneRequest(2, 3, 30)],
        )
        .sequences[0]
    )
    assert stopped.finish_reason == "stop"
    assert stopped.text == text[: text.find(stop)]
    assert stop not in stopped.text


def test_logprobs_are_the_model_log_probabilities(make_engine: Callable[..., Engine]) -> None:
    import torch
    from reference import reference_logits
    from tiny import tiny_checkpoint

    params = SamplingParams(temperature=0.9, max_tokens=8, logprobs=True)
    seq = make_engine().generate(PROMPT, params, [LaneRequest(0, 42, 8)]).sequences[0]
    logits = reference_logits(tiny_checkpoint(0), seq.tokens)
    expected = [
        float(torch.log_softmax(logits[len(PROMPT) - 1 + i], -1)[t]) for i, t in enumerate(seq.output_ids)
    ]
    assert seq.logprobs == pytest.approx(expected, abs=1e-4)
