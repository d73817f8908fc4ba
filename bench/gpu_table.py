"""One table on one device: our engine, HF generate and (where installed) vLLM, same weights.

SmolLM2-135M, one random-token prompt of P tokens per repetition, K samples of exactly T tokens,
temperature 0.8, interleaved repetitions, median wall time, ratios against HF generate measured
in the same run. Written for `bench/gpu_check.sh` on a CUDA machine; `--device cpu` runs the same
code here (without vLLM unless it is importable).

    python bench/gpu_table.py --device cuda --dtype bfloat16 --shape 2048,16,64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import TEMPERATURE, hf_model  # bench/engine.py: the same HF model and counter

from lanefold.backends.engine._engine import Engine
from lanefold.backends.engine._model import build_model
from lanefold.backends.engine._weights import Checkpoint, load_checkpoint, resolve_model_path
from lanefold.primitives import LaneRequest, SamplingParams


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ours(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Callable[..., float]:
    engine = Engine(build_model(checkpoint, device, dtype), num_blocks=4096, block_size=16)

    def run(prompt: list[int], k: int, t: int, seed: int) -> float:
        params = SamplingParams(temperature=TEMPERATURE, max_tokens=t, ignore_eos=True)
        start = time.perf_counter()
        request = engine.generate(prompt, params, [LaneRequest(i, seed * 100 + i, t) for i in range(k)])
        _sync(device)
        assert all(s.num_generated == t for s in request.sequences)
        return time.perf_counter() - start

    return run


def hf(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Callable[..., float]:
    model, _ = hf_model(checkpoint, dtype)
    model.to(device)

    def run(prompt: list[int], k: int, t: int, seed: int) -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model.generate(
                torch.tensor([prompt], device=device),
                do_sample=True,
                temperature=TEMPERATURE,
                top_k=0,
                top_p=1.0,
                max_new_tokens=t,
                min_new_tokens=t,
                num_return_sequences=k,
                pad_token_id=0,
            )
        _sync(device)
        return time.perf_counter() - start

    return run


def vllm(checkpoint: Checkpoint, dtype: str, folder: Path) -> Callable[..., float] | str:
    """vLLM's offline `LLM.generate` (n = K, prefix caching) over the same tensors, or why not."""
    try:
        from vllm import LLM
        from vllm import SamplingParams as VllmParams
    except ImportError as exc:
        return f"vllm: not importable here ({exc})"
    model, _ = hf_model(checkpoint, getattr(torch, dtype))
    model.save_pretrained(folder)  # the very tensors our engine holds, as an HF folder
    llm = LLM(
        model=str(folder),
        skip_tokenizer_init=True,
        dtype=dtype,
        enable_prefix_caching=True,
        gpu_memory_utilization=0.3,
        max_model_len=4096,
    )

    def run(prompt: list[int], k: int, t: int, seed: int) -> float:
        params = VllmParams(
            n=k,
            temperature=TEMPERATURE,
            max_tokens=t,
            min_tokens=t,
            ignore_eos=True,
            seed=seed,
            detokenize=False,
        )
        start = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        assert sum(len(c.token_ids) for c in out[0].outputs) == k * t
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--shape", default="2048,16,64", help="P,K,T")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    p, k, t = (int(n) for n in args.shape.split(","))
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    checkpoint = load_checkpoint(resolve_model_path("smollm2-135m"))
    systems: dict[str, Callable[..., float]] = {
        "engine": ours(checkpoint, device, dtype),
        "hf generate": hf(checkpoint, device, dtype),
    }
    notes = [
        f"torch {torch.__version__}, {args.device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_vllm:
            theirs = vllm(checkpoint, args.dtype, Path(tmp) / "smollm2")
            if isinstance(theirs, str):
                notes.append(theirs)
            else:
                systems["vllm"] = theirs
        warm = torch.randint(1, checkpoint.args.vocab_size, (64,)).tolist()
        for run in systems.values():
            run(warm, 2, 4, 0)
        walls: dict[str, list[float]] = {name: [] for name in systems}
        for rep in range(args.reps):
            prompt = torch.randint(
                1, checkpoint.args.vocab_size, (p,), generator=torch.Generator().manual_seed(rep)
            ).tolist()
            for name, run in systems.items():
                walls[name].append(run(prompt, k, t, rep))
    print("; ".join(notes))
    print(f"P,K,T = {p},{k},{t}, {args.dtype}, median of {args.reps} interleaved runs")
    base = statistics.median(walls["hf generate"])
    print(f"{'system':<14} {'wall s':>8} {'vs gen':>8} {'tok/s':>9}")
    for name, times in walls.items():
        wall = statistics.median(times)
        print(f"{name:<14} {wall:8.3f} {base / wall:7.2f}x {k * t / wall:9.1f}")


if __name__ == "__main__":
    main()
