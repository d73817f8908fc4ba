"""The store seam: where runs live. `lanefold.stores` holds the implementations (`files`, the
embedded default, and `postgres`); a store of your own is one class registered as a store.

A store keeps logs, never meaning: it creates, opens and lists runs' event logs, and the facade
folds and checks what it reads. Every store keeps one contract: one writer per run, sequence
strictly increasing, and the same refusals on read (the store conformance suite checks it).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from lanefold.primitives._budget import Room, SharedPool
from lanefold.primitives._errors import ConfigError
from lanefold.primitives._eventlog import EventLog, FsyncPolicy
from lanefold.primitives.events import AnyEvent, RunCompleted, RunStarted

__all__ = (
    "BudgetStore",
    "BudgetView",
    "EvalRecord",
    "RunStatus",
    "RunSummary",
    "Store",
    "StoreClass",
    "check_budget_name",
    "new_run_id",
    "redact_url",
    "select_runs",
    "summarize_run",
)

R = TypeVar("R")
_BUDGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

RunStatus = Literal["answered", "no_answer", "failed", "interrupted", "running", "stopped"]
"""What `list` says of a run: how it ended, or "running" (a writer holds it) or "stopped" (no
writer and no end: killed or crashed; `resume` continues it)."""


def redact_url(url: str) -> str:
    """`url` with any password replaced by `***`: what may be printed or recorded of a store's
    URL, whichever store serves it."""
    try:
        parts = urlsplit(url)
        _port = parts.port  # a port that does not parse raises here, as a host does above
    except ValueError:  # not a URL urlsplit reads: whatever stands before its last '@' goes
        scheme, sep, rest = url.partition("://")
        userinfo, at, host = rest.partition("/")[0].rpartition("@")
        return f"{scheme}{sep}***@{rest[len(userinfo) + 1 :]}" if at else url
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def check_budget_name(name: str, where: str = "budget.shared") -> str:
    """A budget's name: letters, digits and `._:-`, at most 128 characters (it names a file on
    the files store, a row on PostgreSQL), starting with a letter or digit."""
    if not isinstance(name, str) or _BUDGET_NAME.fullmatch(name) is None:
        raise ConfigError(
            f"{where}: {name!r} is not a budget name (letters, digits and ._:- only, at most 128 characters)"
        )
    return name


def new_run_id() -> str:
    """A sortable, unique, plain run id: UTC time plus 48 random bits in hex (24 gave two
    runs one id about once in a thousand seconds at 200 runs a second: a gateway's rate)."""
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """A run as a list shows it, read from its first and last events (not folded: a list of a
    thousand runs reads two thousand events, and `show` checks a run whole)."""

    run_id: str
    loop: str
    status: RunStatus
    question: str
    answer: str | None
    lanes: int  # lanes that completed
    tokens: int  # tokens paid: prefill, decode and verifier (cached prefill at its own price)
    cost_usd: float
    started: datetime
    ended: datetime | None
    agreement: float | None = None  # the winner's share of the vote, where the run reduced by one
    caller: str | None = None  # who asked, where a gateway key did (its name)
    model: str | None = None  # the model name a gateway's client asked for (the loop's name)
    request_id: str | None = None  # the gateway request's id

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        for name in ("caller", "model", "request_id"):
            if found[name] is None:
                del found[name]
        found["started"] = self.started.isoformat()
        found["ended"] = self.ended.isoformat() if self.ended else None
        return found


def summarize_run(first: AnyEvent, last: AnyEvent, *, writing: bool) -> RunSummary | None:
    """A run's summary from its first and last events; None where the first is not a
    `run.started` (not a run's log). `writing`: a writer holds the run now."""
    if not isinstance(first, RunStarted):
        return None
    data = first.data
    result: dict[str, Any] = {}
    status: RunStatus = "running" if writing else "stopped"
    if isinstance(last, RunCompleted):
        result = last.data.result
        status = "no_answer" if result.get("status") == "no_answer" else "answered"
    elif last.type == "run.failed":
        status = "failed"
    elif last.type == "run.interrupted" and not writing:
        status = "interrupted"
    usage = result.get("usage") or {}
    tokens = sum(
        int(usage.get(key) or 0)
        for key in ("prefill_tokens", "decode_tokens", "verifier_tokens", "cut_off_tokens")
    )
    ended = last.time if status not in ("running", "stopped") else None
    return RunSummary(
        run_id=first.run_id,
        loop=data.coordinator,
        status=status,
        question=data.question,
        answer=result.get("answer"),
        lanes=int(result.get("lanes_completed") or 0),
        tokens=tokens,
        cost_usd=float((result.get("cost") or {}).get("total") or 0.0),
        started=first.time,
        ended=ended,
        agreement=None if result.get("agreement") is None else float(result["agreement"]),
        caller=data.caller,
        model=data.model,
        request_id=data.request_id,
    )


def select_runs(
    found: Iterable[RunSummary],
    *,
    status: str | None = None,
    loop: str | None = None,
    eval_id: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
    model: str | None = None,
    caller: str | None = None,
    question: str | None = None,
    answer: str | None = None,
    until: datetime | None = None,
) -> list[RunSummary]:
    """`list_runs`'s filters over summaries, newest first: the one place they mean what they
    say, whichever store read the summaries. An eval's runs are `<eval_id>.<i>`; `model` is
    the model name a gateway's client asked for (a loop's name also matches its `LOOP/MODEL`s),
    `caller` the key's name; `question` and `answer` match a run whose question (answer) holds
    that text, case-insensitively (a PostgreSQL store's ILIKE); `since` and `until` bound its
    start, both inclusive."""
    asked = None if question is None else question.lower()
    said = None if answer is None else answer.lower()
    chosen = [
        s
        for s in found
        if (status is None or s.status == status)
        and (loop is None or s.loop == loop)
        and (model is None or s.model == model or (s.model or "").startswith(model + "/"))
        and (caller is None or s.caller == caller)
        and (eval_id is None or s.run_id.startswith(eval_id + "."))
        and (since is None or s.started >= since)
        and (until is None or s.started <= until)
        and (asked is None or asked in s.question.lower())
        and (said is None or (s.answer is not None and said in str(s.answer).lower()))
    ]
    chosen.sort(key=lambda s: (s.started, s.run_id), reverse=True)
    return chosen if limit is None else chosen[:limit]


class StoreClass(Protocol):
    """What `STORES` holds: a store class, `schemes` the URL schemes it serves (none: it is the
    store opened without a URL, under `runs_dir`) and `from_url` what opens one."""

    schemes: tuple[str, ...]

    def from_url(
        self, url: str | None, *, runs_dir: str | Path = "runs", password_env: str | None = None
    ) -> Store: ...


class Store(Protocol):
    """Where runs live: the one way the orchestrator creates, opens, lists and follows a run's
    log. A store holds logs; the facade folds and checks what it reads.

    A store is registered (`@register_store("name")`) as a class with `schemes`, the URL
    schemes it serves (none: the store opened without a URL), and `from_url(url, *,
    runs_dir=, password_env=)`, which opens it.
    """

    def new_id(self) -> str: ...

    def check_id(self, run_id: str) -> str: ...

    def create_log(self, run_id: str, fsync: FsyncPolicy = "barrier") -> EventLog:
        """A new run's log, holding the run's writer lock until closed."""
        ...

    def open_for_resume(self, run_id: str) -> EventLog:
        """An existing run's log to append to (RunInUseError while another writer holds it)."""
        ...

    def reader(self, run_id: str) -> EventLog:
        """The run's log to read or follow, without a lock."""
        ...

    def exists(self, run_id: str) -> bool: ...

    def writing(self, run_id: str) -> bool:
        """Whether a live process holds the run's writer lock now (read without taking it):
        an unfinished run nobody writes was cut off (a crash, a kill) and waits for resume."""
        ...

    def location(self, run_id: str) -> str:
        """Where the run's log is, for messages (never holds a password)."""
        ...

    @property
    def describe(self) -> str:
        """The store itself, for messages and for the `--store`/`--runs-dir` a hint repeats."""
        ...

    def list_runs(
        self,
        *,
        status: str | None = None,
        loop: str | None = None,
        eval_id: str | None = None,
        since: datetime | None = None,
        limit: int | None = None,
        model: str | None = None,
        caller: str | None = None,
        question: str | None = None,
        answer: str | None = None,
        until: datetime | None = None,
    ) -> list[RunSummary]:
        """Runs newest first, filtered (`select_runs` says what each filter means), read from
        what the store keeps of each run's first and last events, never from whole logs."""
        ...

    def portable(self) -> Store:
        """The same store as a worker elsewhere (another directory, another machine) opens
        it: sent by pickle to an executor's workers."""
        ...

    def eval_record(self, eval_id: str) -> EvalRecord:
        """The record of the eval `eval_id` (there or not yet), beside its questions' runs."""
        ...

    def list_evals(self) -> list[str]:
        """The ids of the evals recorded here (a manifest each), newest first."""
        ...

    def missing(self) -> list[str]:
        """What this store needs that is not installed, a line each naming the config key
        (`validate` and `run` say it before anything starts); empty when it is ready."""
        ...


class EvalRecord(Protocol):
    """An eval's own record in a store, beside its questions' runs (`<eval_id>.<i>`): the
    manifest, a row per question appended as each finishes (a crash keeps them), and the
    summary. Bodies are JSON documents the facade validates; the store keeps them whole.
    One writer per eval (`hold`), as per run."""

    eval_id: str

    @property
    def location(self) -> str:
        """Where the eval is, for messages (never a password)."""
        ...

    @property
    def manifest_location(self) -> str: ...

    @property
    def results_location(self) -> str: ...

    def exists(self) -> bool:
        """Whether a manifest is recorded."""
        ...

    def is_run(self) -> bool:
        """Whether the id names a run's log instead (an eval may not take it)."""
        ...

    def hold(self) -> AbstractContextManager[None]:
        """The eval's writer lock for the block (RunInUseError while another holds it)."""
        ...

    def running(self) -> bool:
        """Whether a writer holds the eval now."""
        ...

    def read_manifest(self) -> bytes | None: ...

    def write_manifest(self, body: bytes) -> None:
        """Record the manifest, replacing one (a grown eval), whole or not at all."""
        ...

    def read_rows(self, parse: Callable[[bytes], R], *, repair: bool = False) -> list[R]:
        """Every row in the order they landed, each through `parse` (a ValueError is a
        ConfigError naming the row). A row a crash tore is left out, and with `repair` cut
        off so the next append starts whole."""
        ...

    def append_row(self, body: bytes) -> None:
        """Append one row, whole or not at all (LogWriteError: it is not there)."""
        ...

    def read_summary(self) -> bytes | None: ...

    def write_summary(self, body: bytes, *, table: str) -> None:
        """Record the summary; `table` is the rows as CSV, which a store may keep beside it
        (files: `results.csv`)."""
        ...


@dataclass(frozen=True, slots=True)
class BudgetView:
    """A shared budget as `budget show` prints it: limits (None: unlimited), spent, held by
    live runs, the part of spent charged whole for holds of dead workers, and the requests it
    refused (runs it could not fund, which were never started)."""

    name: str
    max_tokens: int | None
    max_cost_usd: float | None
    max_requests: int | None
    spent_tokens: int
    spent_cost_usd: float
    spent_requests: int
    held_tokens: int
    held_cost_usd: float
    held_requests: int
    charged_tokens: int
    charged_cost_usd: float
    charged_requests: int
    holders: int  # run segments holding part of it now
    refusals: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def exhausted(self) -> str | None:
        """The first limit its spend has reached (nothing left under it, whatever live runs
        give back), else None."""
        for limit, cap, spent in (
            ("max_tokens", self.max_tokens, self.spent_tokens),
            ("max_cost_usd", self.max_cost_usd, self.spent_cost_usd),
            ("max_requests", self.max_requests, self.spent_requests),
        ):
            if cap is not None and cap - spent <= (1e-12 if limit == "max_cost_usd" else 0):
                return limit
        return None

    @property
    def room(self) -> Room:
        """What it can still fund: limit - spent - held, per measure (None: unlimited)."""
        return Room(
            None if self.max_tokens is None else self.max_tokens - self.spent_tokens - self.held_tokens,
            None
            if self.max_cost_usd is None
            else self.max_cost_usd - self.spent_cost_usd - self.held_cost_usd,
            None
            if self.max_requests is None
            else self.max_requests - self.spent_requests - self.held_requests,
        )


@runtime_checkable
class BudgetStore(Protocol):
    """A store that also keeps named budgets (`[budget] shared`, a gateway key's): every run
    naming one spends from it, never over it, in every segment (the names are recorded in the
    run's `run.started`).

    The contract both stores keep: a reservation is all or nothing under the budget's lock;
    settlements noted by a segment count its whole hold until written; a segment whose process
    died has its holds charged whole (`charged`) by whoever next looks; a budget's spend is
    never reset here."""

    async def open_shared_pool(self, name: str, run_id: str) -> SharedPool:
        """The run segment's side of budget `name` (a `SharedPool`), its `room` read as it
        opened; ConfigError if the store keeps no such budget."""
        ...

    def read_budget(self, name: str) -> BudgetView | None: ...

    def set_budget(
        self,
        name: str,
        *,
        max_tokens: int | None = ...,
        max_cost_usd: float | None = ...,
        max_requests: int | None = ...,
    ) -> BudgetView:
        """Create the budget or change its limits (a limit not given keeps its value, None
        lifts it; a new budget is unlimited where none is given)."""
        ...

    def start_budget(self, name: str, spent: tuple[int, float, int]) -> BudgetView:
        """The budget `name`, created unlimited with `spent` (tokens, USD, requests) already
        charged if the store has none by that name; else as it stands (nothing changed)."""
        ...

    def note_refusal(self, name: str) -> None:
        """Count one request the budget refused: a run it could not fund, never started."""
        ...
