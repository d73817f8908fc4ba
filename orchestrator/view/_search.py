"""The runs search: what the runs page's form asks, as GET parameters (so a search is a URL),
read once here for the page and its live feed alike (and built from `orchestrator list`'s
flags of the same names), and answered by the store's `list_runs` (its summaries on files, a
WHERE on PostgreSQL), never by reading every run's log."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TypedDict

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from lanefold.primitives import RunSummary, Store

__all__ = ("FIELDS", "RunSearch")

# The form's fields, in the order it shows them; each a GET parameter of the same name.
FIELDS = ("question", "answer", "loop", "model", "caller", "status", "eval", "since", "until")


class _Newer(TypedDict, total=False):
    """`list_runs`'s filters added after its first ones: passed only where asked."""

    model: str
    caller: str
    question: str
    answer: str
    until: datetime


class RunSearch(BaseModel):
    """A search of the runs: text fields match a run whose question (answer) holds the text,
    any case; loop, model (as a gateway's client named it), caller (a key's name), status and
    eval exactly; since and until bound its start (an ISO time, UTC where it names no zone)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    question: str | None = None
    answer: str | None = None
    loop: str | None = None
    model: str | None = None
    caller: str | None = None
    status: str | None = None
    eval: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @field_validator("since", "until", mode="before")
    @classmethod
    def _time(cls, value: object) -> object:
        if isinstance(value, str):
            when = datetime.fromisoformat(value.strip())  # a ValueError names the bad text
            return when if when.tzinfo else when.replace(tzinfo=UTC)
        return value

    @classmethod
    def read(cls, params: Mapping[str, str]) -> RunSearch:
        """The search from a request's parameters (an empty field is no filter); a ValueError
        naming the field where one is not what it should be."""
        given = {k: v for k in FIELDS if (v := params.get(k, "").strip())}
        try:
            return cls.model_validate(given)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"{where}: {given.get(where, '')!r}: {first['msg']}") from None

    def shown(self) -> dict[str, str]:
        """The search as the form and its links repeat it: the fields given, as text."""
        found = {}
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None:
                found[name] = value.isoformat() if isinstance(value, datetime) else value
        return found

    def runs(self, store: Store, limit: int | None) -> list[RunSummary]:
        """The runs found, newest first, at most `limit`. A filter added to `list_runs` after
        its first ones reaches the store only where asked, so a store of one's own written
        before it still lists (and searches by what it knows)."""
        newer: _Newer = {}
        if self.model is not None:
            newer["model"] = self.model
        if self.caller is not None:
            newer["caller"] = self.caller
        if self.question is not None:
            newer["question"] = self.question
        if self.answer is not None:
            newer["answer"] = self.answer
        if self.until is not None:
            newer["until"] = self.until
        return store.list_runs(
            status=self.status, loop=self.loop, eval_id=self.eval, since=self.since, limit=limit, **newer
        )
