"""`view`: a read-only web page over the store, where lanes land live."""

from __future__ import annotations

import argparse

from lanefold.cli._shared import Common, Handler, Interrupted, store_of, where
from lanefold.primitives import ConfigError
from lanefold.serve import api_key_from, is_loopback, port_number, require_extra
from lanefold.view import view

__all__ = ("add_commands",)


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Common
) -> dict[str, Handler]:
    """Add `view` to the CLI's subcommands; the handlers by name."""
    p = sub.add_parser("view", help="a read-only web page over the store: runs, lanes live, evals, budgets")
    p.add_argument("--host", default="127.0.0.1", help="default loopback")
    p.add_argument("--port", type=port_number, default=8765)
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="the page asks for this environment variable's value (a login form, or "
        "'Authorization: Bearer <key>'); needed to listen beyond loopback",
    )
    common(p)
    return {"view": _cmd_view}


def _cmd_view(args: argparse.Namespace) -> int:
    require_extra()  # starlette and uvicorn: the serve extra, or its install line
    key = api_key_from(args.api_key_env)
    if key is None and not is_loopback(args.host):
        raise ConfigError(f"--host {args.host}: not loopback; a view beyond this machine needs --api-key-env")
    # what `orchestrator resume` needs to find a run in this store (as the CLI's own resume line
    # says it: the password never), for an interrupted or stopped run's page
    flags = where(args)
    try:
        view(
            store_of(args),
            host=args.host,
            port=args.port,
            api_key=key,
            resume_flags=flags,
            runs_dir=args.runs_dir,
        )
    except (Interrupted, KeyboardInterrupt):  # the latter: Ctrl-C before uvicorn took signals
        pass  # Ctrl-C is how a view is meant to end
    return 0
