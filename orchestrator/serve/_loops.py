"""`orchestrator serve --loops DIR`: which loops are served under which names, and the server.

Each `*.toml` loop config in DIR is served under its file stem; `--loop NAME=CONFIG` adds one or
serves a file under another name. Every config is read and preflighted before the port opens,
and every backend they name is built and loaded once (two loops on one engine share it).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from lanefold.config import LoopConfig, load_config, preflight
from lanefold.execution import Session, Store, open_store
from lanefold.primitives import Backend, ConfigError, Hook, Loadable
from lanefold.serve._keyring import StoreKeys, key_store, seed_keys
from lanefold.serve._keys import KeyPools, Keys, load_keys
from lanefold.serve._routes import served_models
from lanefold.serve._run import balanced_workers, listen, run_server, serving_loop
from lanefold.serve._workers import WorkerHeader, run_forked, supervise

__all__ = ("gateway_app", "loop_configs", "serve_loops", "serve_loops_async")

_log = logging.getLogger("lanefold.serve")


def loop_configs(folder: str | Path | None, named: Sequence[str] = ()) -> dict[str, LoopConfig]:
    """The loops to serve, model name -> config: DIR's `*.toml` by stem, then each `--loop
    NAME=CONFIG`, then `LOOP/MODEL` for each model a loop's `[serve] models` lists (each
    preflighted). A bad file, name or pair is one ConfigError naming it."""
    loops: dict[str, LoopConfig] = {}
    sources: dict[str, str] = {}
    if folder is not None:
        root = Path(folder)
        if not root.is_dir():
            raise ConfigError(f"--loops: {root} is not a folder")
        for path in sorted(root.glob("*.toml")):
            loops[path.stem], sources[path.stem] = load_config(path), str(path)
            preflight(loops[path.stem], str(path))
    for pair in named:
        name, eq, file = (part.strip() for part in pair.partition("="))
        if not eq or not name or not file:
            raise ConfigError(f"--loop {pair!r}: expected NAME=CONFIG")
        if "/" in name:
            raise ConfigError(f"--loop {pair!r}: a loop's name has no '/' (LOOP/MODEL names a model of it)")
        loops[name], sources[name] = load_config(file), file
        preflight(loops[name], file)
    if not loops:
        raise ConfigError(f"--loops: no *.toml loop config in {folder}" if folder else "no loop to serve")
    return served_models(loops, sources)


def gateway_app(
    loops: dict[str, LoopConfig],
    store: Store | str | None = None,
    *,
    runs_dir: str | Path = "runs",
    keys_file: str | Path | None = None,
    store_keys: bool = False,
    hooks: Sequence[Hook] = (),
    max_body_bytes: int = 1 << 20,
) -> Any:
    """The gateway as an ASGI app, to serve with any ASGI server (or mount in your own):
    `loops` (model name -> config, as `loop_configs` reads them) recorded in `store` (a Store,
    a `postgresql://` URL; None: files under `runs_dir`), with `keys_file`'s keys and budgets;
    `store_keys`: with the keys kept in the store instead (`keys_file`, if given, seeds them).
    Backends are built and loaded at their loop's first request. Needs the serve extra."""
    from lanefold.serve._gateway import create_gateway

    if store is None or isinstance(store, str):
        store = open_store(store, runs_dir)
    loops = served_models(loops)  # a key may name a LOOP/MODEL however `loops` was made
    keys = load_keys(keys_file, loops) if keys_file is not None else None
    session = Session(store=store, hooks=hooks)
    if store_keys:
        stored, pools = keyring(store, keys)
        stored.load()
        return create_gateway(session, loops, keys=stored, pools=pools, max_body_bytes=max_body_bytes)
    filed = KeyPools(keys, store) if keys is not None else None
    if filed is not None:
        filed.prepare()
    return create_gateway(session, loops, keys=keys, pools=filed, max_body_bytes=max_body_bytes)


def keyring(store: Store, seed: Keys | None) -> tuple[StoreKeys, KeyPools]:
    """The store's keys as a gateway serves them (`seed`, a keys file's, written in first),
    every key spending from its budget."""
    kept = key_store(store, "--store-keys")
    if seed is not None:
        seed_keys(store, seed)
    return StoreKeys(kept), KeyPools(Keys(()), store, every=True)


