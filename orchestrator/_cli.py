"""The `orchestrator` command: run, resume, reduce, tail, show, list, eval, compare, curve,
validate, schema, serve, budget.

Exit codes: 0 done, 1 the run failed, 2 bad usage / config / log, 3 budget exhausted before
quorum, 4 the run ended without an answer, 130/143 interrupted by SIGINT/SIGTERM (resumable).
Errors are one line on stderr naming the place (file, field, line).
"""

from __future__ import annotations

try:  # the command's modules: half a second of imports, start-up as much as main() is
    import argparse
    import contextlib
    import json
    import logging
    import os
    import shlex
    import sys
    from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
    from typing import Any, TypeVar

    from lanefold._signals import (
        EXIT_CODES,
        Watch,
        command_signals,
        decided,
        importing_quietly,
        pause_point,
        watch,
    )

    with importing_quietly():
        import anyio

        from lanefold._budget_cli import add_commands as add_budget_commands
        from lanefold._config import (
            VERSION,
            LoopConfig,
            backend_errors,
            backend_preflight_errors,
            config_errors,
            load_backend_config,
            load_config,
        )
        from lanefold._defaults import DEFAULT_LOOP
        from lanefold._display import Progress, describe, summary
        from lanefold._flags import Parser, seconds
        from lanefold._fleet_budget import budget_store
        from lanefold._list_cli import add_commands as add_list_commands
        from lanefold._result import RunResult
        from lanefold._runner import build_backend, check_question
        from lanefold._session import Session
        from lanefold._store import Store, open_store, read_run, read_state
        from lanefold.evaluate import add_commands, is_eval, show_eval, tail_eval
        from lanefold.primitives import (
            BACKENDS,
            ConfigError,
            ExtractSpec,
            LanefoldError,
            RunState,
            loop_names,
            redact_url,
            resolve_loop,
        )
        from lanefold.primitives.events import AnyEvent
        from lanefold.primitives.internal import apply
        from lanefold.serve import (
            api_key_from,
            count,
            is_loopback,
            port_number,
            require_extra,
            serve,
        )

        pause_point("import")
except KeyboardInterrupt as stop:  # a signal while the command starts: nothing exists to tell of
    raise SystemExit(getattr(stop, "exit_code", 130)) from None

__all__ = ("main",)

T = TypeVar("T")
EXIT_NO_ANSWER = 4
_STORE_COMMANDS = frozenset({"run", "resume", "tail", "show", "reduce", "eval", "validate", "list"})
_SIGNAL_EXIT = EXIT_CODES


