"""What the engine says of this machine for `orchestrator doctor`: the CPU and the features that
decide its kernels, the libraries it runs on, the decode paths it would take for the configured
model (the choice a load makes, and keeps), and what its cache folder holds.

Reading the model's architecture takes milliseconds where the weight cache has the model (its
metadata alone) and a few seconds where only the GGUF is there (its header is parsed); choosing
the paths loads the compiled kernels (tenths of a second; compiling them, once a machine,
takes tens of seconds) and runs the trials no earlier load kept (tens of milliseconds each).
Each is timed in the report.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import torch

from lanefold.backends.engine import _tiles
from lanefold.backends.engine._cache_folder import cache_dir
from lanefold.backends.engine._compiled import numba_cache_dir, numba_version
from lanefold.backends.engine._config import EngineConfig
from lanefold.backends.engine._decode_paths import Shape, choose_paths, paths_dir
from lanefold.backends.engine._engine import _device, _dtype, default_threads
from lanefold.backends.engine._machine import machine
from lanefold.backends.engine._weight_cache import cached_args
from lanefold.backends.engine._weights import (
    ModelArgs,
    gguf_args,
    hf_args,
    open_gguf,
    reading_model,
    resolve_model_path,
)

__all__ = ("diagnose",)


def diagnose(config: EngineConfig) -> dict[str, Any]:
    """The engine's part of `orchestrator doctor` for `config` (its model, device, threads)."""
    here = machine()
    device = _device(config.device)
    threads = config.threads or default_threads()
    report: dict[str, Any] = {
        "cpu": {
            "model": here.cpu,
            "kind": here.kind,
            "flags": list(here.flags),
            "cores": here.cores,
            "held": dict(here.held),
        },
        "torch": {
            "version": torch.__version__,
            "dispatch": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")(),
            "cuda": torch.cuda.is_available(),
            "native_bf16": here.native_bf16,
            "amx": here.amx,
            "threads": threads,
        },
        "onednn": {
            "available": bool(torch.backends.mkldnn.is_available()),  # type: ignore[no-untyped-call]
            "version": _onednn_version(),
            "bf16": here.onednn_bf16,
        },
        "numba": {"version": numba_version(), "amx_tiles": _tiles.amx_ready() if here.amx else False},
    }
    started = time.perf_counter()
    try:
        args, source = _model_args(config.model)
    except Exception as exc:  # a missing or unreadable model: said, and the rest still reported
        report["model"] = {"name": config.model, "error": " ".join(str(exc).split())}
        report["decode_paths"] = {}
    else:
        report["model"] = {
            "name": config.model,
            "hidden": args.hidden_size,
            "layers": args.num_layers,
            "read_from": source,
            "read_s": round(time.perf_counter() - started, 3),
        }
        report["decode_paths"] = _paths(args, device, threads, config)
    report["cache"] = _cache()
    return report


def _model_args(model: str) -> tuple[ModelArgs, str]:
    """The model's architecture and where it was read from (the fastest place that has it)."""
    path = resolve_model_path(model)
    if path.is_dir():
        return hf_args(path), f"{path / 'config.json'}"
    cached = cached_args(path)
    if cached is not None:
        return cached, f"the weight cache ({path.name})"
    with reading_model(path):
        return gguf_args(open_gguf(path)), f"the GGUF's header ({path})"


def _paths(args: ModelArgs, device: torch.device, threads: int, config: EngineConfig) -> dict[str, Any]:
    """The decode paths a load of the model would take, per dtype a load of `config` may use
    (the configured one; on a CPU left to "auto", fp32 and bf16), each timed."""
    dtypes = [_dtype(config.dtype, device)]
    if config.dtype == "auto" and device.type == "cpu":
        dtypes.append(torch.bfloat16)
    shape = Shape.of(args)
    chosen: dict[str, Any] = {}
    for dtype in dtypes:
        started = time.perf_counter()
        record = choose_paths(shape, dtype, device, threads).record()
        chosen[str(dtype).removeprefix("torch.")] = {
            **record,
            "chose_s": round(time.perf_counter() - started, 3),
        }
    return chosen


def _onednn_version() -> str | None:
    """oneDNN's version as torch's build reports it (None where it does not say)."""
    found = re.search(r"MKL-DNN v([\w.]+)", torch.__config__.show())
    return found.group(1) if found else None


def _cache() -> dict[str, Any]:
    """What the engine's cache folder holds: the models' weights, the kernels, the kept choices."""
    folder = cache_dir()
    models = sorted(p for p in folder.glob("*") if p.is_dir() and re.fullmatch(r"[0-9a-f]{32}", p.name))
    return {
        "folder": str(folder),
        "models": [{"key": p.name, "bytes": _size(p)} for p in models],
        "kernels": {"folder": str(numba_cache_dir()), "bytes": _size(numba_cache_dir())},
        "decode_paths": {"folder": str(paths_dir()), "kept": len(list(paths_dir().glob("*.json")))},
    }


def _size(path: Path) -> int:
    """The bytes of every file under `path` (0 where there is none)."""
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0