def serve_loops(
    loops: dict[str, LoopConfig],
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    keys_file: str | None = None,
    store_keys: bool = False,
    workers: int = 1,
    **options: Any,
) -> None:
    """Blocking: serve `loops` until Ctrl-C, with `keys_file`'s keys; `options` are
    `serve_loops_async`'s (api_key, backend and backend_name, hooks, ...). `workers` > 1:
    that many forked processes on the one port (`_workers.supervise`), each naming itself in
    an `x-lanefold-worker` reply header."""
    if workers < 1:
        raise ConfigError(f"--workers {workers}: at least 1")
    if workers > 1:
        options = {**options, "worker_header": True}
    keys = load_keys(keys_file, loops) if keys_file is not None else None
    # Before the event loop: a taken port fails fast and plainly. Balanced workers each listen
    # on a socket of their own; this one only holds the port for them (and for a restart).
    own = workers > 1 and balanced_workers()
    sock = listen(host, port, backlog=0 if own else 2048, reuse_port=own)

    def work(sock: socket.socket) -> None:
        if own:
            held, sock = sock, listen(host, sock.getsockname()[1], reuse_port=True)
            held.close()  # the supervisor's, inherited: it holds the port on its own
        serving_loop(
            lambda: serve_loops_async(
                loops, store, sock=sock, host=host, port=port, keys=keys, store_keys=store_keys, **options
            )
        )

    if workers == 1:
        work(sock)
        return
    # Forked before the store is first used here: each worker opens its own connection.
    if store_keys and keys is not None:
        seed = keys
        run_forked(lambda: seed_keys(store, seed))  # once, not raced by N workers
        keys = None
    supervise(workers, sock, work)


async def serve_loops_async(
    loops: dict[str, LoopConfig],
    store: Store,
    *,
    sock: socket.socket | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    keys: Any = None,
    store_keys: bool = False,
    api_key: str | None = None,
    backend: Backend | None = None,
    backend_name: str | None = None,
    backend_options: dict[str, Any] | None = None,
    max_body_bytes: int = 1 << 20,
    log_level: str = "info",
    hooks: Sequence[Hook] = (),
    worker_header: bool = False,
) -> None:
    """`serve_loops` in a running event loop (asyncio: uvicorn's): `loops` and `backend` (as
    `backend_name`, where given) on `sock` (else `host:port`), with `keys` (a `Keys`; with
    `store_keys`, the keys kept in the store, which `keys` seeds); `worker_header`: each reply
    names this process in `x-lanefold-worker`."""
    from lanefold.serve._app import create_app, served_names
    from lanefold.serve._gateway import create_gateway
    from lanefold.serve._guard import KeyCheck

    # One segment of each budget for the process, closed with the session (`aclose` below).
    session = Session(store=store, hooks=hooks, standing_pools=True)
    pools = KeyPools(keys, store) if keys is not None and not store_keys else None
    served_keys = keys
    if store_keys:
        served_keys, pools = await anyio.to_thread.run_sync(keyring, store, keys)
        await anyio.to_thread.run_sync(served_keys.load)
    backend_app = None
    names: frozenset[str] = frozenset()
    if backend is not None:
        name = backend_name or backend.name
        backend_app = create_app(backend, model_name=name, **(backend_options or {}))
        names = served_names(backend, name)
    app = create_gateway(
        session,
        loops,
        keys=served_keys,
        pools=pools,
        backend_app=backend_app,
        backend_names=names,
        max_body_bytes=max_body_bytes,
    )
    served: Any = app if api_key is None else KeyCheck(app, key=api_key)  # before a body is read
    if worker_header:
        served = WorkerHeader(served)

    async def load() -> None:
        for config in loops.values():
            await session.backends_for(config)  # built and loaded once per distinct backend
        if isinstance(backend, Loadable):
            await backend.load()
        if pools is not None and not store_keys:
            await anyio.to_thread.run_sync(pools.prepare)
        _log.info("loops: %s", ", ".join(sorted(loops)))

    async def aclose() -> None:
        await session.aclose()
        if backend is not None:
            await backend.aclose()

    what = f"{len(loops)} loop{'s' if len(loops) != 1 else ''} ({', '.join(sorted(loops))})"
    await run_server(
        served,
        what=what,
        host=host,
        port=port,
        log_level=log_level,
        sock=sock,
        load=load,
        aclose=aclose,
        stopping=app.state.stopping,
    )
