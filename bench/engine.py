"""Benchmark: the bundled engine against Hugging Face generation, same weights, same prompts.

For each shape (prompt P tokens, K samples, T new tokens) it runs, interleaved, our engine
(prompt prefilled once, K forked branches), `generate(num_return_sequences=K)` and, where the
installed transformers has it, `generate_batch` (continuous batching), and prints each row with
HF generate beside it: tokens pushed through the model (counted by a forward hook, not assumed),
peak KV bytes, median wall time, and ratios measured in this run. fp32 on CPU by default;
`--dtype bfloat16` runs every system in bf16 and adds our engine in fp32 as a row of its own.
On SmolLM2, vLLM (offline `LLM.generate`, n = K, prefix caching, same weights, dtype and thread
count) is a row too, run in its own venv (`scripts/vllm_env.py` builds it) as a subprocess kept
loaded through the run, and each engine row's wall time is printed over vLLM's; without that
venv the row is skipped with a line saying so (`--no-vllm` skips it on purpose). On SmolLM2 the
`engine+schema` row is our engine with every lane held to a JSON schema (`SCHEMA`, one no lane
can finish within T, so the shapes match), and its wall time and its decode step are printed
over the plain engine row's, measured in the same run (`--no-grammar` skips it).

    python bench/engine.py            # SmolLM2-135M and a tiny random Llama, all shapes
    python bench/engine.py --quick    # the tiny Llama, small shapes, one quick pass
    python bench/engine.py --dtype bfloat16 --threads 2 --models smollm2 --shapes 512,8,32
    python bench/engine.py --load     # SmolLM2 loaded cold (dequantised) and warm (cached)
    python bench/engine.py --models smollm2 --shapes "512,8,32;512,1,32" --no-generate --no-vllm
                                      # the grammar row's cost at K = 8 and 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cpu import cpu_kind  # bench/_cpu.py: the flags that decide the kernels
from _engine_load import bench_load  # bench/_engine_load.py: the load rows (GGUF cache)
from _vllm_offline import VllmOffline  # bench/_vllm_offline.py: the vLLM row's subprocess

from lanefold.backends.engine import EngineConfig
from lanefold.backends.engine._engine import Engine, load_tokenizer
from lanefold.backends.engine._grammar import LaneGrammar
from lanefold.backends.engine._model import build_model
from lanefold.backends.engine._tokenizer import Tokenizer
from lanefold.backends.engine._weights import Checkpoint, ModelArgs, load_checkpoint, resolve_model_path
from lanefold.primitives import LaneRequest, SamplingParams

TINY = ModelArgs(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=768,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_dim=32,
    max_position=4096,
)
FULL_SHAPES = [(512, 8, 32), (512, 1, 32), (512, 16, 32), (128, 8, 128)]
QUICK_SHAPES = [(128, 8, 16), (128, 1, 16)]
TEMPERATURE = 0.8
# The grammar row's schema: a list of tool-call-like objects (keys, strings, integers, nesting),
# at least 1000 of them, so every lane is still inside its value after T tokens.
SCHEMA = (
    '{"type": "array", "minItems": 1000, "items": {"type": "object", "properties": '
    '{"name": {"type": "string"}, "arguments": {"type": "object", "properties": {"city": '
    '{"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"], '
    '"additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false}}'
)


@dataclass
class Run:
    """One system's measurements at one shape."""

    system: str
    walls: list[float]
    tokens: int = 0
    kv_bytes: int | None = None
    steps: list[float] | None = None  # our engine: each run's mean decode step, seconds
    masks: list[float] | None = None  # each run's token choosing per decode step (`GrammarClock`)


