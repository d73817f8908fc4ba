"""`orchestrator serve`'s server: the port bound up front (a taken port is one line), the backend
loaded before the first request, uvicorn serving the app, and Ctrl-C or SIGTERM ending requests
in flight at once and closing the backend."""

from __future__ import annotations

import argparse
import contextlib
import gc
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, ClassVar

import anyio

from lanefold.primitives import Backend, ConfigError, LanefoldError, Loadable, read_secret
from lanefold.primitives.internal import serving

__all__ = (
    "ServeError",
    "api_key_from",
    "count",
    "is_loopback",
    "listen",
    "port_number",
    "require_extra",
    "run_server",
    "serve",
    "serve_async",
    "serving_loop",
)


class ServeError(LanefoldError):
    """The server could not listen on its address (exit 1)."""

    exit_code: ClassVar[int] = 1


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine ("localhost", 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int, *, backlog: int = 2048, reuse_port: bool = False) -> socket.socket:
    """A socket bound to `host:port` and listening (`backlog` 0: bound only, the port held), or
    a ServeError saying why not (taken, unknown host). `reuse_port`: SO_REUSEPORT, so that
    other sockets of this user may listen on the same port (each worker's own, see
    `balanced_workers`)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, OverflowError) as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        # Listening now, not when uvicorn starts: a client told the address (the line saying
        # where) may connect at once and waits in the backlog instead of being refused.
        if backlog:
            sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def balanced_workers() -> bool:
    """Whether `--workers` each listen on a socket of their own (SO_REUSEPORT, Linux: the
    kernel spreads connections over the listening sockets by their addresses) rather than all
    on the one inherited socket. On one shared socket, the worker already awake wins the race
    to accept, so a burst of new connections (a client's pool opening) can land on one worker
    and stay there, kept alive, while the other idles: measured here, 32 connections opened at
    once all on one of two workers in 4 of 8 tries. Elsewhere (macOS and the BSDs hand every
    connection to the last socket bound), the one shared socket."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


async def serve_async(
    backend: Backend,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    sock: socket.socket | None = None,
    **app_options: Any,
) -> None:
    """Serve `backend` with uvicorn until SIGINT or SIGTERM, then close the backend.

    `app_options` go to `create_app` (api_key, max_body_bytes, max_waiting, ...). A second
    signal while requests are still closing forces the exit.
    """
    from lanefold.serve._app import create_app

    async def load() -> None:
        if isinstance(backend, Loadable):  # the engine: the model before the first client
            await backend.load()

    app = create_app(backend, model_name=model_name, **app_options)
    await run_server(
        app,
        what=model_name,
        host=host,
        port=port,
        log_level=log_level,
        sock=sock,
        load=load,
        aclose=backend.aclose,
    )


async def run_server(
    app: Any,
    *,
    what: str,
    host: str,
    port: int,
    log_level: str = "info",
    sock: socket.socket | None = None,
    load: Callable[[], Awaitable[None]],
    aclose: Callable[[], Awaitable[None]],
    stopping: Any = None,
) -> None:
    """Serve the ASGI `app` with uvicorn until SIGINT or SIGTERM: `load()` before the first
    client (a model that cannot load is its one-line error), `aclose()` after the last.
    `stopping` (default: the app's `state.stopping`) is told when a signal comes.

    Once loaded and listening, the process's objects so far (the imports, the app, its
    backends and models) are frozen out of the garbage collector's sweeps (`gc.freeze`, after
    one last `gc.collect` so that no garbage is kept): they live as long as the server, and a
    full sweep that walks them all stops every request in flight. Measured on the gateway (one
    worker, 32 clients, docs/gateway.md): sweeps of 60-90 ms at about 115,000 objects, one
    every 2-3 s under load, down to 3-7 ms.

    The server owns its event loop, so each HTTP request is marked as served work
    (`serving`): a request alone in flight makes its store calls on the loop rather than in
    a worker thread (`lanefold.primitives.offload` says why)."""
    import uvicorn  # the `serve` extra; imported here so the package loads without it

    sock = sock or listen(host, port)
    url = f"http://{f'[{host}]' if ':' in host else host}:{sock.getsockname()[1]}/v1"

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the signals are ours (below): uvicorn's would re-raise them at exit

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)  # says nothing when handed a bound socket
            gc.collect()
            gc.freeze()  # what the server has made by now lives as long as it (see above)
            logging.getLogger("uvicorn.error").info("serving %s on %s (Ctrl-C to stop)", what, url)

    config = uvicorn.Config(
        _served(app), host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5
    )
    server = _Server(config)
    stopping = stopping or getattr(getattr(app, "state", None), "stopping", None)
    failure: list[LanefoldError] = []  # raised after the task group, not inside its group
    try:
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for _ in signals:
                        if server.should_exit:
                            server.force_exit = True
                        server.should_exit = True
                        if stopping is not None:
                            stopping.stop()
                        if not server.started:  # still loading: nothing to shut down
                            tg.cancel_scope.cancel()

            tg.start_soon(watch)
            try:
                await load()
            except LanefoldError as exc:  # a model that cannot load: one line, its code
                failure.append(exc)
            if not failure:
                for task in getattr(getattr(app, "state", None), "background", ()):
                    tg.start_soon(task)  # cancelled with the rest when the server stops
                await server.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        sock.close()
        with anyio.CancelScope(shield=True):
            await aclose()
    if failure:
        raise failure[0]


