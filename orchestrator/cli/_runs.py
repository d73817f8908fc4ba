"""`run`, `resume`, `tail`, `show`, `reduce` and `validate`: a run and its record."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anyio
from pydantic import ValidationError

from lanefold.cli._display import describe, summary
from lanefold.cli._eval import print_summary
from lanefold.cli._eval_view import show_eval, tail_eval
from lanefold.cli._flags import seconds
from lanefold.cli._progress import EvalProgress
from lanefold.cli._shared import (
    EXIT_NO_ANSWER,
    Common,
    Handler,
    Interrupted,
    RunWatch,
    emit_result,
    error,
    interruptible,
    live,
    otel_argument,
    otel_hooks,
    store_of,
)
from lanefold.cli._tools import read_tools
from lanefold.config import (
    LoopConfig,
    config_errors,
    load_config,
)
from lanefold.coordinators import as_verifier
from lanefold.evaluate import EvalSummary, is_eval, rescore_eval
from lanefold.execution import (
    RunResult,
    Session,
    Store,
    budget_store,
    check_question,
    open_store,
    read_run,
    read_state,
    run_record,
)
from lanefold.primitives import (
    ConfigError,
    ExtractSpec,
    RunState,
)
from lanefold.primitives.events import AnyEvent
from lanefold.primitives.internal import apply

__all__ = ("add_commands",)


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Common
) -> dict[str, Handler]:
    """Add the run commands to the CLI's subcommands; the handlers by name."""
    p = sub.add_parser("run", help="run a loop config on one question")
    p.add_argument("config")
    p.add_argument("--question", required=True)
    common(p)
    p.add_argument("--run-id")
    p.add_argument(
        "--tools",
        metavar="FILE",
        help="a JSON file of the tools the run carries (OpenAI's tools list; docs/tools.md)",
    )
    p.add_argument(
        "--tool-choice",
        metavar="CHOICE",
        help="with --tools: auto, required, none, or a tool's name",
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    otel_argument(p)

    p = sub.add_parser("resume", help="continue a run from its event log")
    p.add_argument("run_id")
    common(p)
    p.add_argument("--json", action="store_true")
    otel_argument(p)

    p = sub.add_parser("tail", help="print a run's events (or an eval's finished questions)")
    p.add_argument("run_id", metavar="RUN_ID|EVAL_ID")
    common(p)
    p.add_argument("--follow", "-f", action="store_true", help="wait for new events")
    p.add_argument(
        "--wait",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="with --follow: how long to wait for a run that has not started, or "
        "for an eval that no process is running (30)",
    )
    p.add_argument("--json", action="store_true", help="raw JSON lines")

    p = sub.add_parser("show", help="summarise a run (or an eval)")
    p.add_argument("run_id", metavar="RUN_ID|EVAL_ID")
    common(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "reduce", help="reduce a finished run's lanes again (or every run of an eval), without sampling"
    )
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="the run (or --eval EVAL_ID)")
    p.add_argument(
        "--eval",
        metavar="EVAL_ID",
        help="re-reduce every run of this eval and score the new answers; written beside it as EVAL_ID.rN",
    )
    by = p.add_mutually_exclusive_group()
    by.add_argument(
        "--verifier",
        metavar="MODULE:FUNCTION",
        help="the verifier a reducer that checks candidates calls (docs/reducers.md)",
    )
    by.add_argument(
        "--verifier-command",
        metavar="CMD",
        help="a command run per candidate as the verifier (its exit code)",
    )
    p.add_argument(
        "--concurrency", type=int, default=8, metavar="Q", help="with --eval: runs reduced at once (8)"
    )
    p.add_argument(
        "--reducer", required=True, help="a registered reducer's name (docs/reducers.md) or module:Class"
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument("--extract-regex", metavar="RE", help="read answers with this regex")
    how.add_argument(
        "--extract",
        metavar="METHOD",
        help="read answers with this method (regex, last_number, boxed, json_field, json, tool_call)",
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print the new result as JSON")

    p = sub.add_parser("validate", help="check a loop config file")
    p.add_argument("config")
    common(p, runs=False)
    return {
        "run": _cmd_run,
        "resume": _cmd_resume,
        "tail": _cmd_tail,
        "show": _cmd_show,
        "reduce": _cmd_reduce,
        "validate": _cmd_validate,
    }


def _cmd_run(args: argparse.Namespace) -> int:
    check_question(args.question)
    tools = read_tools(args.tools) if args.tools is not None else None
    if tools is None and args.tool_choice is not None:
        raise ConfigError("--tool-choice: chooses among the run's tools; give them with --tools FILE")
    session = Session(args.config, runs_dir=args.runs_dir, store=args.store)  # a bad config stops here
    if args.run_id is not None:
        session.store.check_id(args.run_id)
    with live(args.json) as display:
        session.hooks += [*display, *otel_hooks(args)]
        seen = RunWatch(args.run_id)

        async def go(reason: Callable[[], str]) -> RunResult:
            async with session:
                return await session.run(
                    args.question,
                    run_id=args.run_id,
                    observer=seen,
                    stop_reason=reason,
                    tools=tools,
                    tool_choice=args.tool_choice,
                )

        result = interruptible(go, lambda: seen.value, lambda: seen.ended)
    return emit_result(result, args.json)


def _cmd_resume(args: argparse.Namespace) -> int:
    store = store_of(args)
    otel = otel_hooks(args)  # a bad --otel-endpoint is refused before the run is touched
    with live(args.json, lambda: read_state(store, args.run_id)) as display:
        seen = RunWatch(args.run_id)

        async def go(reason: Callable[[], str]) -> RunResult:
            async with Session(runs_dir=args.runs_dir, store=store, hooks=[*display, *otel]) as session:
                return await session.resume(args.run_id, observer=seen, stop_reason=reason)

        result = interruptible(go, lambda: args.run_id, lambda: seen.ended)
    return emit_result(result, args.json)


def _cmd_reduce(args: argparse.Namespace) -> int:
    if (args.run_id is None) == (args.eval is None):
        raise ConfigError("give RUN_ID or --eval EVAL_ID (one of them)")
    store = store_of(args)
    extract = None
    if args.extract_regex is not None:
        extract = _extract_spec({"method": "regex", "regex": args.extract_regex})
    elif args.extract is not None:
        extract = _extract_spec({"method": args.extract})
    command = shlex.split(args.verifier_command) if args.verifier_command is not None else None
    if args.verifier_command is not None and not command:
        raise ConfigError("--verifier-command: empty")
    if args.verifier is not None:  # found now, not after the first run was opened
        try:
            as_verifier(args.verifier)
        except ConfigError as exc:
            raise ConfigError(f"--verifier: {str(exc).split(': ', 1)[-1]}") from None
    if args.eval is not None:
        return _reduce_eval(args, store, extract, command)
    verifier: Any = args.verifier if args.verifier is not None else command

    async def go(reason: Callable[[], str]) -> RunResult:
        async with Session(runs_dir=args.runs_dir, store=store, verifier=verifier) as session:
            return await session.reduce(
                args.run_id, reducer=args.reducer, extract=extract, stop_reason=reason
            )

    result = interruptible(go, lambda: args.run_id)
    return emit_result(result, args.json)


def _reduce_eval(
    args: argparse.Namespace, store: Store, extract: ExtractSpec | None, command: list[str] | None
) -> int:
    """`reduce --eval`: every run of the eval reduced again and scored; its summary."""
    progress = EvalProgress() if not args.json and sys.stdout.isatty() else None

    async def go(reason: Callable[[], str]) -> EvalSummary:
        return await rescore_eval(
            args.eval,
            reducer=args.reducer,
            verifier=args.verifier,
            verifier_command=command,
            extract=extract,
            runs_dir=args.runs_dir,
            store=store,
            concurrency=args.concurrency,
            on_start=progress.start if progress else None,
            on_result=progress.add if progress else None,
            stop_reason=reason,
        )

    with progress or contextlib.nullcontext():
        summary = interruptible(go, lambda: args.eval)
    if args.json:
        print(json.dumps(summary.model_dump(mode="json")))
    else:
        print_summary(summary)
    return 0


def _extract_spec(raw: dict[str, Any]) -> ExtractSpec:
    try:
        return ExtractSpec.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "--extract-regex" if "regex" in raw and raw.get("method") == "regex" else "--extract"
        raise ConfigError(f"{where}: {first['msg']}") from None


def _cmd_tail(args: argparse.Namespace) -> int:
    store = store_of(args)
    if is_eval(store, args.run_id):
        return _follow_eval(args, store)
    log = store.reader(args.run_id)

    def show(event: AnyEvent) -> None:
        print(event.model_dump_json(by_alias=True) if args.json else describe(event), flush=True)

    if not args.follow:
        events, _, _ = read_run(store, args.run_id)  # checked as show checks it, before a line
        for event in events:
            show(event)
        return 0

    where = store.location(args.run_id)
    state = RunState(source=where, expected_run_id=args.run_id)

    async def follow() -> int:
        events = log.follow()
        try:
            first: list[AnyEvent] = []
            with anyio.move_on_after(args.wait):  # the log waits for the run to appear
                first.append(await anext(events))
            if not first:
                raise ConfigError(f"{where}: run {args.run_id!r} did not appear within {args.wait:g} s")
            apply(state, first[0])  # refuses a line that is not this run's own, naming it
            show(first[0])
            async for event in events:
                apply(state, event)
                show(event)
        finally:
            if isinstance(events, AsyncGenerator):
                await events.aclose()
        return 0

    try:
        return interruptible(lambda _: follow(), lambda: None)
    except (Interrupted, KeyboardInterrupt):  # the latter: Ctrl-C before the loop took signals
        return 0  # Ctrl-C is how a follower is meant to end


def _follow_eval(args: argparse.Namespace, store: Store) -> int:
    def out(line: str) -> None:
        print(line, flush=True)

    try:
        return tail_eval(args, out, store)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how a follower is meant to end


def _cmd_show(args: argparse.Namespace) -> int:
    store = store_of(args)
    if is_eval(store, args.run_id):
        return show_eval(args, print, store)
    record = run_record(store, args.run_id)
    if "question" in record:  # a finished run's result
        if args.json:
            print(json.dumps(record))
        else:
            result = RunResult.model_validate(record)
            summary(result)
            if "asked" in record:  # a gateway's run: who asked, for which model
                print("asked: " + ", ".join(f"{name} {value}" for name, value in record["asked"].items()))
            for data in record["reductions"][1:]:
                print(
                    f"reduction {data['reduction']}: {data['reducer']} -> "
                    f"{data['winner']!r} (lane {data['winner_lane']})"
                )
        return EXIT_NO_ANSWER if record["status"] == "no_answer" else 0
    print(json.dumps(record) if args.json else "\n".join(f"{key}: {value}" for key, value in record.items()))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    """Every check `run` makes before it creates a run, without creating one or connecting
    anywhere: the config, the preflight, what building its backends would refuse (API keys),
    and its store (`--store` or `[store]`: the password's variable, a shared budget's need of
    PostgreSQL). A shared budget's existence is the one check left to `run` (it needs the
    database)."""
    errors = config_errors(args.config)
    try:
        config: LoopConfig | None = load_config(args.config)
    except ConfigError:
        config = None  # its errors are listed above
    if config is not None:
        errors += _store_errors(config, args.config, args.store)
    if errors:  # every one, a line each; the count once there are several
        for line in errors:
            error("validate", line)
        if len(errors) > 1:
            error("validate", f"{len(errors)} errors")
        return ConfigError.exit_code
    assert config is not None
    keys = ", ".join(
        f"{key}={value}"
        for key, value in config.loop_params.model_dump(mode="json").items()
        if key in ("k", "reducer", "rule", "steps", "agents", "rounds")
    )
    print(
        f"{args.config}: ok ({config.loop.coordinator}"
        f"{', ' + keys if keys else ''}, backend={config.backend.kind})"
    )
    return 0


def _store_errors(config: LoopConfig, source: str, url: str | None) -> list[str]:
    """What `run` refuses of the store before it creates the run, as the store is opened."""
    errors = []
    try:
        store = open_store(url or config.store.url, ".", config.store.password_env)
    except ConfigError as exc:
        return [f"{source}: {exc}"]
    errors += [f"{source}: {missing}" for missing in store.missing()]
    if config.budget.shared is not None:
        try:
            budget_store(store)
        except ConfigError as exc:
            errors.append(f"{source}: {exc}")
    return errors
