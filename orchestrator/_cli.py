"""The `orchestrator` command: run, resume, tail, show, validate, schema, serve.

Exit codes: 0 done, 1 the run failed, 2 bad usage / config / log, 3 budget exhausted before
quorum. Errors are one line on stderr naming the place (file, field, line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import structlog

from orchestrator._config import LoopConfig, load_backend_config, load_config
from orchestrator._display import Progress, describe, summary
from orchestrator._result import RunResult
from orchestrator._runner import build_backend, resume, run
from orchestrator._store import RunStore
from primitives import ConfigError, JsonlEventLog, LanefoldError, fold
from primitives._events import AnyEvent

__all__ = ("main",)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=(
        "Governed coordination loops for LLM inference: sample K lanes, join, reduce."))
    sub = parser.add_subparsers(dest="command", required=True)

    def runs_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument("--runs-dir", default="runs", help="where run logs live (default ./runs)")

    p = sub.add_parser("run", help="run a loop config on one question")
    p.add_argument("config")
    p.add_argument("--question", required=True)
    runs_dir(p)
    p.add_argument("--run-id")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("-v", "--verbose", action="store_true", help="log dispatch details to stderr")

    p = sub.add_parser("resume", help="continue a run from its event log")
    p.add_argument("run_id")
    runs_dir(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("-v", "--verbose", action="store_true")

    p = sub.add_parser("tail", help="print a run's events")
    p.add_argument("run_id")
    runs_dir(p)
    p.add_argument("--follow", "-f", action="store_true", help="wait for new events")
    p.add_argument("--json", action="store_true", help="raw JSON lines")

    p = sub.add_parser("show", help="summarise a run")
    p.add_argument("run_id")
    runs_dir(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("validate", help="check a loop config file")
    p.add_argument("config")

    sub.add_parser("schema", help="print the config JSON Schema")

    p = sub.add_parser("serve", help="serve a backend as an OpenAI-compatible HTTP server")
    p.add_argument("--backend-config", required=True,
                   help="a file with a [backend] table (or only the backend's keys)")
    p.add_argument("--host", default="127.0.0.1", help="default loopback")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model-name", help="the model id clients ask for (default: the backend's)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging(getattr(args, "verbose", False))
    handler: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return handler(args)
    except LanefoldError as exc:
        print(f"orchestrator {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"orchestrator {args.command}: interrupted", file=sys.stderr)
        return 130


def _configure_logging(verbose: bool) -> None:
    # The application, not the library, decides where logs go: stderr, warnings unless -v.
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(10 if verbose else 30),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _emit_result(result: RunResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
    else:
        summary(result)


def _live(as_json: bool) -> Progress | None:
    return Progress() if (not as_json and sys.stdout.isatty()) else None


def _cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    progress = _live(args.json)
    with progress or _Null():
        result = anyio.run(lambda: run(config, args.question, runs_dir=args.runs_dir,
                                       run_id=args.run_id,
                                       observer=progress.observe if progress else None))
    _emit_result(result, args.json)
    return 0


def _cmd_resume(args: argparse.Namespace) -> int:
    progress = _live(args.json)
    with progress or _Null():
        result = anyio.run(lambda: resume(args.run_id, runs_dir=args.runs_dir,
                                          observer=progress.observe if progress else None))
    _emit_result(result, args.json)
    return 0


def _cmd_tail(args: argparse.Namespace) -> int:
    path = RunStore(args.runs_dir).events_path(args.run_id)
    log = JsonlEventLog(path)

    def show(event: AnyEvent) -> None:
        line = (event.model_dump_json(by_alias=True) if args.json
                else describe(event))
        print(line, flush=True)

    if not args.follow:
        RunStore(args.runs_dir).existing(args.run_id)
        for event in log.read():
            show(event)
        return 0

    async def follow() -> None:
        async for event in log.follow():
            show(event)

    anyio.run(follow)
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    path = RunStore(args.runs_dir).existing(args.run_id)
    events = list(JsonlEventLog(path).read())
    started = next((e for e in events if e.type == "run.started"), None)
    if started is None:
        raise ConfigError(f"{path}: the log has no run.started event")
    state = fold(events, LoopConfig.model_validate(started.data.config).pricing)
    if state.result is not None:
        _emit_result(RunResult.model_validate(state.result), args.json)
        return 0
    partial: dict[str, Any] = {
        "run_id": state.run_id, "status": "failed" if state.failure else "unfinished",
        "error": state.failure.message if state.failure else None,
        "lanes_completed": sum(len(w.completed()) for w in state.waves.values()),
        "lanes_failed": sum(len(w.failed()) for w in state.waves.values()),
        "lanes_in_flight": len(state.in_flight()), "events": str(path)}
    print(json.dumps(partial) if args.json else
          "\n".join(f"{key}: {value}" for key, value in partial.items()))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    print(f"{args.config}: ok ({config.loop.coordinator}, k={config.loop.k}, "
          f"backend={config.backend.kind}, reducer={config.loop.reducer})")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from orchestrator._serve import serve  # the `serve` extra: starlette and uvicorn

    backend = build_backend(load_backend_config(args.backend_config))
    serve(backend, model_name=args.model_name or backend.name, host=args.host, port=args.port)
    return 0


def _cmd_schema(args: argparse.Namespace) -> int:
    print(json.dumps(LoopConfig.model_json_schema(), indent=2))
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _cmd_run, "resume": _cmd_resume, "tail": _cmd_tail, "show": _cmd_show,
    "validate": _cmd_validate, "schema": _cmd_schema, "serve": _cmd_serve,
}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