def _parser() -> argparse.ArgumentParser:
    called = os.path.basename(sys.argv[0]) if sys.argv else ""
    parser = Parser(
        prog="lanefold" if called == "lanefold" else "orchestrator",
        description=("Governed coordination loops for LLM inference: sample K lanes, join, reduce."),
    )
    parser.add_argument("--version", action="version", version=f"lanefold {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, *, runs: bool = True) -> None:
        if runs:
            p.add_argument("--runs-dir", default="runs", help="where run logs live (default ./runs)")
        if p.prog.split()[-1] in _STORE_COMMANDS:
            p.add_argument(
                "--store",
                metavar="URL",
                help="record runs in this PostgreSQL "
                "database (postgresql://...; default: the config's [store] url, "
                "else files under --runs-dir)",
            )
        p.add_argument(
            "-v", "--verbose", action="store_true", help="log details (dispatch, retries) to stderr"
        )

    p = sub.add_parser("run", help="run a loop config on one question")
    p.add_argument("config")
    p.add_argument("--question", required=True)
    common(p)
    p.add_argument("--run-id")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")

    p = sub.add_parser("resume", help="continue a run from its event log")
    p.add_argument("run_id")
    common(p)
    p.add_argument("--json", action="store_true")

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

    p = sub.add_parser("reduce", help="reduce a finished run's lanes again, without sampling")
    p.add_argument("run_id")
    p.add_argument(
        "--reducer", required=True, help="a registered reducer's name (docs/reducers.md) or module:Class"
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument("--extract-regex", metavar="RE", help="read answers with this regex")
    how.add_argument(
        "--extract",
        metavar="METHOD",
        help="read answers with this method (regex, last_number, boxed, json_field)",
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print the new result as JSON")

    p = sub.add_parser("validate", help="check a loop config file")
    p.add_argument("config")
    common(p, runs=False)

    p = sub.add_parser("schema", help="print the config JSON Schema")
    common(p, runs=False)

    _COMMANDS.update(add_commands(sub, common))  # eval, compare, curve
    _COMMANDS.update(add_budget_commands(sub))  # budget set, budget show
    _COMMANDS.update(add_list_commands(sub, common))  # list

    p = sub.add_parser("serve", help="serve a backend as an OpenAI-compatible HTTP server")
    p.add_argument(
        "--backend-config", required=True, help="a file with a [backend] table (or only the backend's keys)"
    )
    p.add_argument("--host", default="127.0.0.1", help="default loopback")
    p.add_argument("--port", type=port_number, default=8000)
    p.add_argument("--model-name", help="the model id clients ask for (default: the backend's)")
    p.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="clients must send 'Authorization: "
        "Bearer <key>' with this environment variable's value, else 401",
    )
    p.add_argument(
        "--max-body-bytes",
        type=count,
        default=1 << 20,
        metavar="BYTES",
        help="larger request bodies get 413, cut off as they arrive (1 MiB)",
    )
    p.add_argument(
        "--max-waiting",
        type=count,
        metavar="N",
        help="requests waiting beyond "
        "the backend's running batch; more get 429 with Retry-After (default: any)",
    )
    common(p, runs=False)
    return parser


class _Interrupted(Exception):
    """A run stopped by a signal; the log says so and `resume` continues it."""

    def __init__(self, signal_name: str, run_id: str | None) -> None:
        super().__init__(signal_name)
        self.signal_name, self.run_id = signal_name, run_id


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `orchestrator` command on `argv`; its exit code.

    `argv` None: this process's own command line, so the process is the command's: from here
    to its exit a signal is answered as `orchestrator._signals` says (before anything is
    recorded, exit 130/143 with at most a line; once the command's end is decided, ignored,
    so a run whose record is complete exits with its own code). Given `argv` (a test, a
    program), the signal handlers found are put back on return.
    """
    with command_signals(own_process=argv is None):
        try:
            pause_point("start")
            args = _parser().parse_args(argv)
            with _logging_to_stderr(args.verbose):
                try:
                    pause_point("command")
                    code = _main(args)
                    decided()
                    pause_point("end")
                    return code
                except BrokenPipeError:  # `... | head`: the reader left; say nothing more
                    with contextlib.suppress(OSError):
                        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                    return 0
        except KeyboardInterrupt as stop:  # before the command was under way: nothing to tell
            decided()
            return _SIGNAL_EXIT.get(getattr(stop, "signal_name", "SIGINT"), 130)


def _main(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return handler(args)
    except LanefoldError as exc:
        _error(args.command, str(exc))
        return exc.exit_code
    except _Interrupted as stop:
        _error(
            args.command,
            f"interrupted by {stop.signal_name}"
            + (
                f"; continue with: {_continuation(args, stop.run_id)}"
                if stop.run_id
                else " before the run started"
            ),
        )
        return _SIGNAL_EXIT.get(stop.signal_name, 130)
    except KeyboardInterrupt as stop:  # while the command started, before its work began
        decided()
        name = getattr(stop, "signal_name", "SIGINT")
        _error(args.command, f"interrupted by {name}")
        return _SIGNAL_EXIT.get(name, 130)


def _continuation(args: argparse.Namespace, run_id: str) -> str:
    """The command that finishes what a signal stopped, as it can be pasted: `resume` for a
    run; for a re-reduction the same `reduce` again (it finishes the reduction it opened)."""
    words = ["orchestrator", "resume", run_id]
    if args.command == "reduce":
        words = ["orchestrator", "reduce", run_id, "--reducer", args.reducer]
        if args.extract_regex is not None:
            words += ["--extract-regex", args.extract_regex]
        if args.extract is not None:
            words += ["--extract", args.extract]
    return shlex.join(words + where(args))


def where(args: argparse.Namespace) -> list[str]:
    """`--runs-dir` and `--store` as given (the password never), for a hint to repeat."""
    words = []
    if getattr(args, "runs_dir", "runs") != "runs":
        words += ["--runs-dir", str(args.runs_dir)]
    if getattr(args, "store", None) is not None:
        words += ["--store", redact_url(args.store)]
    return words


def _error(command: str, message: str) -> None:
    line = " ".join(message.split())  # one line, whatever the message held
    print(f"orchestrator {command}: {line}", file=sys.stderr)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time (a test's capture, a redirect)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


@contextlib.contextmanager
def _logging_to_stderr(verbose: bool) -> Iterator[None]:
    """The application, not the library, decides where logs go: stderr, warnings unless -v;
    for this command only, so nothing is left configured after `main` returns."""
    logger = logging.getLogger("lanefold")
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _store(args: argparse.Namespace) -> Store:
    """The store a command without a config reads and writes: `--store`, else `--runs-dir`."""
    return open_store(args.store, args.runs_dir)


def _interruptible(
    call: Callable[[Callable[[], str]], Awaitable[T]],
    run_id: Callable[[], str | None],
    ended: Callable[[], bool] = lambda: False,
) -> T:
    """Run `call` with SIGINT and SIGTERM turned into a clean stop (the run records it).

    `ended`: whether the record is complete (its last event written while `call` still
    closes what it opened); a signal then, or once `call` returned, is ignored, and the
    command ends as the record says.
    """
    stopped: list[str] = []
    outcome: list[T] = []
    failure: list[Exception] = []

    async def main(signals: Watch) -> None:
        work = anyio.CancelScope()
        async with anyio.create_task_group() as tg:

            async def watch_signals() -> None:
                # Kept until the work has stopped: a second signal while the first one's stop is
                # being recorded (lanes in flight, a judge's thread) is absorbed, not a traceback.
                async for name in signals.arrivals():
                    if not (stopped or outcome or ended()):
                        stopped.append(name)
                        work.cancel()

            tg.start_soon(watch_signals)
            with work:
                try:
                    outcome.append(await call(lambda: stopped[0] if stopped else "cancelled"))
                except Exception as exc:  # raised below, outside the task group's exception group
                    failure.append(exc)
            tg.cancel_scope.cancel()

    with watch() as signals:
        anyio.run(main, signals)
    if failure:
        raise failure[0]
    if outcome:  # it ended before a signal could stop it: the end it recorded stands
        return outcome[0]
    raise _Interrupted(stopped[0] if stopped else "SIGINT", run_id())


def _emit_result(result: RunResult, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
    else:
        summary(result)
    return EXIT_NO_ANSWER if result.status == "no_answer" else 0


@contextlib.contextmanager
def _live(
    as_json: bool,
    resuming: Callable[[], RunState] | None = None,
) -> Iterator[list[Progress]]:
    """The live display, as the hooks to give the session (none for --json or a pipe)."""
    progress = Progress() if (not as_json and sys.stdout.isatty()) else None
    if progress is None:
        yield []
        return
    if resuming is not None:
        progress.resume_from(resuming())
    with progress:
        yield [progress]


class _RunId:
    """Learns the run id from the first event it sees (a new run's id is made inside `run`),
    and whether the record is complete (its `run.completed` or `run.failed` written). An
    observer, called inline: the interrupt handling needs to know as each event is written."""

    def __init__(self, known: str | None) -> None:
        self.value = known
        self.ended = False

    def __call__(self, event: AnyEvent) -> None:
        self.value = self.value or event.run_id
        if event.type in ("run.completed", "run.failed"):
            self.ended = True
            pause_point("recorded")


def _cmd_run(args: argparse.Namespace) -> int:
    check_question(args.question)
    session = Session(args.config, runs_dir=args.runs_dir, store=args.store)  # a bad config stops here
    if args.run_id is not None:
        session.store.check_id(args.run_id)
    with _live(args.json) as display:
        session.hooks += display
        seen = _RunId(args.run_id)

        async def go(reason: Callable[[], str]) -> RunResult:
            async with session:
                return await session.run(args.question, run_id=args.run_id, observer=seen, stop_reason=reason)

        result = _interruptible(go, lambda: seen.value, lambda: seen.ended)
    return _emit_result(result, args.json)


def _cmd_resume(args: argparse.Namespace) -> int:
    store = _store(args)
    with _live(args.json, lambda: read_state(store, args.run_id)) as display:
        seen = _RunId(args.run_id)

        async def go(reason: Callable[[], str]) -> RunResult:
            async with Session(runs_dir=args.runs_dir, store=store, hooks=display) as session:
                return await session.resume(args.run_id, observer=seen, stop_reason=reason)

        result = _interruptible(go, lambda: args.run_id, lambda: seen.ended)
    return _emit_result(result, args.json)


def _cmd_reduce(args: argparse.Namespace) -> int:
    store = _store(args)
    extract = None
    if args.extract_regex is not None:
        extract = _extract_spec({"method": "regex", "regex": args.extract_regex})
    elif args.extract is not None:
        extract = _extract_spec({"method": args.extract})

    async def go(reason: Callable[[], str]) -> RunResult:
        async with Session(runs_dir=args.runs_dir, store=store) as session:
            return await session.reduce(
                args.run_id, reducer=args.reducer, extract=extract, stop_reason=reason
            )

    result = _interruptible(go, lambda: args.run_id)
    return _emit_result(result, args.json)


def _extract_spec(raw: dict[str, Any]) -> ExtractSpec:
    from pydantic import ValidationError

    try:
        return ExtractSpec.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = "--extract-regex" if "regex" in raw and raw.get("method") == "regex" else "--extract"
        raise ConfigError(f"{where}: {error['msg']}") from None


def _cmd_tail(args: argparse.Namespace) -> int:
    store = _store(args)
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
        return _interruptible(lambda _: follow(), lambda: None)
    except (_Interrupted, KeyboardInterrupt):  # the latter: Ctrl-C before the loop took signals
        return 0  # Ctrl-C is how a follower is meant to end


def _follow_eval(args: argparse.Namespace, store: Store) -> int:
    def out(line: str) -> None:
        print(line, flush=True)

    try:
        return tail_eval(args, out, store)
    except KeyboardInterrupt:
        return 0  # Ctrl-C is how a follower is meant to end


def _cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    if is_eval(store, args.run_id):
        return show_eval(args, print, store)
    _, state, _ = read_run(store, args.run_id)
    reductions = [data.model_dump(mode="json") for _, data in sorted(state.reductions.items())]
    if state.result is not None:
        result = RunResult.model_validate(state.result)
        if args.json:
            print(json.dumps({**result.model_dump(mode="json"), "reductions": reductions}))
        else:
            summary(result)
            for data in reductions[1:]:
                print(
                    f"reduction {data['reduction']}: {data['reducer']} -> "
                    f"{data['winner']!r} (lane {data['winner_lane']})"
                )
        return EXIT_NO_ANSWER if result.status == "no_answer" else 0
    status = "failed" if state.failure else "interrupted" if state.interrupted else "unfinished"
    partial: dict[str, Any] = {
        "run_id": state.run_id,
        "status": status,
        "error": state.failure.message if state.failure else None,
        "lanes_completed": sum(len(w.completed()) for w in state.waves.values()),
        "lanes_failed": sum(len(w.failed()) for w in state.waves.values()),
        "lanes_in_flight": len(state.in_flight()),
        "lanes_interrupted": sum(
            1 for w in state.waves.values() for s in w.lanes.values() if s.status == "interrupted"
        ),
        "events": store.location(args.run_id),
        "reductions": reductions,
    }
    print(
        json.dumps(partial) if args.json else "\n".join(f"{key}: {value}" for key, value in partial.items())
    )
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
        for error in errors:
            _error("validate", error)
        if len(errors) > 1:
            _error("validate", f"{len(errors)} errors")
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


def _cmd_serve(args: argparse.Namespace) -> int:
    require_extra()  # starlette and uvicorn: the serve extra, or its install line
    key = api_key_from(args.api_key_env)
    if key is None and not is_loopback(args.host):
        _error(
            "serve",
            f"warning: listening on {args.host} without --api-key-env: anyone who "
            "can reach this port can use the model",
        )
    config = load_backend_config(args.backend_config)
    # What a run's preflight would say, said before the model loads (or the server starts).
    errors = [
        *backend_errors(config, args.backend_config),
        *backend_preflight_errors(config, args.backend_config),
    ]
    if errors:
        raise ConfigError(errors[0])
    backend = build_backend(config)
    serve(
        backend,
        model_name=args.model_name or backend.name,
        host=args.host,
        port=args.port,
        api_key=key,
        max_body_bytes=args.max_body_bytes,
        max_waiting=args.max_waiting,
    )
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(config_schema(), indent=2))
    return 0


def config_schema() -> dict[str, Any]:
    """The config's JSON Schema: `[loop]` one of each registered loop's keys, `[backend]`
    (and `[judge.backend]`) one of each registered backend's."""
    schema = LoopConfig.model_json_schema()
    defs = schema.setdefault("$defs", {})
    shared = defs.get("LoopSection", {})
    variants = []
    for name in loop_names():
        params = resolve_loop(name).Params.model_json_schema()
        defs.update(params.pop("$defs", {}))
        properties = {**shared.get("properties", {}), **params.get("properties", {})}
        properties["coordinator"] = {"const": name, "default": DEFAULT_LOOP}
        variants.append(
            {
                "title": f"[loop] of {name}",
                "type": "object",
                "properties": properties,
                "additionalProperties": False,
            }
        )
    defs["LoopSection"] = {
        "title": "LoopSection",
        "description": shared.get("description", ""),
        "oneOf": variants,
    }
    defs["BackendSection"] = {
        "title": "BackendSection",
        "oneOf": backend_variants(defs),
        "description": "a registered backend's keys, by kind",
    }
    ref = {"$ref": "#/$defs/BackendSection"}
    schema["properties"]["backend"] = ref
    judge = defs["JudgeSection"]["properties"]
    judge["backend"] = {"anyOf": [ref, {"type": "null"}], "default": None}
    return schema


def backend_variants(defs: dict[str, Any]) -> list[dict[str, Any]]:
    """One schema for each registered backend's keys (`kind` its name); its definitions are
    added to `defs`."""
    variants = []
    for name, model in BACKENDS.items():
        keys = model.model_json_schema()
        defs.update(keys.pop("$defs", {}))
        properties = {**keys.get("properties", {}), "kind": {"const": name}}
        variants.append(
            {
                "title": f"[backend] of {name}",
                "type": "object",
                "description": keys.get("description", ""),
                "properties": properties,
                "required": sorted({"kind", *keys.get("required", ())}),
                "additionalProperties": False,
            }
        )
    return variants


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run,
    "resume": _cmd_resume,
    "tail": _cmd_tail,
    "show": _cmd_show,
    "validate": _cmd_validate,
    "schema": _cmd_schema,
    "serve": _cmd_serve,
    "reduce": _cmd_reduce,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
