"""How deep a JSON text nests, measured before it is parsed.

Python's JSON parser recurses once per level, so a line or a request body nested thousands deep
is a RecursionError (a traceback, a 500) rather than a refusal, and even a depth it survives
makes every later walk of the value recurse as deep. Whatever reads JSON a user or a client
wrote (a dataset's lines, a gateway request, a loop's own record before it is written)
measures it first with `nests_deeper` and refuses, in its own words, what nests past its bound:
one scan, no recursion, strings skipped.
"""

from __future__ import annotations

import itertools
import re

__all__ = ("nests_deeper",)

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # a JSON string (escapes too), unrolled
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# An opening bracket as the signed byte 1, a closing one as -1: their running sum is the depth.
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def nests_deeper(text: str | bytes, limit: int) -> bool:
    """Whether arrays and objects in the JSON `text` nest more than `limit` deep (brackets
    inside strings not counted). Text that is not JSON is measured all the same: its parse
    refuses it after."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if data.count(b"[") + data.count(b"{") <= limit:
        return False  # too few brackets to nest past it, wherever they are
    steps = _STRING.sub(b"", data).translate(_STEPS, _NOT_BRACKETS)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0) > limit
