"""The sampler draws from the distribution it is asked for."""

from __future__ import annotations

import pytest
import torch

from backends.engine._sampler import find_stop, new_generator, sample_token
from primitives import SamplingParams

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def frequencies(params: SamplingParams, draws: int = 4000) -> torch.Tensor:
    counts = torch.zeros(len(LOGITS))
    for seed in range(draws):  # consecutive seeds, as lanes get them
        token, _ = sample_token(LOGITS, params, new_generator(seed))
        counts[token] += 1
    return counts / draws


def test_temperature_sampling_matches_the_softmax() -> None:
    expected = torch.softmax(LOGITS / 0.8, 0)
    torch.testing.assert_close(
        frequencies(SamplingParams(temperature=0.8)), expected, atol=0.025, rtol=0
    )


def test_top_k_and_top_p_renormalise_over_the_kept_tokens() -> None:
    top2 = torch.softmax(LOGITS[:2], 0)
    got = frequencies(SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(got[:2], top2, atol=0.025, rtol=0)
    assert got[2:].sum() == 0
    probs = torch.softmax(LOGITS, 0)  # [0.56, 0.21, 0.13, ...]: top_p 0.85 keeps three tokens
    got = frequencies(SamplingParams(temperature=1.0, top_p=0.85))
    torch.testing.assert_close(got[:3], probs[:3] / probs[:3].sum(), atol=0.025, rtol=0)
    assert got[3:].sum() == 0


def test_greedy_and_logprobs() -> None:
    token, logprob = sample_token(
        LOGITS, SamplingParams(temperature=0.0, logprobs=True), new_generator(0)
    )
    assert token == 0
    assert logprob == pytest.approx(float(torch.log_softmax(LOGITS, 0)[0]))


def test_find_stop_returns_the_earliest_stop() -> None:
    assert find_stop("abc\n\nQuestion", ("Question", "\n\n")) == 3
    assert find_stop("abc", ("x",)) is None
