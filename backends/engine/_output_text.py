"""A lane's output text, grown a token at a time, and the stop-string check on what is new.

Decoding a lane's whole output after every token costs O(n) per token (O(n^2) a lane), and
searching the whole text for stop strings as much again. Here each token decodes a window of a
few ids: the text of `ids[prefix:]` minus the text of `ids[prefix:read]` is what the new ids
add (the window keeps the context a decoder needs, e.g. a leading space), and nothing is added
while the window ends inside a multi-byte character. A stop string can only end in the new
text, so the search starts its longest length back from the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from lanefold.backends.engine._sampler import find_stop

__all__ = ("Decoder", "OutputText")


class Decoder(Protocol):
    """What `OutputText` needs of a tokenizer."""

    def decode(self, ids: list[int]) -> str: ...


@dataclass(slots=True)
class OutputText:
    """Text decoded so far from a lane's output ids."""

    text: str = ""
    prefix: int = 0  # ids[prefix:read] is the window decoded last time
    read: int = 0

    def extend(self, decoder: Decoder, ids: list[int]) -> str:
        """Decode what `ids` (the whole output so far) adds to `text`; returns the new text."""
        before = decoder.decode(ids[self.prefix : self.read])
        after = decoder.decode(ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # no visible text yet, or a character still incomplete
        new = after[len(before) :]
        self.prefix, self.read = self.read, len(ids)
        self.text += new
        return new

    def stop_at(self, new: str, stops: tuple[str, ...]) -> int | None:
        """Where the earliest stop string starts, if one ends in the `new` text just added."""
        if not new:
            return None
        longest = max((len(s) for s in stops), default=0)
        return find_stop(self.text, stops, max(0, len(self.text) - len(new) - longest + 1))
