"""Where the served path spends what the engine does not (issue 28's served target, our side).

One `n = 8` completion of about P = 500 prompt tokens and T = 32 output tokens (ignore_eos, so
every lane decodes T), SmolLM2-135M on the engine, fp32, one thread, measured three ways in
interleaved rounds, each request with a fresh prompt (a nonce first, so no prefix cache helps):

- engine: `sample_all` on the backend in this process (the request the server would make);
- app: the same request through `orchestrator serve`'s app in this process, by httpx's ASGI
  transport (no socket): the server's own work, JSON, checks, the response, the async hand-off
  between the engine's driver thread and the event loop;
- served: `orchestrator serve` in its own process over loopback, as a client sees it.

app - engine is the app's share; served - app is HTTP and the process boundary (uvicorn, TCP,
the server's threads contending with the client's). With `--busy`, the same again with a
`while True: pass` process holding one core. With `--vllm`, a fourth side in the same rounds:
vLLM's OpenAI server (the venv `scripts/vllm_env.py` builds, SmolLM2 converted from the same
GGUF, as many unbound OpenMP threads as ours, torch.compile on as vLLM starts by default) gets
the same request, and served / vLLM is the issue's served ratio (use `--dtype bfloat16`: the
converted model is bf16). Printed, never asserted.

    PYTHONPATH=. .venv/bin/python bench/served_split.py [--rounds 5] [--busy] [--threads 1]
        [--dtype float32|bfloat16] [--vllm]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx
from _cpu import cpu_kind  # bench/_cpu.py

from lanefold.backends.engine import EngineConfig
from lanefold.execution import build_backend
from lanefold.primitives import LaneRequest, SampleRequest, SamplingParams, sample_all
from lanefold.serve._app import create_app  # the app in-process, for the ASGI row

THREADS: int | None = 1  # --threads; None: the engine's default (the cores not busy elsewhere)
DTYPE = "float32"  # --dtype
SENTENCE = "The quick brown fox jumps over the lazy dog while the river keeps flowing. "
N, T = 8, 32


def prompt() -> str:
    return f"[{secrets.token_hex(8)}] " + SENTENCE * 33  # about 500 tokens


def body() -> dict[str, object]:
    return {
        "model": "smollm2-135m",
        "prompt": prompt(),
        "n": N,
        "max_tokens": T,
        "ignore_eos": True,
        "seed": 1,
    }


async def measure(rounds: int, url: str, vllm_url: str | None) -> dict[str, list[float]]:
    backend = build_backend(EngineConfig(model="smollm2-135m", device="cpu", dtype=DTYPE, threads=THREADS))
    await backend.load()  # type: ignore[attr-defined]
    app = create_app(backend, model_name=backend.name)
    times: dict[str, list[float]] = {"engine": [], "app": [], "served": []}
    params = SamplingParams(temperature=0.8, max_tokens=T, ignore_eos=True)
    async with (
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://app/v1", timeout=600
        ) as local,
        httpx.AsyncClient(base_url=url, timeout=600) as remote,
        httpx.AsyncClient(base_url=vllm_url or url, timeout=600) as peer,
    ):

        async def engine() -> None:
            lanes = tuple(LaneRequest(i, 1 + i, T) for i in range(N))
            await sample_all(backend, SampleRequest(prompt(), params, lanes, share_prefix=True))

        async def in_app() -> None:
            (await local.post("/completions", json=body())).raise_for_status()

        async def served() -> None:
            (await remote.post("/completions", json=body())).raise_for_status()

        async def vllm() -> None:
            (await peer.post("/completions", json=body())).raise_for_status()

        sides = {"engine": engine, "app": in_app, "served": served}
        if vllm_url is not None:
            sides["vllm"] = vllm
            times["vllm"] = []
        for side in sides.values():  # warm each once
            await side()
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                start = time.perf_counter()
                await sides[name]()
                times[name].append(time.perf_counter() - start)
    await backend.aclose()
    return times


def serve(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    threads = "" if THREADS is None else f"threads = {THREADS}\n"
    (folder / "engine.toml").write_text(
        f'[backend]\nkind = "engine"\nmodel = "smollm2-135m"\ndevice = "cpu"\ndtype = "{DTYPE}"\n{threads}'
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "lanefold", "serve", "--backend-config", "engine.toml", "--port", str(port)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"{url}/models", timeout=1).raise_for_status()
            return process, url
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start") from None
            time.sleep(0.1)


def report(label: str, times: dict[str, list[float]]) -> None:
    m = {k: statistics.median(v) for k, v in times.items()}
    print(f"| {label} | {m['engine']:.2f} | {m['app']:.2f} | {m['served']:.2f} ", end="")
    print(
        f"| {m['app'] - m['engine']:+.2f} ({(m['app'] - m['engine']) / m['served']:.0%}) "
        f"| {m['served'] - m['app']:+.2f} ({(m['served'] - m['app']) / m['served']:.0%}) "
        f"| {m['served'] / m['engine']:.2f}x |",
        end="",
    )
    print(f" {m['vllm']:.2f} | **{m['served'] / m['vllm']:.2f}** |" if "vllm" in m else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--busy", action="store_true", help="again with one core kept busy")
    parser.add_argument("--threads", default="1", help="the engine's threads, or 'default' (left unset)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--vllm", action="store_true", help="time vLLM's OpenAI server in the same rounds")
    args = parser.parse_args()
    global THREADS, DTYPE
    THREADS = None if args.threads == "default" else int(args.threads)
    DTYPE = args.dtype
    print(cpu_kind())
    print(
        f"{len(os.sched_getaffinity(0))} cores, load {os.getloadavg()[0]:.2f}; n = {N}, P ~ 500, T = {T}, "
        f"{DTYPE}, threads {args.threads}"
    )
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        vllm_url = None
        if args.vllm:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
            import servers  # scripts/servers.py: builds, caches and starts the servers

            threads = THREADS or len(os.sched_getaffinity(0))
            server = stack.enter_context(
                servers.started("vllm", log_dir=Path(tmp) / "logs", slots=N, threads=threads, ready_s=900)
            )
            vllm_url = server.base_url
            print(f"vLLM's server: {threads} unbound OpenMP thread(s), bf16 (log: {server.log})")
        vllm_cols = " vllm served s | served / vllm |" if args.vllm else ""
        head = "| machine | engine s | app s | served s | app - engine | served - app | served / engine |"
        print(head + vllm_cols)
        print("|---|---|---|---|---|---|---|" + ("---|---|" if args.vllm else ""))
        process, url = serve(Path(tmp))
        try:
            report("quiet", anyio.run(measure, args.rounds, url, vllm_url))
            if args.busy:
                spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                try:
                    time.sleep(1)
                    report("one core busy", anyio.run(measure, args.rounds, url, vllm_url))
                finally:
                    spin.kill()
                    spin.wait()
        finally:
            process.terminate()
            process.wait(20)


if __name__ == "__main__":
    main()
