"""One JSON document a file, as the files store keeps a budget or a key: read whole (None where
there is none), replaced whole (written beside it, forced to disk, renamed over it), each failure
one line naming the file. The caller holds the lock that makes a read-change-write atomic."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from lanefold.primitives import ConfigError, os_failure

__all__ = ("read_document", "write_document")

M = TypeVar("M", bound=BaseModel)


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