class GrammarClock:
    """The time the engine spends choosing tokens (`Engine._sample`: the grammar's masks filled,
    unpacked and applied there, for held lanes) and the matchers taking them, summed by wrapping
    those calls: the part of a step that a grammar adds to, told apart from the model's time,
    which a busy machine's noise swamps."""

    spent = 0.0

    @classmethod
    def install(cls) -> None:
        sample, advance = Engine._sample, LaneGrammar.advance

        def timed_sample(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return sample(*args)
            finally:
                cls.spent += time.perf_counter() - start

        def timed_advance(self: LaneGrammar, token: int) -> bool:
            start = time.perf_counter()
            try:
                return advance(self, token)
            finally:
                cls.spent += time.perf_counter() - start

        Engine._sample = staticmethod(timed_sample)  # type: ignore[method-assign]
        LaneGrammar.advance = timed_advance  # type: ignore[method-assign]


def tiny_checkpoint() -> Checkpoint:
    g = torch.Generator().manual_seed(0)
    with torch.device("meta"):
        from lanefold.backends.engine._model import CausalLM

        shapes = {k: v.shape for k, v in CausalLM(TINY).state_dict().items()}
    return Checkpoint(
        TINY,
        {
            k: (1 + 0.1 * torch.randn(s, generator=g)) if "norm" in k else 0.05 * torch.randn(s, generator=g)
            for k, s in shapes.items()
        },
    )


def hf_model(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, list[int]]:
    """`LlamaForCausalLM` holding the very same tensors, and a counter of tokens it computes."""
    import transformers

    a = checkpoint.args
    config = transformers.LlamaConfig(
        vocab_size=a.vocab_size,
        hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size,
        num_hidden_layers=a.num_layers,
        num_attention_heads=a.num_heads,
        num_key_value_heads=a.num_kv_heads,
        head_dim=a.head_dim,
        rope_theta=a.rope_theta,
        rms_norm_eps=a.rms_norm_eps,
        max_position_embeddings=a.max_position,
        tie_word_embeddings=a.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    missing, unexpected = model.load_state_dict(checkpoint.tensors, strict=False)
    model.to(dtype)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    counter = [0]

    def count(_module: object, args: tuple[object, ...], kwargs: dict[str, torch.Tensor]) -> None:
        ids = kwargs.get("input_ids")
        counter[0] += int((ids if ids is not None else kwargs["inputs_embeds"]).shape[:2].numel())

    model.model.register_forward_pre_hook(count, with_kwargs=True)
    return model, counter


def run_ours(
    engine: Engine,
    prompt: list[int],
    k: int,
    t: int,
    seed: int,
    system: str = "engine",
    schema: str | None = None,
) -> Run:
    """`engine.generate`, step by step, so the decode steps' time is told apart from the prefill's."""
    before = engine.metrics.tokens_computed
    engine.pool.peak_used = 0
    params = SamplingParams(temperature=TEMPERATURE, top_p=1.0, max_tokens=t, ignore_eos=True)
    start = time.perf_counter()
    lanes = [LaneRequest(i, seed * 100 + i, t) for i in range(k)]
    request = engine.add_request(prompt, params, lanes, schema=schema)
    decoding, steps, masks = 0.0, 0, 0.0
    while not request.finished:
        tick, decodes, spent = time.perf_counter(), engine.metrics.decode_steps, GrammarClock.spent
        engine.step()
        if engine.metrics.decode_steps > decodes:
            decoding, steps = decoding + time.perf_counter() - tick, steps + 1
            masks += GrammarClock.spent - spent
    wall = time.perf_counter() - start
    assert all(s.num_generated == t for s in request.sequences)
    return Run(
        system,
        [wall],
        engine.metrics.tokens_computed - before,
        engine.pool.peak_used * engine.runner.block_bytes,
        [decoding / max(1, steps)],
        [masks / max(1, steps)],
    )


def run_generate(model: torch.nn.Module, counter: list[int], prompt: list[int], k: int, t: int) -> Run:
    counter[0] = 0
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            do_sample=True,
            temperature=TEMPERATURE,
            top_k=0,
            top_p=1.0,
            max_new_tokens=t,
            min_new_tokens=t,
            num_return_sequences=k,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    wall = time.perf_counter() - start
    cache = out.past_key_values
    kv = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    return Run("hf generate", [wall], counter[0], kv)


def run_generate_batch(model: torch.nn.Module, counter: list[int], prompt: list[int], k: int, t: int) -> Run:
    from transformers import ContinuousBatchingConfig, GenerationConfig

    counter[0] = 0
    config = GenerationConfig(
        do_sample=True,
        temperature=TEMPERATURE,
        top_k=0,
        top_p=1.0,
        max_new_tokens=t,
        eos_token_id=None,
        pad_token_id=0,
    )
    # sized like our pool for this request; left to itself it sizes its cache for a GPU
    paged = ContinuousBatchingConfig(num_blocks=k * (-(-(len(prompt) + t) // 256)) + 4, max_batch_tokens=2048)
    start = time.perf_counter()
    model.generate_batch(
        inputs=[list(prompt) for _ in range(k)],
        generation_config=config,
        continuous_batching_config=paged,
        warmup=False,
    )
    return Run("hf generate_batch", [time.perf_counter() - start], counter[0])


def run_vllm(client: VllmOffline, prompt: list[int], k: int, t: int, seed: int) -> Run:
    """vLLM's `LLM.generate` with n = K on the same prompt, timed inside its own process."""
    answer = client.generate(prompt, k, t, seed)
    assert answer.tokens == k * t, f"vLLM generated {answer.tokens} tokens, not {k} x {t}"
    return Run("vllm", [answer.wall])


def print_vllm_ratios(runs: list[Run]) -> None:
    """Each engine row's median wall time over vLLM's, measured in this run (< 1: ours faster)."""
    theirs = next((r for r in runs if r.system == "vllm"), None)
    if theirs is None:
        return
    for r in runs:
        if r.system.startswith("engine"):
            ratio = statistics.median(r.walls) / statistics.median(theirs.walls)
            print(f"{'':<26} {r.system} / vllm wall = {ratio:.2f}")


def print_grammar_ratios(runs: list[Run]) -> None:
    """The schema row's median wall time and mean decode step over the plain engine row's,
    measured in this run (1.05: five per cent dearer), and what the grammar adds to choosing
    a step's tokens (`GrammarClock`) over the plain step."""
    plain = next((r for r in runs if r.system == "engine"), None)
    held = next((r for r in runs if r.system == "engine+schema"), None)
    if plain is None or held is None or not plain.steps or not held.steps or not held.masks:
        return
    wall = statistics.median(held.walls) / statistics.median(plain.walls)
    step = statistics.median(held.steps) / statistics.median(plain.steps)
    base, choosing = statistics.median(plain.steps), statistics.median(plain.masks or [0.0])
    added = statistics.median(held.masks) - choosing
    print(
        f"{'':<26} engine+schema / engine: wall = {wall:.3f}, decode step = {step:.3f} "
        f"({base * 1e3:.1f} -> {statistics.median(held.steps) * 1e3:.1f} ms); choosing tokens "
        f"{choosing * 1e3:.2f} -> {statistics.median(held.masks) * 1e3:.2f} ms a step, the grammar's "
        f"{added * 1e3:.2f} ms = {added / base:.1%} of the plain step"
    )


def start_vllm(args: argparse.Namespace, shapes: list[tuple[int, int, int]]) -> VllmOffline | None:
    """The vLLM row's process, loaded with the converted SmolLM2; None (and a line) without it."""
    # One context length for every shape, so vLLM's torch.compile cache (keyed by it) is reused.
    started = VllmOffline.start(args.dtype, args.threads, max(4096, *(p + t for p, _, t in shapes)))
    if isinstance(started, str):
        print(started)
        return None
    print(started.describe)
    return started


def bench_model(
    name: str,
    checkpoint: Checkpoint,
    shapes: list[tuple[int, int, int]],
    reps: int,
    with_batch: bool,
    dtype: torch.dtype = torch.float32,
    extra: list[tuple[str, Callable[[list[int], int, int, int], Run]]] | None = None,
    with_generate: bool = True,
    tokenizer: Tokenizer | None = None,
) -> list[tuple[str, tuple[int, int, int], list[Run]]]:
    blocks = 1024  # ample for every shape here; zeroed up front like any preallocated pool

    def warm_engine(model_dtype: torch.dtype, tokenizer: Tokenizer | None = None) -> Engine:
        engine = Engine(
            build_model(checkpoint, torch.device("cpu"), model_dtype),
            num_blocks=blocks,
            block_size=16,
            tokenizer=tokenizer,
        )
        if tokenizer is not None:  # the vocabulary's preparation and the compile, not timed
            engine.compile_schema(SCHEMA)
        warm = torch.Generator().manual_seed(99)
        prompt = torch.randint(1, checkpoint.args.vocab_size, (32,), generator=warm).tolist()
        run_ours(engine, prompt, 2, 2, 0, schema=None if tokenizer is None else SCHEMA)
        return engine

    engine = warm_engine(dtype)
    reference, counter = hf_model(checkpoint, dtype)
    systems: list[tuple[str, Callable[[list[int], int, int, int], Run]]] = [
        ("engine", lambda p, k, t, s: run_ours(engine, p, k, t, s)),
        ("hf generate", lambda p, k, t, s: run_generate(reference, counter, p, k, t)),
    ]
    if tokenizer is not None:  # an engine of its own (no prompt cached by the plain row's run)
        held = warm_engine(dtype, tokenizer)
        systems.insert(
            1, ("engine+schema", lambda p, k, t, s: run_ours(held, p, k, t, s, "engine+schema", SCHEMA))
        )
    if dtype != torch.float32:  # what the dtype buys our engine, measured in the same run
        fp32 = warm_engine(torch.float32)
        systems.insert(1, ("engine fp32", lambda p, k, t, s: run_ours(fp32, p, k, t, s, "engine fp32")))
    if with_batch and hasattr(reference, "generate_batch"):
        systems.append(
            (
                "hf generate_batch",
                lambda p, k, t, s: run_generate_batch(reference, counter, p, k, t),
            )
        )
    if not with_generate:  # --no-generate: HF's rows take longest by far at long prompts x K
        systems = [sys_ for sys_ in systems if not sys_[0].startswith("hf ")]
    systems += extra or []  # other engines (vLLM), interleaved with ours on the same prompts
    rows = []
    for index, (p, k, t) in enumerate(shapes):
        runs: dict[str, Run] = {}
        for rep in range(reps):  # interleaved, each rep with a fresh prompt (no prefix-cache reuse)
            # the shape's place in the list is in the seed: shapes alike but for T, or listed
            # twice, would otherwise share prompts and meet them in the prefix cache
            seed = 100_000_000 * index + 1000 * p + 10 * k + rep  # p < 100000, k < 100
            prompt = torch.randint(
                1, checkpoint.args.vocab_size, (p,), generator=torch.Generator().manual_seed(seed)
            ).tolist()
            for label, run in systems:
                result = run(prompt, k, t, rep)
                if label in runs:
                    runs[label].walls += result.walls
                else:
                    runs[label] = result
        rows.append((name, (p, k, t), list(runs.values())))
        print_rows([rows[-1]], header=len(rows) == 1)
    return rows


def print_rows(rows: list[tuple[str, tuple[int, int, int], list[Run]]], header: bool) -> None:
    if header:
        print(
            f"{'model':<13} {'P,K,T':<12} {'system':<18} {'wall s':>8} {'vs gen':>7} "
            f"{'tokens':>7} {'vs gen':>7} {'KV MiB':>8} {'vs gen':>7} {'tok/s':>7}"
        )
    for model, (p, k, t), runs in rows:
        # without HF generate (--no-generate), the 'vs gen' columns are against our engine row
        base = next((r for r in runs if r.system == "hf generate"), runs[0])
        base_wall = statistics.median(base.walls)
        for r in runs:
            wall = statistics.median(r.walls)
            kv = f"{r.kv_bytes / 2**20:8.2f}" if r.kv_bytes is not None else f"{'n/a':>8}"
            kv_ratio = f"{base.kv_bytes / r.kv_bytes:6.1f}x" if r.kv_bytes and base.kv_bytes else f"{'':>7}"
            shape = f"{p},{k},{t}"
            tokens = (
                f"{r.tokens:7d} {base.tokens / r.tokens:6.2f}x" if r.tokens else f"{'n/a':>7} {'':>7}"
            )  # vLLM computes in another process, uncounted
            print(
                f"{model:<13} {shape:<12} {r.system:<18} {wall:8.2f} {base_wall / wall:6.2f}x "
                f"{tokens} {kv} {kv_ratio} {k * t / wall:7.1f}"
            )
        print_vllm_ratios(runs)
        print_grammar_ratios(runs)
        sys.stdout.flush()


def parse_shape(text: str) -> tuple[int, int, int]:
    p, k, t = (int(n) for n in text.split(","))
    return p, k, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, small shapes, one rep")
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions per shape")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--models", default="smollm2,tiny", help="comma list of smollm2, tiny")
    parser.add_argument("--no-generate-batch", action="store_true", help="skip HF generate_batch")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM row (SmolLM2 only)")
    parser.add_argument(
        "--no-generate",
        action="store_true",
        help="skip HF generate (then 'vs gen' is against our engine row)",
    )
    parser.add_argument("--no-grammar", action="store_true", help="skip the engine+schema row (SmolLM2 only)")
    parser.add_argument("--load", action="store_true", help="only the load rows: cold vs warm (weight cache)")
    parser.add_argument(
        "--shapes", help="semicolon list of P,K,T (default: 512,8,32;512,1,32;512,16,32;128,8,128)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    GrammarClock.install()
    if args.load:
        return bench_load(args.reps, args.threads)
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    shapes, reps = (QUICK_SHAPES, 1) if args.quick else (FULL_SHAPES, args.reps)
    if args.shapes:
        shapes = [parse_shape(s) for s in args.shapes.split(";")]
    models = ["tiny"] if args.quick else args.models.split(",")
    print(cpu_kind())
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.get_num_threads()} threads, {args.dtype} CPU "
        f"({torch.backends.cpu.get_cpu_capability()}), median of {reps} interleaved runs; "
        "'vs gen' = HF generate / this row (higher is better)"
    )
    for name in models:
        checkpoint = (
            tiny_checkpoint() if name == "tiny" else load_checkpoint(resolve_model_path("smollm2-135m"))
        )
        # vLLM serves the SmolLM2 folder converted from the same GGUF; the tiny Llama has none.
        vllm = start_vllm(args, shapes) if name == "smollm2" and not args.no_vllm else None
        extra = [("vllm", lambda p, k, t, s, c=vllm: run_vllm(c, p, k, t, s))] if vllm else []
        try:
            bench_model(
                "tiny-llama" if name == "tiny" else "smollm2-135m",
                checkpoint,
                shapes,
                reps,
                with_batch=not args.no_generate_batch,
                dtype=getattr(torch, args.dtype),
                extra=extra,
                with_generate=not args.no_generate,
                tokenizer=None if name == "tiny" or args.no_grammar else load_tokenizer(EngineConfig()),
            )
        finally:
            if vllm is not None:
                vllm.close()


if __name__ == "__main__":
    main()
