"""A wire tap for the integration tests: the real transport, every exchange recorded.

Passed to `OpenAIBackend(transport=...)`, it lets a test count the HTTP requests a run sent and
compare the bill with what the server itself reported, without touching the backend.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from lanefold import LoopConfig, RunResult, parse_config, run
from lanefold.backends.openai import OpenAIBackend, OpenAIConfig
from lanefold.primitives import AnyEvent
from lanefold.stores.files import JsonlEventLog

MODEL = "smollm2-135m"  # both servers serve the one model they were started with, whatever it is named
QUESTION = "What is 17 * 23?"


@dataclass(frozen=True, slots=True)
class Exchange:
    """One HTTP request and its answer: the request's JSON, the status, the body (JSON or text)."""

    request: Any
    status: int
    body: Any

    @property
    def n(self) -> int:
        return int(self.request.get("n", 1)) if isinstance(self.request, dict) else 1

    @property
    def choices(self) -> list[dict[str, Any]]:
        ok = self.status == 200 and isinstance(self.body, dict)
        return list(self.body.get("choices", [])) if ok else []

    @property
    def usage(self) -> dict[str, Any]:
        ok = self.status == 200 and isinstance(self.body, dict)
        return dict(self.body.get("usage") or {}) if ok else {}


class Tap(httpx.AsyncBaseTransport):
    """httpx's own transport underneath; `rewrite` may replace a request's body on the way out."""

    def __init__(self, rewrite: Callable[[bytes], bytes] | None = None) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._rewrite = rewrite
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        if self._rewrite is not None:
            content = self._rewrite(content)
            headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
            request = httpx.Request(request.method, request.url, headers=headers, content=content)
        response = await self._inner.handle_async_request(request)
        raw = await response.aread()
        await response.aclose()
        self.exchanges.append(Exchange(_json_or_text(content), response.status_code, _json_or_text(raw)))
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
        ]
        return httpx.Response(response.status_code, headers=headers, content=raw, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")


def backend(base_url: str, tap: Tap, **fields: Any) -> OpenAIBackend:
    """An `openai` backend on `tap`; `fields` override the config's defaults here."""
    config = OpenAIConfig(base_url=base_url, **{"model": MODEL, "timeout_s": 300.0, **fields})
    return OpenAIBackend(config, transport=tap)


def loop_config(
    base_url: str,
    *,
    k: int,
    n: str = "auto",
    max_tokens: int = 32,
    logprobs: bool = False,
    template: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> LoopConfig:
    """A parallel-sample loop through `kind = "openai"` at `base_url`, seeds fixed."""
    raw: dict[str, Any] = {
        "loop": {"k": k, "max_concurrency": k, "seed": 7, "min_quorum": 1},
        "prompt": {"template": template or "Question: {question}\nAnswer with a number.\n"},
        "sampling": {"temperature": 0.8, "max_tokens": max_tokens, "logprobs": logprobs},
        "extract": {"method": "last_number"},
        "backend": {"kind": "openai", "base_url": base_url, "model": MODEL, "n": n, "timeout_s": 300.0},
        "retry": {"max_attempts": 2, "initial_backoff_s": 0.1},
        **(extra or {}),
    }
    return parse_config(raw, source="<integration>")


async def run_loop(
    config: LoopConfig, tap: Tap, runs_dir: Path, question: str = QUESTION
) -> tuple[RunResult, list[AnyEvent]]:
    """Run `config` with its backend on `tap`; the result and the run's event log."""
    assert isinstance(config.backend, OpenAIConfig)
    # A backend handed to `run` stays the caller's to close: left open, its pooled connection
    # is collected later, in some other test, as an unclosed-socket ResourceWarning.
    async with OpenAIBackend(config.backend, transport=tap) as b:
        result = await run(config, question, runs_dir=runs_dir, backend=b)
    assert result.events is not None
    return result, list(JsonlEventLog(result.events).read())


def of_type(events: list[AnyEvent], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]
