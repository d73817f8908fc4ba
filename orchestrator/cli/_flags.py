"""The `orchestrator` command's argument parsing: usage errors in one line, and the types of
flags that take a number of seconds."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

__all__ = ("Parser", "seconds", "some_seconds")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (`orchestrator tail: error: argument
    --wait: ...`), exit 2, like every other error of the command; `--help` shows the usage."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


def seconds(text: str) -> float:
    """argparse type of a wait: a finite number of seconds, 0 or more (not NaN, not inf)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def some_seconds(text: str) -> float:
    """argparse type of a time limit: a finite number of seconds above 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is no time at all (give more than 0)")
    return value
