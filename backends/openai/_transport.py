"""The openai backend's HTTP transport: aiohttp's connection pool under httpx's client.

httpx stays the backend's client (its timeouts, its errors, the body's decoding); on asyncio
the requests go through an aiohttp session instead of httpcore's pool, which checks every
connection it holds on each request (a `poll` for each idle one, a scan of the pool for
each): with 32 requests in flight an httpx client spent about 2.6 ms of CPU a request, 0.3
on this transport (`bench/upstream_client.py`). On trio httpx's own transport carries the
request; with a proxy in the environment the backend keeps httpx's default transport, which
honours it (`pooled_transport`).

aiohttp's errors are raised as the httpx errors they correspond to, so the backend maps one
family: a connection refused or unreachable is a `ConnectError`, a timeout a `ConnectTimeout`
or `ReadTimeout`, a connection closed before the answer a `RemoteProtocolError`, during it a
`ReadError`. The body is passed on as sent (`auto_decompress` off): httpx decodes it.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import httpx
import sniffio

if TYPE_CHECKING:  # imported at the first request on asyncio: a CLI that sends none skips it
    import aiohttp

__all__ = ("PooledTransport", "pooled_transport")

# An idle connection is let go before the 5 s keep-alive of uvicorn-based servers (vLLM,
# SGLang, LiteLLM) ends: one kept exactly as long can be reused as the server closes it.
KEEPALIVE_S = 4.0
# Headers aiohttp writes itself from the request it sends (the body's length, the host).
_OWN = frozenset({"host", "content-length", "transfer-encoding", "connection"})


def pooled_transport(max_connections: int) -> PooledTransport | None:
    """The backend's transport; None where a proxy is set in the environment (`HTTP_PROXY`,
    `HTTPS_PROXY`, `ALL_PROXY`): httpx's default transport then goes through it."""
    if {"http", "https", "all"} & set(urllib.request.getproxies()):
        return None
    return PooledTransport(max_connections=max_connections)


class PooledTransport(httpx.AsyncBaseTransport):
    """An httpx transport over aiohttp on asyncio, over httpx's own elsewhere.

    `max_connections` bounds the connections open at once on either; both verify TLS with
    `verify` (default: httpx's, its CA bundle and `SSL_CERT_FILE`; made once, here). The aiohttp
    session is made at the first request, in the event loop that sends it: like the backend
    that holds it, the transport serves one event loop."""

    def __init__(self, *, max_connections: int, verify: ssl.SSLContext | None = None) -> None:
        self._max_connections = max_connections
        self._tls = verify or httpx.create_ssl_context()
        limits = httpx.Limits(
            max_connections=max_connections,
            max_keepalive_connections=max_connections,
            keepalive_expiry=KEEPALIVE_S,
        )
        self._fallback = httpx.AsyncHTTPTransport(verify=self._tls, limits=limits)
        self._session: aiohttp.ClientSession | None = None

    def _aiohttp_session(self) -> aiohttp.ClientSession | None:
        """The aiohttp session, made at the first request; None off asyncio (httpx's serves)."""
        if sniffio.current_async_library() != "asyncio":
            return None
        if self._session is None:
            import aiohttp

            connector = aiohttp.TCPConnector(
                limit=self._max_connections,
                keepalive_timeout=KEEPALIVE_S,
                ssl=self._tls,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),  # httpx's are sent
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._aiohttp_session()
        if session is None:
            return await self._fallback.handle_async_request(request)
        import aiohttp

        timeout = request.extensions.get("timeout", {})
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _OWN]
        with _as_httpx(request, connected=False):
            response = await session.request(
                request.method,
                str(request.url),
                headers=headers,
                data=await request.aread(),
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=timeout.get("connect"), sock_read=timeout.get("read")
                ),
            )
        return httpx.Response(
            response.status,
            headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers],
            stream=_Body(response, request),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        self._session = None
        await self._fallback.aclose()


class _Body(httpx.AsyncByteStream):
    """An aiohttp response's body as httpx reads it; closing it gives the connection back."""

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response, self._request = response, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _as_httpx(self._request, connected=True):
            async for chunk in self._response.content.iter_any():
                yield chunk

    async def aclose(self) -> None:
        self._response.release()


@contextlib.contextmanager
def _as_httpx(request: httpx.Request, *, connected: bool) -> Iterator[None]:
    """aiohttp's errors as httpx's: before an answer began (`connected` False) a timeout is
    the connection's or the answer's first byte's; after, the body's."""
    import aiohttp

    try:
        yield
    except aiohttp.ClientConnectorError as exc:  # refused, unreachable, a name not found
        raise httpx.ConnectError(str(exc), request=request) from exc
    except aiohttp.ServerDisconnectedError as exc:
        closed = httpx.ReadError if connected else httpx.RemoteProtocolError
        raise closed(str(exc) or "server disconnected", request=request) from exc
    except TimeoutError as exc:  # aiohttp's ServerTimeoutError and its kinds are TimeoutErrors
        connecting = isinstance(exc, aiohttp.ConnectionTimeoutError)
        timed_out = httpx.ConnectTimeout if connecting else httpx.ReadTimeout
        raise timed_out(str(exc) or "timed out", request=request) from exc
    except aiohttp.ClientPayloadError as exc:  # the body cut short or malformed
        raise httpx.ReadError(str(exc), request=request) from exc
    except aiohttp.ClientResponseError as exc:  # not HTTP as the server sent it
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except aiohttp.ClientError as exc:  # a reset and the rest of aiohttp's transport errors
        raise httpx.ReadError(str(exc), request=request) from exc
