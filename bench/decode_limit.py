"""The K = 1 decode step against its physical limit (issue 28).

A batch-1 decode step reads every weight once, plus the lane's KV cache: its floor is those
bytes over the memory bandwidth one thread gets. Both are measured here, in this process, one
thread:

- bandwidth: the best of several `sum` passes over a 512 MiB fp32 tensor (bytes read / time),
  the same kind of streaming read a matrix-vector product does, in torch's own memory (4 KiB
  pages) and on huge pages (an `Arena`, as the engine keeps its weights): the faster counts;
- bytes: every parameter once (a tied embedding is the LM head's read), and the KV cache of
  the step's context (K and V, every layer);
- the step: SmolLM2-135M on the engine, P = 512, K = 1, the median wall time of T - 1 decode
  steps over `--reps` requests (the prefill step left out).

It prints the ratio step / floor; the target is at most 1.5x. Printed, never asserted.

    PYTHONPATH=. .venv/bin/python bench/decode_limit.py [--dtype float32|bfloat16] [--reps 3] [--threads 1]

With `--threads 2` the step runs on two threads (where torch's threaded products then read
faster, the engine takes them); the floor stays one thread's bandwidth, as the target says.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _cpu import cpu_kind  # bench/_cpu.py

from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._memory import Arena
from lanefold.backends.engine._model import build_model
from lanefold.backends.engine._products import small_linear
from lanefold.backends.engine._weights import load_checkpoint, resolve_model_path
from lanefold.primitives import LaneRequest, SamplingParams


def bandwidth(reps: int = 7) -> tuple[float, float]:
    """Bytes a second one thread reads streaming through a tensor far larger than the caches:
    in torch's own memory (4 KiB pages) and in an `Arena` (huge pages, where the engine keeps
    the weights)."""
    plain = torch.ones(128 << 20, dtype=torch.float32)  # 512 MiB
    arena = Arena(plain.numel() * 4, torch.float32, torch.device("cpu"))
    huge = arena.empty(plain.shape).fill_(1.0)
    best = [0.0, 0.0]
    for i, data in enumerate((plain, huge)):
        data.sum()  # touch every page once
        for _ in range(reps):
            start = time.perf_counter()
            data.sum()
            best[i] = max(best[i], data.numel() * data.element_size() / (time.perf_counter() - start))
    return best[0], best[1]


def mv_bandwidth(dtype: torch.dtype, reps: int = 7) -> tuple[float, float]:
    """Bytes a second a one-row product reads from a 65536 x 2048 matrix (as the LM head's and
    the MLP's products do): torch's `mv`, and the engine's own loop (`_products`)."""
    matrix = torch.ones(65536, 2048, dtype=dtype)
    vector = torch.ones(2048, dtype=dtype)
    best = [0.0, 0.0]
    for i, product in enumerate(
        (lambda: torch.mv(matrix, vector), lambda: small_linear(vector[None], matrix))
    ):
        product()
        for _ in range(reps):
            start = time.perf_counter()
            product()
            best[i] = max(best[i], matrix.numel() * matrix.element_size() / (time.perf_counter() - start))
    return best[0], best[1]


def weight_bytes(model: torch.nn.Module) -> int:
    """Every parameter's bytes once (a tied embedding is the LM head's read; the engine keeps
    all of them in one arena, so storages cannot tell them apart: their addresses do)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if not tensor.is_mkldnn:  # packed for oneDNN (bf16 on a CPU with native bf16): no address
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
        total += tensor.numel() * tensor.element_size()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads for the step (the floor stays one thread's)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    checkpoint = load_checkpoint(resolve_model_path("smollm2-135m"))
    model = build_model(checkpoint, torch.device("cpu"), dtype)
    engine = Engine(model, num_blocks=1024)
    a = checkpoint.args
    weights = weight_bytes(model)
    context = args.prompt_tokens + args.output_tokens // 2  # the step's mean context
    kv = 2 * a.num_layers * context * a.num_kv_heads * a.head_dim * torch.finfo(dtype).bits // 8
    params = SamplingParams(temperature=0.8, max_tokens=args.output_tokens, ignore_eos=True)
    engine.generate(list(range(1, 65)), params, [LaneRequest(0, 0, 4)])  # warm
    steps: list[float] = []
    for rep in range(args.reps):
        prompt = torch.randint(
            1, a.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(rep)
        ).tolist()
        request = engine.add_request(prompt, params, [LaneRequest(0, rep, args.output_tokens)])
        first = True
        while not request.finished:
            start = time.perf_counter()
            engine.step()
            if not first:
                steps.append(time.perf_counter() - start)
            first = False
    torch.set_num_threads(1)
    small_pages, huge_pages = bandwidth()
    read = max(small_pages, huge_pages)  # the floor: the fastest this thread reads at all
    mv, kernel = mv_bandwidth(dtype)
    step = statistics.median(steps)
    floor = (weights + kv) / read
    ratio = step / floor
    print(f"{cpu_kind()}; torch {torch.__version__}, {args.dtype}, the step on {args.threads} thread(s)")
    print(
        f"one-thread read bandwidth: {read / 1e9:.1f} GB/s (best of 7 sums over 512 MiB: 4 KiB pages "
        f"{small_pages / 1e9:.1f}, huge pages {huge_pages / 1e9:.1f}); a one-row "
        f"product over a {args.dtype} 65536 x 2048 matrix reads at {mv / 1e9:.1f} GB/s (torch.mv), "
        f"{kernel / 1e9:.1f} GB/s (the engine's loop)"
    )
    print(
        f"bytes a step reads: weights {weights / 1e6:.0f} MB + KV {kv / 1e6:.1f} MB "
        f"(context {context}) -> floor {1000 * floor:.1f} ms"
    )
    print(
        f"K = 1 decode step, P = {args.prompt_tokens}: {1000 * step:.1f} ms (median of {len(steps)}) -> "
        f"**{ratio:.2f}x** the floor, target 1.5x: {'PASS' if ratio <= 1.5 else 'MISS'}"
    )
    print(
        f"the same bytes at torch.mv's rate: {1000 * (weights + kv) / mv:.1f} ms; "
        f"at the engine loop's: {1000 * (weights + kv) / kernel:.1f} ms"
    )


if __name__ == "__main__":
    main()
