"""Joining a Ray cluster at an address within a bounded time.

`ray.init(address=...)` retries an address that does not answer for minutes (its GCS client
reconnects, then the session lookup retries), so `orchestrator eval --ray-address` bounds the
whole join by `--ray-connect-timeout` (`CONNECT_TIMEOUT_S` by default), and a TCP probe says at
once that nothing listens at the address. Ray is the caller's (imported by `_ray_executor`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from lanefold.primitives import ConfigError

__all__ = ("CONNECT_TIMEOUT_S", "join_cluster")

# How long joining a cluster may take: a cluster answers in a second or two; an address that
# does not answer is a mistake to say, not minutes of Ray's retries to sit out.
CONNECT_TIMEOUT_S = 20.0


def join_cluster(ray: Any, address: str, options: dict[str, Any], timeout: float) -> None:
    """`ray.init(address)` within `timeout` seconds: Ray itself retries an address that
    does not answer for minutes. A TCP probe first says at once that nothing listens there;
    then `ray.init` runs in a helper thread this one waits for until the deadline (past it,
    the thread is left to Ray, and the process goes on without a cluster). What Ray writes
    to stderr meanwhile (its C++ core's retries) is held, and shown only once joined."""
    where = f"--ray-address {address}"
    deadline = time.monotonic() + timeout
    _probe(ray, address, timeout, where)
    ended: list[BaseException | None] = []

    def join() -> None:
        try:
            ray.init(address=address, **options)
        except BaseException as exc:  # told by the waiting thread
            ended.append(exc)
        else:
            ended.append(None)

    thread = threading.Thread(target=join, name="lanefold-ray-connect", daemon=True)
    with _stderr_held() as held, _without_thread_notice():
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
    if not ended:
        raise ConfigError(f"{where}: no Ray cluster answered within {timeout:g} s (--ray-connect-timeout)")
    error = ended[0]
    if error is None:
        held.replay()
        return
    if isinstance(error, ConnectionError | ValueError | RuntimeError | TimeoutError):
        # No cluster there ("auto" found none running), or not an address Ray can read.
        raise ConfigError(f"{where}: {' '.join(str(error).split())}") from None
    raise error


def _probe(ray: Any, address: str, timeout: float, where: str) -> None:
    """A TCP connection to `host:port`, as Ray would dial it (localhost is this machine's IP to
    Ray), so that an address nothing listens on or a host that does not resolve is a
    ConfigError at once. "auto" and `ray://` addresses are left to Ray (and the deadline)."""
    host, _, port = address.rpartition(":")
    if address in ("auto", "local") or "://" in address or not port.isdigit() or not host:
        return
    host = host.strip("[]")
    if host in ("localhost", "127.0.0.1", "::1"):
        host = ray.util.get_node_ip_address()
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except socket.gaierror as exc:
        raise ConfigError(f"{where}: no such host {host!r} ({exc.strerror})") from None
    except TimeoutError:
        raise ConfigError(
            f"{where}: {host}:{port} did not answer within {timeout:g} s (--ray-connect-timeout)"
        ) from None
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{where}: nothing answers at {host}:{port} ({reason})") from None


class _Held:
    """What went to stderr (fd 2) while held, to be shown after all."""

    def __init__(self) -> None:
        self.text = ""

    def replay(self) -> None:
        if self.text:
            sys.stderr.write(self.text)
            sys.stderr.flush()


@contextlib.contextmanager
def _stderr_held() -> Iterator[_Held]:
    """File descriptor 2 into a temporary file within the block: Ray's C++ core writes its
    connection retries there directly, past Python's `sys.stderr`."""
    held = _Held()
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no fd 2 (a daemon): nothing to hold
        yield held
        return
    with tempfile.TemporaryFile() as spool:
        os.dup2(spool.fileno(), 2)
        try:
            yield held
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            spool.seek(0)
            held.text = spool.read().decode("utf-8", "replace")


class _NoThreadNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "current thread is not the main thread" not in record.getMessage()


@contextlib.contextmanager
def _without_thread_notice() -> Iterator[None]:
    """Ray warns that it set no SIGTERM handler when `ray.init` runs off the main thread; that
    is wanted here (the command's signals stay the command's), so it is not shown."""
    logger, notice = logging.getLogger("ray._private.worker"), _NoThreadNotice()
    logger.addFilter(notice)
    try:
        yield
    finally:
        logger.removeFilter(notice)
