"""The sampler draws from the distribution it is asked for, a lane's draws depend on nothing but
its seed, position and logits, and stop strings are found in text grown a token at a time."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny import byte_tokenizer

from lanefold.backends.engine._output_text import OutputText
from lanefold.backends.engine._sampler import (
    SamplingBatch,
    find_stop,
    lane_key,
    sample,
    sample_token,
    sample_with_alternatives,
)
from lanefold.primitives import SamplingParams

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def frequencies(params: SamplingParams, draws: int = 4000) -> torch.Tensor:
    """Token frequencies of `draws` lanes with consecutive seeds (as lanes get them), one batch."""
    seeds = range(draws)
    batch = SamplingBatch.build(
        [params] * draws, [lane_key(s) for s in seeds], [0] * draws, torch.device("cpu")
    )
    tokens, _ = sample(LOGITS.expand(draws, -1), batch)
    assert tokens[:50].tolist() == [sample_token(LOGITS, params, s)[0] for s in range(50)]
    return torch.bincount(tokens, minlength=len(LOGITS)).float() / draws


def test_temperature_sampling_matches_the_softmax() -> None:
    expected = torch.softmax(LOGITS / 0.8, 0)
    torch.testing.assert_close(frequencies(SamplingParams(temperature=0.8)), expected, atol=0.025, rtol=0)


def test_one_lane_along_its_positions_also_draws_from_the_softmax() -> None:
    params = SamplingParams(temperature=1.0)
    batch = SamplingBatch.build([params] * 4000, [lane_key(7)] * 4000, list(range(4000)), torch.device("cpu"))
    tokens, _ = sample(LOGITS.expand(4000, -1), batch)
    got = torch.bincount(tokens, minlength=len(LOGITS)).float() / 4000
    torch.testing.assert_close(got, torch.softmax(LOGITS, 0), atol=0.025, rtol=0)


def test_top_k_and_top_p_renormalise_over_the_kept_tokens() -> None:
    top2 = torch.softmax(LOGITS[:2], 0)
    got = frequencies(SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(got[:2], top2, atol=0.025, rtol=0)
    assert got[2:].sum() == 0
    probs = torch.softmax(LOGITS, 0)  # [0.56, 0.21, 0.13, ...]: top_p 0.85 keeps three tokens
    got = frequencies(SamplingParams(temperature=1.0, top_p=0.85))
    torch.testing.assert_close(got[:3], probs[:3] / probs[:3].sum(), atol=0.025, rtol=0)
    assert got[3:].sum() == 0
    # both: top-k 4 first, then top-p 0.75 of the renormalised four ([.58, .21, ...]) keeps two
    got = frequencies(SamplingParams(temperature=1.0, top_k=4, top_p=0.75))
    torch.testing.assert_close(got[:2], top2, atol=0.025, rtol=0)
    assert got[2:].sum() == 0


def test_greedy_and_logprobs() -> None:
    token, logprob = sample_token(LOGITS, SamplingParams(temperature=0.0, logprobs=True), 0)
    assert token == 0
    assert logprob == pytest.approx(float(torch.log_softmax(LOGITS, 0)[0]))


MIXED = [
    SamplingParams(temperature=0.0, logprobs=True),
    SamplingParams(temperature=0.7, top_k=20),
    SamplingParams(temperature=1.2, top_p=0.8),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.9, top_k=5, top_p=0.5, logprobs=True),
]


def test_a_row_draws_the_same_token_alone_in_any_batch_in_any_order() -> None:
    logits = torch.randn(len(MIXED), 300, generator=torch.Generator().manual_seed(0)) * 3
    seeds, positions = [11, 12, 13, 14, 15], [0, 3, 3, 9, 1]
    alone = [sample_token(row, p, s, n) for row, p, s, n in zip(logits, MIXED, seeds, positions, strict=True)]
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1], [3, 1]):
        batch = SamplingBatch.build(
            [MIXED[i] for i in order],
            [lane_key(seeds[i]) for i in order],
            [positions[i] for i in order],
            torch.device("cpu"),
        )
        tokens, logprobs = sample(logits[order], batch)
        assert tokens.tolist() == [alone[i][0] for i in order]
        assert (logprobs is not None) == any(MIXED[i].logprobs for i in order)
        for i, lp in zip(order, [] if logprobs is None else logprobs.tolist(), strict=False):
            if MIXED[i].logprobs:
                assert lp == pytest.approx(alone[i][1], abs=1e-6)
    assert alone[0][0] == int(logits[0].argmax())


def test_different_seeds_and_positions_draw_differently() -> None:
    row = torch.zeros(1000)  # uniform: any pattern in the draws is the noise's own
    params = SamplingParams(temperature=1.0)
    by_seed = {sample_token(row, params, s)[0] for s in range(200)}
    by_position = {sample_token(row, params, 5, n)[0] for n in range(200)}
    assert len(by_seed) > 150 and len(by_position) > 150


def test_find_stop_returns_the_earliest_stop() -> None:
    assert find_stop("abc\n\nQuestion", ("Question", "\n\n")) == 3
    assert find_stop("abc", ("x",)) is None
    assert find_stop("xx-xx", ("xx",), start=1) == 3


def test_text_grown_a_token_at_a_time_is_the_whole_decode_and_finds_stops_as_it_would() -> None:
    tokenizer = byte_tokenizer()
    text = "Héllo 👋 wörld, stop: ÆND! and more 日本語 text after the end"
    ids = tokenizer.encode(text)  # one id a byte: multi-byte characters span several ids
    stops = ("ÆND", "👋 w", "never")
    grown, found, first = OutputText(), None, None
    for n in range(1, len(ids) + 1):
        new = grown.extend(tokenizer, ids[:n])
        whole = tokenizer.decode(ids[:n])
        assert whole.startswith(grown.text)
        assert grown.text == whole.rstrip("\ufffd")
        cut = grown.stop_at(new, stops)
        if cut is not None and found is None:
            found, first = cut, find_stop(whole, stops)
    assert grown.text == text
    assert found == first == text.find("👋 w")


def test_alternatives_are_the_top_of_the_distribution_the_logprob_comes_from() -> None:
    logits = torch.randn(len(MIXED), 300, generator=torch.Generator().manual_seed(1)) * 3
    asked = [
        dataclasses.replace(p, logprobs=True, top_logprobs=n)
        for p, n in zip(MIXED, [5, 1, 20, 3, 2], strict=True)
    ]
    keys, positions = [lane_key(s) for s in range(5)], [0, 1, 2, 3, 4]
    batch = SamplingBatch.build(asked, keys, positions, torch.device("cpu"))
    assert batch.top_logprobs == 20
    tokens, logprobs, values, ids = sample_with_alternatives(logits, batch)
    plain, plain_logprobs = sample(logits, batch)
    assert tokens.tolist() == plain.tolist()  # asking for alternatives changes no draw
    assert plain_logprobs is not None
    torch.testing.assert_close(logprobs, plain_logprobs)
    every = torch.log_softmax(logits, dim=1)  # the model's own distribution, as the logprob
    assert values.shape == ids.shape == (5, 20)
    torch.testing.assert_close(values, every.gather(1, ids))
    assert (values[:, :-1] >= values[:, 1:]).all()  # most likely first
    torch.testing.assert_close(values[:, 0], every.max(dim=1).values)
    assert ids[0, 0] == tokens[0]  # greedy: the sampled token is the likeliest
    assert (logprobs <= values[:, 0] + 1e-6).all()


def test_a_batch_without_alternatives_asks_for_no_top_k() -> None:
    batch = SamplingBatch.build(MIXED, [lane_key(s) for s in range(5)], [0] * 5, torch.device("cpu"))
    assert batch.top_logprobs == 0
    unasked = SamplingParams(top_logprobs=5)  # without logprobs, alternatives are not asked for
    assert SamplingBatch.build([unasked], [1], [0], torch.device("cpu")).top_logprobs == 0
