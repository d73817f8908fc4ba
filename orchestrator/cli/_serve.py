"""`serve`: a backend behind an OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse

from lanefold.cli._shared import (
    Common,
    Handler,
    error,
)
from lanefold.config import (
    backend_errors,
    backend_preflight_errors,
    load_backend_config,
)
from lanefold.execution import (
    build_backend,
)
from lanefold.primitives import (
    ConfigError,
)
from lanefold.serve import (
    api_key_from,
    count,
    is_loopback,
    port_number,
    require_extra,
    serve,
)

__all__ = ("add_commands",)


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Common
) -> dict[str, Handler]:
    """Add `serve` to the CLI's subcommands; the handlers by name."""
    p = sub.add_parser("serve", help="serve a backend as an OpenAI-compatible HTTP server")
    p.add_argument(
        "--backend-config", required=True, help="a file with a [backend] table (or only the backend's keys)"
    )
    p.add_argument("--host", default="127.0.0.1", help="default loopback")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--model-name", help="the model id clients ask for (default: the backend's)")
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="clients must send 'Authorization: "
        "Bearer <key>' with this environment variable's value, else 401",
    )
    p.add_argument(
        "--max-body-bytes",
        type=count,
        default=1 << 20,
        metavar="BYTES",
        help="larger request bodies get 413, cut off as they arrive (1 MiB)",
    )
    p.add_argument(
        "--max-waiting",
        type=count,
        metavar="N",
        help="requests waiting beyond "
        "the backend's running batch; more get 429 with Retry-After (default: any)",
    )
    common(p, runs=False)
    return {"serve": _cmd_serve}


def _cmd_serve(args: argparse.Namespace) -> int:
    require_extra()  # starlette and uvicorn: the serve extra, or its install line
    key = api_key_from(args.api_key_env)
    if key is None and not is_loopback(args.host):
        error(
            "serve",
            f"warning: listening on {args.host} without --api-key-env: anyone who "
            "can reach this port can use the model",
        )
    config = load_backend_config(args.backend_config)
    # What a run's preflight would say, said before the model loads (or the server starts).
    errors = [
        *backend_errors(config, args.backend_config),
        *backend_preflight_errors(config, args.backend_config),
    ]
    if errors:
        raise ConfigError(errors[0])
    backend = build_backend(config)
    serve(
        backend,
        model_name=args.model_name or backend.name,
        host=args.host,
        port=args.port,
        api_key=key,
        max_body_bytes=args.max_body_bytes,
        max_waiting=args.max_waiting,
    )
    return 0