def _served(app: Any) -> Any:
    """`app` with each HTTP request it answers marked as served work (`serving`), its
    response's body included."""

    async def served(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        with serving():
            await app(scope, receive, send)

    return served


def serving_loop(main: Callable[[], Awaitable[None]]) -> None:
    """Run a server's `main` to its end: on asyncio (uvicorn runs on nothing else), on
    uvloop's event loop where uvloop is installed (the serve extra installs it on Linux and
    macOS), else on asyncio's own. Every served process starts here: `serve`, `serve --loops`
    and each of its workers, `view`.

    uvloop's loop is libuv's, in C: its callbacks, sockets and the wake-ups of anyio's worker
    threads (every store write of a run returns through one) cost less of the one core a
    process's event loop has. Measured on the gateway (one worker, 32 clients, the AVX2-only
    2-core machine, docs/gateway.md): CPU a request 10.2 ms against 11.0 on asyncio's loop."""
    try:
        import uvloop  # noqa: F401  # the serve extra's, where the platform has it
    except ImportError:
        anyio.run(main, backend="asyncio")
    else:
        anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True})


def serve(
    backend: Backend,
    *,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    **app_options: Any,
) -> None:
    """Blocking: serve `backend` on `host:port` (loopback by default) until Ctrl-C."""
    sock = listen(host, port)  # before the event loop: a taken port fails fast and plainly
    serving_loop(
        lambda: serve_async(
            backend,
            model_name=model_name,
            host=host,
            port=port,
            log_level=log_level,
            sock=sock,
            **app_options,
        )
    )


def require_extra() -> None:
    """The `serve` extra's modules, or a ConfigError with the install line (exit 2)."""
    for module in ("starlette", "uvicorn", "jinja2"):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(
                f"orchestrator serve needs {module}, in the serve extra: pip install 'lanefold[serve]'"
            ) from None


def api_key_from(variable: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The API key held by the environment variable `variable` (None: no key asked for),
    checked as every secret read from the environment is (`lanefold.primitives.read_secret`, as
    the openai backend's `api_key_env` is): a key with a CR, LF or spaces at an end would start
    a server that answers 401 to every client."""
    if variable is None:
        return None
    try:
        return read_secret(environ, variable)
    except ConfigError as exc:
        raise ConfigError(f"--api-key-env: {exc}") from None


def port_number(text: str) -> int:
    """argparse type of `--port`: 0 to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535)")
    return value


def count(text: str) -> int:
    """argparse type of a count: 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value
