"""Gateway keys on files (`KeyStore`): `<runs>/.keys/<name>.json` a key each (its record and
its counters, never the key), every change made under an exclusive `flock` on `<runs>/.keys/lock`
(so every gateway process sharing the folder takes from one bucket), each file replaced whole:
written beside it, forced to disk, renamed over it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from lanefold.primitives import (
    ConfigError,
    KeyRecord,
    RateVerdict,
    StoredKey,
    UsesInFlight,
    check_key_name,
    give_rate,
    take_rate,
)
from lanefold.stores.files._documents import locked_folder, read_document, write_document

__all__ = ("FileKeys",)

T = TypeVar("T")
_FOLDER = ".keys"


class FileKeys:
    """The keys of one runs folder."""

    def __init__(self, root: str | Path) -> None:
        self.folder = Path(root) / _FOLDER
        self._uses = UsesInFlight()

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """The keys' exclusive lock for the block (waits for another holder to finish)."""
        return locked_folder(self.folder, self.folder, "keys")

    def path(self, name: str) -> Path:
        return self.folder / f"{check_key_name(name)}.json"  # a plain name, never a path

    def _read(self, path: Path) -> StoredKey | None:
        return read_document(path, StoredKey, "key")

    def _write(self, key: StoredKey) -> None:
        write_document(self.path(key.record.name), key, "key")

    def _all(self) -> list[StoredKey]:
        if not self.folder.is_dir():
            return []
        found = [self._read(path) for path in sorted(self.folder.glob("*.json"))]
        return [key for key in found if key is not None]

    # -- the KeyStore verbs ------------------------------------------------------------------------

    def create_key(self, record: KeyRecord) -> StoredKey:
        with self.locked():
            for known in self._all():
                if known.record.name == record.name:
                    raise ConfigError(f"key {record.name!r}: already in {self.folder.parent}")
                if known.record.sha256 == record.sha256:
                    raise ConfigError(f"key {record.name!r}: key {known.record.name!r} has the same sha256")
            key = StoredKey(record=record)
            self._write(key)
            return key

    def replace_key(self, record: KeyRecord) -> StoredKey:
        def replace(key: StoredKey) -> StoredKey:
            for known in self._all():
                if known.record.name != record.name and known.record.sha256 == record.sha256:
                    raise ConfigError(f"key {record.name!r}: key {known.record.name!r} has the same sha256")
            key.record = record
            return key

        return self._change(record.name, replace)

    def read_key(self, name: str) -> StoredKey | None:
        return self._read(self.path(name))

    def list_keys(self) -> list[StoredKey]:
        return sorted(self._all(), key=lambda k: k.record.name)

    def take_key_rate(self, name: str, tokens: int, requests: int, now: float) -> RateVerdict | None:
        # A file is replaced whole (renamed over), so a read without the lock sees one version
        # (None where there is no such key: one read, no stat before it).
        return self._uses.take(
            self._read(self.path(name)),
            now,
            lambda: self._change(name, lambda key: take_rate(key, tokens, requests, now)),
        )

    def give_key_rate(self, name: str, tokens: int, now: float) -> None:
        if self.path(name).is_file():
            self._change(name, lambda key: give_rate(key, tokens, now))

    def _change(self, name: str, work: Callable[[StoredKey], T]) -> T:
        """`work` on the key `name`, written back where it changed it, under the lock; no such
        key: ConfigError."""
        with self.locked():
            key = self._read(self.path(name))
            if key is None:
                raise ConfigError(f"key {name!r}: no such key in {self.folder.parent}")
            before = key.model_copy(deep=True)
            done = work(key)
            if key != before:
                self._write(key)
            return done
