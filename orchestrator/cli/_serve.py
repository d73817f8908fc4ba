"""`serve`: a backend behind an OpenAI-compatible HTTP server."""

from __future__ import annotations

import argparse

from lanefold.cli._shared import (
    Common,
    Handler,
    otel_argument,
    otel_hooks,
    store_of,
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
    Backend,
    ConfigError,
)
from lanefold.serve import (
    api_key_from,
    count,
    is_loopback,
    loop_configs,
    port_number,
    require_extra,
    serve,
    serve_loops,
)

__all__ = ("add_commands",)


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Common
) -> dict[str, Handler]:
    """Add `serve` to the CLI's subcommands; the handlers by name."""
    p = sub.add_parser(
        "serve",
        help="serve loops (--loops) or a backend (--backend-config) as an OpenAI-compatible HTTP server",
    )
    p.add_argument(
        "--backend-config",
        help="a file with a [backend] table (or only the backend's keys), served as a model",
    )
    p.add_argument(
        "--loops",
        metavar="DIR",
        help="serve each *.toml loop config in DIR as a model named by its file stem (the loop gateway)",
    )
    p.add_argument(
        "--loop",
        action="append",
        default=[],
        metavar="NAME=CONFIG",
        help="serve one more loop config as the model NAME (repeatable)",
    )
    p.add_argument(
        "--keys",
        metavar="FILE",
        help="a TOML keys file: each [[keys]] with name, sha256, loops, budget, max_concurrency "
        "(turns authentication on; see docs/gateway.md); with --store-keys, the keys it seeds",
    )
    p.add_argument(
        "--store-keys",
        action="store_true",
        help="authenticate with the keys kept in the store (orchestrator keys create ...): "
        "changes seen within a second, tokens and requests a minute enforced",
    )
    p.add_argument(
        "--workers",
        type=count,
        default=1,
        metavar="N",
        help="N processes behind the one port, a killed one restarted (loops only; keys, budgets, "
        "rate limits and idempotency shared through the store; see docs/gateway.md)",
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
    otel_argument(p)
    common(p)
    return {"serve": _cmd_serve}


def _cmd_serve(args: argparse.Namespace) -> int:
    require_extra()  # starlette and uvicorn: the serve extra, or its install line
    key = api_key_from(args.api_key_env)
    loops_served = args.loops is not None or bool(args.loop)
    if not loops_served:
        if args.backend_config is None:
            raise ConfigError(
                "serve: give --loops DIR (or --loop NAME=CONFIG), --backend-config FILE, or both"
            )
        if args.keys is not None or args.store_keys:
            raise ConfigError(
                f"{'--keys' if args.keys else '--store-keys'}: keys govern loops; give --loops DIR too"
            )
        if args.otel_endpoint is not None:
            raise ConfigError("--otel-endpoint: traces are of runs; give --loops DIR too")
        if args.otel_content:
            raise ConfigError("--otel-content: traces are of runs; give --loops DIR too")
    elif (args.keys is not None or args.store_keys) and key is not None:
        raise ConfigError("--keys and --api-key-env: give one (a keys file holds every key)")
    if key is None and args.keys is None and not args.store_keys and not is_loopback(args.host):
        # As `view` refuses it: a port beyond this machine with no key serves anyone who finds it.
        needs = "--keys or --api-key-env" if loops_served else "--api-key-env"
        raise ConfigError(f"--host {args.host}: not loopback; serving beyond this machine needs {needs}")
    if args.workers != 1 and (args.workers < 1 or not loops_served):
        raise ConfigError(
            f"--workers {args.workers}: at least 1"
            if args.workers < 1
            else "--workers: several workers serve loops; give --loops DIR too"
        )
    backend = _backend(args.backend_config) if args.backend_config is not None else None
    if args.loops is not None or args.loop:
        loops = loop_configs(args.loops, args.loop)
        serve_loops(
            loops,
            store_of(args),
            host=args.host,
            port=args.port,
            keys_file=args.keys,
            store_keys=args.store_keys,
            workers=args.workers,
            api_key=key,
            backend=backend,
            backend_name=args.model_name,
            backend_options={
                "api_key": None,
                "max_body_bytes": args.max_body_bytes,
                "max_waiting": args.max_waiting,
            },
            max_body_bytes=args.max_body_bytes,
            hooks=otel_hooks(args),
        )
        return 0
    assert backend is not None
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


def _backend(path: str) -> Backend:
    config = load_backend_config(path)
    # What a run's preflight would say, said before the model loads (or the server starts).
    errors = [*backend_errors(config, path), *backend_preflight_errors(config, path)]
    if errors:
        raise ConfigError(errors[0])
    return build_backend(config)
