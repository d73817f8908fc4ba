"""A wave's fingerprint is what resume checks a recorded wave against: a sampling setting
added later (`top_logprobs`) is left out at its default, so logs recorded before it still
resume, and counts where it is set."""

from __future__ import annotations

import dataclasses

from lanefold.primitives import SamplingParams
from lanefold.primitives._context import wave_fingerprint
from lanefold.primitives._dispatch import LaneJob

PARAMS = SamplingParams(temperature=0.7, max_tokens=64, logprobs=True)


def fingerprint(params: SamplingParams) -> str:
    jobs = [LaneJob(0, "What is 2+2?"), LaneJob(1, "What is 2+2?")]
    return wave_fingerprint(
        "sample", "sample", jobs, params, quorum=1, share_prefix=True, extract=None, backend="simulated"
    )


def test_a_wave_recorded_before_top_logprobs_keeps_its_fingerprint() -> None:
    # The value this wave had before SamplingParams had `top_logprobs` (commit 4706507).
    assert fingerprint(PARAMS) == ("sha256:d4e5590349d68e4b0056da26ae40d057ffbfe566bb14502e8c20e7a87eb60ebd")


def test_asking_for_alternatives_is_another_wave() -> None:
    assert fingerprint(dataclasses.replace(PARAMS, top_logprobs=3)) != fingerprint(PARAMS)
