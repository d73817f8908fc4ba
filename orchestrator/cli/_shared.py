"""What the command groups share: how an error is said, how a run is made interruptible and
its result printed, the store a command opens, the hint that repeats `--runs-dir`/`--store`."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
from pydantic import ValidationError

from lanefold.cli._display import Progress, summary
from lanefold.cli._signals import (
    EXIT_CODES,
    Watch,
    pause_point,
    watch,
)
from lanefold.config import OTEL_HOOK
from lanefold.execution import (
    RunResult,
    Store,
    open_store,
)
from lanefold.primitives import HOOKS, ConfigError, Hook, RunState, redact_url
from lanefold.primitives.events import AnyEvent
from lanefold.primitives.internal import build_hook

__all__ = (
    "EXIT_NO_ANSWER",
    "SIGNAL_EXIT",
    "Common",
    "Handler",
    "Interrupted",
    "RunWatch",
    "emit_result",
    "error",
    "interruptible",
    "live",
    "logging_to_stderr",
    "otel_argument",
    "otel_hooks",
    "store_of",
    "where",
)

T = TypeVar("T")
EXIT_NO_ANSWER = 4  # the run ended without an answer
SIGNAL_EXIT = EXIT_CODES
Handler = Callable[[argparse.Namespace], int]
Common = Callable[..., None]  # adds --runs-dir, --store and -v to a command's parser


class Interrupted(Exception):
    """A run stopped by a signal; the log says so and `resume` continues it."""

    def __init__(self, signal_name: str, run_id: str | None) -> None:
        super().__init__(signal_name)
        self.signal_name, self.run_id = signal_name, run_id


def where(args: argparse.Namespace) -> list[str]:
    """`--runs-dir` and `--store` as given (the password never), for a hint to repeat."""
    words = []
    if getattr(args, "runs_dir", "runs") != "runs":
        words += ["--runs-dir", str(args.runs_dir)]
    if getattr(args, "store", None) is not None:
        words += ["--store", redact_url(args.store)]
    return words


def error(command: str, message: str) -> None:
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
def logging_to_stderr(verbose: bool) -> Iterator[None]:
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


def store_of(args: argparse.Namespace) -> Store:
    """The store a command without a config reads and writes: `--store`, else `--runs-dir`."""
    return open_store(args.store, args.runs_dir)


def interruptible(
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
    raise Interrupted(stopped[0] if stopped else "SIGINT", run_id())


def emit_result(result: RunResult, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result.model_dump(mode="json")))
    else:
        summary(result)
    return EXIT_NO_ANSWER if result.status == "no_answer" else 0


@contextlib.contextmanager
def live(
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


class RunWatch:
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


def otel_argument(p: argparse.ArgumentParser) -> None:
    """`--otel-endpoint URL`: export each run as a trace (the `otel` hook; docs/otel.md)."""
    p.add_argument(
        "--otel-endpoint",
        metavar="URL",
        help="export each run as an OpenTelemetry trace to this OTLP/HTTP base URL "
        "(spans to URL/v1/traces; needs the otel extra)",
    )
    p.add_argument(
        "--otel-content",
        action="store_true",
        help="with --otel-endpoint: put prompts and answers on the spans "
        "(gen_ai.input.messages, gen_ai.output.messages); off by default",
    )


def otel_hooks(args: argparse.Namespace) -> list[Hook]:
    """The hook `--otel-endpoint` asks for (none without it), built as `[[hooks]] kind =
    "otel"` would be, `--otel-content` its `capture_content`; a bad URL or a missing extra is
    a one-line ConfigError naming the flag, as is `--otel-content` without an endpoint."""
    url = getattr(args, "otel_endpoint", None)
    content = bool(getattr(args, "otel_content", False))
    if url is None:
        if content:
            raise ConfigError("--otel-content: content goes on the spans of --otel-endpoint URL; give it too")
        return []
    found = HOOKS.resolve(OTEL_HOOK, key="--otel-endpoint")
    try:
        return [build_hook(found, {"endpoint": url, "capture_content": content})]
    except ValidationError as exc:
        raise ConfigError(f"--otel-endpoint: {exc.errors()[0]['msg']}") from None
    except ConfigError as exc:
        raise ConfigError(f"--otel-endpoint: {str(exc).removeprefix('hooks: ')}") from None
