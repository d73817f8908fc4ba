"""`orchestrator keys create|list|show|update|revoke`: the gateway's keys kept in the store, on
PostgreSQL (`--store URL`) or beside the runs (`--runs-dir DIR`), which a gateway started with
`serve --store-keys` reads within a second.

`create` prints the new key once (the store keeps its SHA-256 only); its budget limits are the
named budget `key:<name>`'s, its tokens and requests a minute and its loops the key's record.
`update` changes what it is given (`none` lifts a limit); `revoke` refuses the key from the
gateway's next read on. `show` prints what `GET /v1/usage` answers the key.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from lanefold.cli._budget import limit_type
from lanefold.execution import budget_store, open_store
from lanefold.primitives import ConfigError, KeyRecord, StoredKey, check_key_name
from lanefold.primitives.internal import key_budget_name
from lanefold.serve import key_digest, key_report, key_store, new_key

__all__ = ("add_commands",)

Handler = Callable[[argparse.Namespace], int]
_UNSET: Any = object()
_BUDGET = ("max_tokens", "max_cost_usd", "max_requests")
_RECORD = ("tpm", "rpm", "max_concurrency")


def add_commands(sub: Any, common: Callable[..., None] | None = None) -> dict[str, Handler]:
    """Add `keys` (create, list, show, update, revoke) to the CLI's subcommands."""
    p = sub.add_parser("keys", help="the gateway's keys kept in the store (serve --store-keys)")
    verbs = p.add_subparsers(dest="verb", required=True)
    for verb, text in (
        ("create", "make a key and print it once (only its hash is kept)"),
        ("list", "list the keys"),
        ("show", "a key's limits, spend, refusals and last use"),
        ("update", "change a key's loops or limits"),
        ("revoke", "refuse a key from the gateway's next read on"),
    ):
        v = verbs.add_parser(verb, help=text)
        if verb != "list":
            v.add_argument("name")
        v.add_argument(
            "--store", metavar="URL", help="the PostgreSQL database (default: files under --runs-dir)"
        )
        v.add_argument("--runs-dir", default="runs", help="where run logs live (default ./runs)")
        if verb in ("create", "update"):
            v.add_argument(
                "--loops", nargs="+", default=_UNSET, metavar="MODEL", help="models it may call (* all)"
            )
            v.add_argument("--max-tokens", type=limit_type(int), default=_UNSET, metavar="N")
            v.add_argument("--max-cost-usd", type=limit_type(float), default=_UNSET, metavar="USD")
            v.add_argument("--max-requests", type=limit_type(int), default=_UNSET, metavar="N")
            v.add_argument("--tpm", type=_positive, default=_UNSET, metavar="N", help="tokens a minute")
            v.add_argument("--rpm", type=_positive, default=_UNSET, metavar="N", help="requests a minute")
            v.add_argument("--max-concurrency", type=_positive, default=_UNSET, metavar="N")
        v.add_argument("--json", action="store_true", help="print JSON")
        v.add_argument("-v", "--verbose", action="store_true", help="log details to stderr")
    return {"keys": _keys}


def _positive(text: str) -> int | None:
    found = limit_type(int)(text)
    if found is not None and found < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1 (or 'none')")
    return None if found is None else int(found)


def _keys(args: argparse.Namespace) -> int:
    if args.verb != "list":
        check_key_name(args.name)
    opened = open_store(args.store, args.runs_dir)
    kept = key_store(opened)
    budgets = budget_store(opened, "--store")
    if args.verb == "list":
        found = kept.list_keys()
        if args.json:
            print(json.dumps([_listed(k) for k in found]))
        else:
            print(_table(found) if found else f"no keys in {opened.describe}")
        return 0
    if args.verb == "create":
        key = new_key()
        record = _record(args, KeyRecord(name=args.name, sha256=key_digest(key), created=datetime.now(UTC)))
        budgets.start_budget(key_budget_name(args.name), (0, 0.0, 0))
        kept.create_key(record)
        _set_budget(args, budgets)
        report = key_report(opened, _existing(kept, args.name, opened.describe), time.time())
        if args.json:
            print(json.dumps({"key": key, **report}))
        else:
            print(f"key {args.name}: {key}\n(shown this once: the store keeps only its SHA-256)")
        return 0
    stored = _existing(kept, args.name, opened.describe)
    if args.verb == "update":
        kept.replace_key(_record(args, stored.record))
        _set_budget(args, budgets)
    elif args.verb == "revoke":
        kept.replace_key(stored.record.model_copy(update={"revoked": True}))
    report = key_report(opened, _existing(kept, args.name, opened.describe), time.time())
    print(json.dumps(report) if args.json else render(report))
    return 0


def _existing(kept: Any, name: str, where: str) -> StoredKey:
    found: StoredKey | None = kept.read_key(name)
    if found is None:
        raise ConfigError(
            f"key {name!r}: no such key in {where} (create it with: orchestrator keys create {name})"
        )
    return found


def _record(args: argparse.Namespace, record: KeyRecord) -> KeyRecord:
    """`record` with the flags given set (checked as a record is)."""
    changes = {name: getattr(args, name) for name in _RECORD if getattr(args, name) is not _UNSET}
    if args.loops is not _UNSET:
        changes["loops"] = tuple(m for part in args.loops for m in part.split(",") if m)
    try:
        return KeyRecord.model_validate({**record.model_dump(), **changes})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ConfigError(f"key {record.name!r}: --{where.replace('_', '-')}: {error['msg']}") from None


def _set_budget(args: argparse.Namespace, budgets: Any) -> None:
    limits = {name: getattr(args, name) for name in _BUDGET if getattr(args, name) is not _UNSET}
    if limits:
        budgets.set_budget(key_budget_name(args.name), **limits)


def _listed(key: StoredKey) -> dict[str, Any]:
    r = key.record
    return {"name": r.name, "loops": list(r.loops), "tpm": r.tpm, "rpm": r.rpm, "revoked": r.revoked}


def _table(found: list[StoredKey]) -> str:
    rows = [("name", "loops", "tpm", "rpm", "status")]
    for key in found:
        r = key.record
        rows.append(
            (
                r.name,
                ",".join(r.loops),
                str(r.tpm or "-"),
                str(r.rpm or "-"),
                "revoked" if r.revoked else "active",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() for row in rows)


def _cell(value: Any, money: bool = False) -> str:
    if value is None:
        return "unlimited"
    return f"${value:.6f}" if money else str(int(value))


def render(report: dict[str, Any]) -> str:
    """`keys show` as text: the figures `GET /v1/usage` answers."""
    limits, spend, left = report["limits"], report["spend"], report["remaining"]
    status = "revoked" if report["revoked"] else "active"
    lines = [
        f"key {report['name']} ({status}): loops {', '.join(report['loops'])}; last used "
        f"{report['last_used'] or 'never'}",
        f"  tokens    spent {spend['tokens']} of {_cell(limits['max_tokens'])}",
        f"  cost      spent ${spend['cost_usd']:.6f} of {_cell(limits['max_cost_usd'], True)}",
        f"  requests  spent {spend['requests']} of {_cell(limits['max_requests'])}",
        f"  per minute: tpm {_cell(limits['tpm'])} ({_cell(left['tokens_this_minute'])} left), "
        f"rpm {_cell(limits['rpm'])} ({_cell(left['requests_this_minute'])} left); "
        f"at once {_cell(limits['max_concurrency'])}",
        f"  refused: {report['refusals']['budget']} for the budget, "
        f"{report['refusals']['rate']} for the rates",
        f"  note: {report['tokens_note']}",
    ]
    return "\n".join(lines)
