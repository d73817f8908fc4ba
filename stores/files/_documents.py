"""One JSON document a file, as the files store keeps a budget or a key: read whole (None where
there is none), replaced whole (written beside it, forced to disk, renamed over it), each failure
one line naming the file. The caller holds the lock that makes a read-change-write atomic: a
folder's `locked_folder`."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from lanefold.primitives import ConfigError, os_failure

__all__ = ("locked_folder", "read_document", "write_document")

M = TypeVar("M", bound=BaseModel)


@contextlib.contextmanager
def locked_folder(folder: Path, made: Path, what: str) -> Iterator[None]:
    """An exclusive `flock` on `folder/lock` for the block (waits for another holder to finish);
    `made` (the folder, or one inside it) is made at the first lock, not checked at each. A
    failure is one line naming the folder and `what` it keeps."""
    try:
        try:
            fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the first change: the folders are made then
            made.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise os_failure(f"{folder}: cannot open the {what}", exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the flock


def read_document(path: Path, model: type[M], what: str) -> M | None:
    """The document at `path` as `model`; None if there is no file. `what` names it in errors."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise os_failure(f"{path}: cannot read the {what}", exc) from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "(the document)"
        raise ConfigError(f"{path}: {where}: {error['msg']}") from None


def write_document(path: Path, document: BaseModel, what: str) -> None:
    """Replace the file at `path` whole with `document`."""
    draft = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        with open(draft, "wb") as f:
            f.write(document.model_dump_json().encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(draft, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(draft)
        raise os_failure(f"{path}: cannot write the {what}", exc) from None
