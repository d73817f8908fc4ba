"""`orchestrator serve`: a backend behind an OpenAI-compatible HTTP server.

`serve` runs the server (the port bound up front, the backend loaded before the first client,
Ctrl-C and SIGTERM ending it cleanly); the app itself (`_app`, starlette) is imported only when a
server starts, so the command line starts without the serve extra installed.
"""

from __future__ import annotations

from lanefold.serve._headers import twice_sent
from lanefold.serve._keyring import TOKENS_NOTE, StoreKeys, key_digest, key_report, key_store, new_key
from lanefold.serve._keys import GatewayKey, KeyBudget, Keys, load_keys
from lanefold.serve._loops import gateway_app, loop_configs, serve_loops, serve_loops_async
from lanefold.serve._run import (
    ServeError,
    api_key_from,
    count,
    is_loopback,
    listen,
    port_number,
    require_extra,
    serve,
    serving_loop,
)

__all__ = (
    "TOKENS_NOTE",
    "GatewayKey",
    "KeyBudget",
    "Keys",
    "ServeError",
    "StoreKeys",
    "api_key_from",
    "count",
    "gateway_app",
    "is_loopback",
    "key_digest",
    "key_report",
    "key_store",
    "listen",
    "load_keys",
    "loop_configs",
    "new_key",
    "port_number",
    "require_extra",
    "serve",
    "serve_loops",
    "serve_loops_async",
    "serving_loop",
    "twice_sent",
)
