"""Serving the view: the port bound up front, uvicorn until Ctrl-C."""

from __future__ import annotations

import logging

from lanefold.primitives import Store
from lanefold.serve import listen, serving_loop

__all__ = ("view",)


def view(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    api_key: str | None = None,
    resume_flags: list[str] | None = None,
    runs_dir: str = "runs",
) -> None:
    """Blocking: serve the view of `store` on `host:port` until Ctrl-C; compare and sweep
    records are read from `runs_dir`."""
    import uvicorn  # the `serve` extra; imported here so the package loads without it

    from lanefold.view._app import create_app

    sock = listen(host, port)  # before the event loop: a taken port fails fast and plainly
    app = create_app(store, api_key=api_key, resume_flags=resume_flags, runs_dir=runs_dir)
    config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    logging.getLogger("lanefold.view").warning(
        "viewing %s on http://%s:%d/ (Ctrl-C to stop)", store.describe, shown, sock.getsockname()[1]
    )
    try:
        serving_loop(lambda: server.serve(sockets=[sock]))
    finally:
        sock.close()
