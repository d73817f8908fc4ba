"""The library's logging: structlog's bound context over the standard `logging` module.

A library never configures logging: these loggers write to the `logging` logger they are
named after (`lanefold`, `lanefold.dispatch`, ...) and nowhere else, so the application's
handlers decide what is shown and where. Nothing is printed.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ("get_logger",)

# As the logging HOWTO asks of a library: without this, a warning logged while the application
# has configured nothing would reach stderr through logging's last-resort handler.
logging.getLogger("lanefold").addHandler(logging.NullHandler())


def _to_stdlib(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> tuple[tuple[str], dict[str, Any]]:
    """`event key=value ...` as the message; the structured fields ride along as `lanefold`."""
    fields = dict(event)
    name = str(fields.pop("event", ""))
    message = " ".join([name, *(f"{key}={value!r}" for key, value in fields.items())])
    return (message,), {"extra": {"lanefold": {"event": name, **fields}}}


def get_logger(name: str = "lanefold", **context: object) -> structlog.stdlib.BoundLogger:
    """A bound logger writing to `logging.getLogger(name)`, with `context` bound."""
    logger: structlog.stdlib.BoundLogger = structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.filter_by_level, _to_stdlib],
        wrapper_class=structlog.stdlib.BoundLogger,
    )
    return logger.bind(**context) if context else logger
