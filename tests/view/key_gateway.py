"""A gateway over a store's keys for the view's tests: the keys' runs are what the key pages
and the runs search show."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from starlette.testclient import TestClient

from lanefold.config import parse_config
from lanefold.execution import Session, Store
from lanefold.serve import StoreKeys
from lanefold.serve._gateway import create_gateway
from lanefold.serve._keys import KeyPools, Keys

LOOP = {
    "loop": {"k": 4, "max_concurrency": 4, "seed": 7, "min_quorum": 2},
    "sampling": {"max_tokens": 32, "temperature": 0.8},
    "backend": {"kind": "simulated", "prompt_tokens": 20, "output_tokens": 10, "latency_ms": [0, 0]},
    "pricing": {"input_per_mtok": 0.15, "cached_input_per_mtok": 0.075, "output_per_mtok": 0.6},
}


@contextmanager
def gateway(store: Store) -> Iterator[TestClient]:
    """A gateway over `store`'s keys serving the loop `vote`."""
    keys = StoreKeys(store)  # type: ignore[arg-type]
    keys.load()
    pools = KeyPools(Keys(()), store, every=True)
    app = create_gateway(Session(store=store), {"vote": parse_config(LOOP)}, keys=keys, pools=pools)
    with TestClient(app, base_url="http://gateway/v1", raise_server_exceptions=False) as client:
        yield client
