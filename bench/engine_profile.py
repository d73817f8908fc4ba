"""Where the engine's time goes: one request's prefill and decode steps, split by part.

Wraps the engine's parts with timers (no change to the engine): the batch's tensors built on the
host, the model's layers (matrix products, norms, RoPE), attention, the LM head, sampling, and
the rest of the step (scheduling, block tables, copies, the per-lane bookkeeping, stop strings).
Times are the thread's CPU time (torch runs its one thread's work on the calling thread, and a
machine shared with other work inflates wall time but not this); medians over `--reps`
requests, fresh prompts. Copied into an older checkout's bench/ it profiles that checkout.

    python bench/engine_profile.py --dtype float32 --shape 512,8,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lanefold.backends.engine._model as model_module
from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._model import build_model
from lanefold.backends.engine._weights import load_checkpoint, resolve_model_path
from lanefold.primitives import LaneRequest, SamplingParams

PARTS = ("batch tensors", "layers", "attention", "LM head", "sampling", "rest of step")


def timed(spent: dict[str, float], part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.thread_time() - start

    return wrapper


def instrument(engine: Engine, spent: dict[str, float]) -> None:
    runner, model = engine.runner, engine.runner.model
    runner._batch = timed(spent, "batch tensors", runner._batch)  # type: ignore[method-assign]
    model.forward = timed(spent, "model", model.forward)  # type: ignore[method-assign]
    model.logits = timed(spent, "LM head", model.logits)  # type: ignore[method-assign]
    if hasattr(engine, "_sample"):  # batched sampling
        engine._sample = timed(spent, "sampling", engine._sample)  # type: ignore[method-assign]
    else:  # a checkout from before it: a Python call per lane
        import lanefold.backends.engine._engine as engine_module

        sampler = engine_module.sample_token  # type: ignore[attr-defined]
        engine_module.sample_token = timed(spent, "sampling", sampler)  # type: ignore[attr-defined]
    for name in ("paged_attention", "causal_attention"):
        if hasattr(model_module, name):
            setattr(model_module, name, timed(spent, "attention", getattr(model_module, name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--shape", default="512,8,32", help="P,K,T")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # CPU time of the calling thread is all of the work
    p, k, t = (int(n) for n in args.shape.split(","))
    checkpoint = load_checkpoint(resolve_model_path("smollm2-135m"))
    engine = Engine(
        build_model(checkpoint, torch.device("cpu"), getattr(torch, args.dtype)),
        num_blocks=1024,
    )
    spent: dict[str, float] = defaultdict(float)
    instrument(engine, spent)
    params = SamplingParams(temperature=0.8, max_tokens=t, ignore_eos=True)
    engine.generate(list(range(1, 65)), params, [LaneRequest(0, 0, 2)])  # warm
    table: dict[str, dict[str, list[float]]] = {"prefill": defaultdict(list), "decode": {}}
    table["decode"] = defaultdict(list)
    for rep in range(args.reps):
        prompt = torch.randint(
            1, checkpoint.args.vocab_size, (p,), generator=torch.Generator().manual_seed(rep)
        ).tolist()
        request = engine.add_request(prompt, params, [LaneRequest(i, i, t) for i in range(k)])
        kind, steps = "prefill", 0
        while not request.finished:
            spent.clear()
            start = time.thread_time()
            engine.step()
            wall = time.thread_time() - start
            inside = spent["model"] - spent["attention"]
            parts = {
                "batch tensors": spent["batch tensors"],
                "layers": inside,
                "attention": spent["attention"],
                "LM head": spent["LM head"],
                "sampling": spent["sampling"],
            }
            parts["rest of step"] = wall - sum(parts.values())
            parts["step"] = wall
            for name, value in parts.items():
                table[kind][name].append(value)
            kind, steps = "decode", steps + 1
    print(
        f"torch {torch.__version__}, {args.dtype}, 1 thread, thread CPU time, "
        f"P,K,T = {p},{k},{t}, medians over {args.reps} requests"
    )
    print(f"{'part':<14} {'prefill ms':>11} {'share':>6} {'decode ms/step':>15} {'share':>6}")
    pre, dec = table["prefill"], table["decode"]
    pre_step, dec_step = statistics.median(pre["step"]), statistics.median(dec["step"])
    for name in (*PARTS, "step"):
        a, b = statistics.median(pre[name]), statistics.median(dec[name])
        print(f"{name:<14} {1000 * a:11.1f} {a / pre_step:6.0%} {1000 * b:15.1f} {b / dec_step:6.0%}")
    print(f"request: prefill {pre_step:.2f} s + {t - 1} decode steps x {dec_step:.3f} s")


if __name__ == "__main__":
    main()
