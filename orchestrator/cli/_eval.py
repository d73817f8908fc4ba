"""`orchestrator eval`: run a loop config over a dataset, scored against gold answers.

    orchestrator eval CONFIG --dataset PATH_OR_SPEC [--limit N] [--concurrency Q] [--eval-id ID]
                      [--runs-dir DIR] [--question-field F] [--answer-field F] [--scorer S] [--json]
    orchestrator eval --resume ID [--concurrency Q] [--runs-dir DIR] [--json]
    ... [--executor ray [--ray-address ADDR] [--workers N]]   (either form: questions on Ray)

Exit codes as for `run`: 0 the eval finished (failed questions are rows, not an exit code),
2 bad input (nothing written), 130/143 interrupted (continue with `--resume ID`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from lanefold.cli._flags import some_seconds
from lanefold.cli._progress import EvalProgress
from lanefold.cli._shared import SIGNAL_EXIT, Interrupted, error, interruptible, otel_argument, otel_hooks
from lanefold.config import DEFAULT_EXECUTOR, LoopConfig, config_hash, load_config, parse_config
from lanefold.evaluate import (
    TOKEN_LINES,
    DatasetSpec,
    EvalManifest,
    EvalSummary,
    read_manifest,
    resume_hint,
    run_eval,
)
from lanefold.execution import CONNECT_TIMEOUT_S, new_run_id, open_store, resolve_executor
from lanefold.primitives import ConfigError, LanefoldError

if TYPE_CHECKING:
    from lanefold.execution import Executor

__all__ = ("add_commands", "add_parser", "command", "print_summary")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add `eval` to the `orchestrator` command's subparsers."""
    p = sub.add_parser("eval", help="run a loop config over a dataset and score it")
    otel_argument(p)
    p.add_argument("config", nargs="?", help="the loop config (left out with --resume)")
    p.add_argument(
        "--dataset",
        metavar="PATH_OR_SPEC",
        help="a .jsonl or .csv file, bigbench:<task path>, openai-evals:<name>, "
        "bfcl:<category> or humaneval (`orchestrator datasets` lists them)",
    )
    p.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="only the first N questions (a larger "
        "N later, with the same --eval-id or --resume, grows the eval)",
    )
    p.add_argument(
        "--concurrency", type=int, default=8, metavar="Q", help="questions in flight at once (default 8)"
    )
    p.add_argument(
        "--eval-id",
        metavar="ID",
        help="name the eval (default: a new sortable id); the same id again continues it",
    )
    p.add_argument(
        "--resume", metavar="ID", help="continue the eval ID with the config and dataset it was started with"
    )
    p.add_argument("--question-field", metavar="F", help="the question's field (default question)")
    p.add_argument("--answer-field", metavar="F", help="the gold answer's field (default answer)")
    p.add_argument(
        "--scorer", metavar="S", help="exact (default), numeric[:TOL], humaneval[:SECONDS] or module:function"
    )
    p.add_argument(
        "--executor",
        default=DEFAULT_EXECUTOR,
        metavar="NAME",
        help="where questions run: local (this process, the default), ray (Ray "
        "workers), another registered executor or module:attr",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="with --executor ray: the cluster "
        "to join ('auto': the one running here; default: start one on this machine)",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="with --executor ray: workers, each one Session and one loaded backend (default 2)",
    )
    p.add_argument(
        "--ray-connect-timeout",
        type=some_seconds,
        metavar="SECONDS",
        help=f"with --ray-address: how long joining the cluster may take (default {CONNECT_TIMEOUT_S:g})",
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print summary.json")


def command(args: argparse.Namespace) -> int:
    """Run (or continue) the eval and print its summary."""
    # The CLI's own helpers; imported here because `orchestrator.cli._main` imports this module.

    config: LoopConfig | str
    if args.resume is not None:
        eval_id = args.resume
        _refuse_with_resume(args)
        manifest = read_manifest(open_store(args.store, args.runs_dir), eval_id)
        config = _recorded_config(manifest)
        limit = args.limit if args.limit is not None else manifest.limit  # --limit grows it
        dataset = DatasetSpec(manifest.dataset, manifest.question_field, manifest.answer_field, limit)
        if dataset.spec == "<items>":
            raise ConfigError(
                f"--resume: eval {eval_id} was given its questions in Python; "
                f"continue it with orchestrator.evaluate.run_eval"
            )
        scorer: str | None = manifest.scorer
    else:
        if args.config is None or args.dataset is None:
            raise ConfigError("CONFIG and --dataset are required (or --resume ID)")
        config = args.config
        dataset = DatasetSpec(args.dataset, args.question_field, args.answer_field, args.limit)
        eval_id = args.eval_id or new_run_id()
        scorer = args.scorer
    executor = _executor(args)  # flags checked and Ray found before the dataset is read
    items = dataset.load()
    progress = EvalProgress() if not args.json and sys.stdout.isatty() else None

    async def go(reason: Callable[[], str]) -> EvalSummary:
        return await run_eval(
            config,
            items,
            eval_id=eval_id,
            runs_dir=args.runs_dir,
            concurrency=args.concurrency,
            scorer=scorer,
            dataset=dataset,
            on_start=progress.start if progress else None,
            on_result=progress.add if progress else None,
            stop_reason=reason,
            store=args.store,
            executor=executor,
            hooks=otel_hooks(args),
        )

    try:
        held = (
            executor if isinstance(executor, contextlib.AbstractContextManager) else contextlib.nullcontext()
        )
        with progress or contextlib.nullcontext(), held:
            connect = getattr(executor, "connect", None)  # an executor may join a cluster
            if connect is not None:
                connect()  # a cluster not there is said before anything is written
            summary = interruptible(go, lambda: eval_id)
    except Interrupted as stop:
        error(
            "eval",
            f"interrupted by {stop.signal_name}; continue with: "
            f"{resume_hint(eval_id, args.runs_dir, args.store)}",
        )
        return SIGNAL_EXIT.get(stop.signal_name, 130)
    except LanefoldError as exc:
        if not exc.machine_failure:
            raise
        # The finished questions are recorded; the rest resume from their runs' logs.
        error(
            "eval",
            f"{exc}; the eval stopped: once that is mended, continue with: "
            f"{resume_hint(eval_id, args.runs_dir, args.store)}",
        )
        return exc.exit_code
    if args.json:
        print(json.dumps(summary.model_dump(mode="json")))
    else:
        print_summary(summary)
    return 0


def _executor(args: argparse.Namespace) -> Executor | None:
    """The executor the flags ask for, through the registry (None: this process); an unknown
    name, or a flag the executor does not take, is a ConfigError naming the flag."""
    given = {
        keyword: (flag, value)
        for flag, keyword, value in (
            ("--ray-address", "address", args.ray_address),
            ("--workers", "workers", args.workers),
            ("--ray-connect-timeout", "connect_timeout_s", args.ray_connect_timeout),
        )
        if value is not None
    }
    executor = resolve_executor(args.executor, key="--executor", options=given)
    # The terminal is the command's: Ray's notice that a local cluster has token auth on
    # (it has; that is the safe default) is not the user's business on every eval.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    return executor


def _refuse_with_resume(args: argparse.Namespace) -> None:
    for flag, value in (
        ("CONFIG", args.config),
        ("--dataset", args.dataset),
        ("--eval-id", args.eval_id),
        ("--question-field", args.question_field),
        ("--answer-field", args.answer_field),
        ("--scorer", args.scorer),
    ):
        if value is not None:
            raise ConfigError(f"--resume: {flag} comes from the eval's eval.json; leave it out")


def _recorded_config(manifest: EvalManifest) -> LoopConfig | str:
    """The config file the eval started from while it still says the same, else the config
    the manifest recorded (a file edited since is not what the eval ran), its plug-ins looked
    up beside that file all the same."""
    path = manifest.config_path
    if path is not None:
        with contextlib.suppress(ConfigError, OSError):
            if config_hash(load_config(path)) == manifest.config_hash:
                return path
    return parse_config(
        dict(manifest.config),
        source=f"eval {manifest.eval_id}: eval.json",
        folder=Path(path).parent if path is not None else None,
    )


def print_summary(summary: EvalSummary, console: Console | None = None) -> None:
    """The summary as a table: accuracy with its interval, pass@k, lanes, tokens, spend."""
    low, high = summary.interval
    table = Table(title=f"eval {summary.eval_id}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("config", f"{summary.config} ({summary.loop})")
    table.add_row("dataset", f"{summary.dataset}, scored {summary.scorer}")
    table.add_row(
        "questions",
        f"{summary.n}: {summary.correct} correct, {summary.abstentions} abstained, {summary.failed} failed",
    )
    table.add_row("accuracy", f"{summary.accuracy:.3f}  (95% CI {low:.3f}-{high:.3f})")
    if summary.pass_at_k:
        table.add_row("pass@k", "  ".join(f"@{k} {value:.3f}" for k, value in summary.pass_at_k.items()))
    table.add_row("mean lanes", f"{summary.mean_lanes:.2f}")
    table.add_row(
        "tokens",
        "  ".join(f"{line} {summary.tokens[line]}" for line in TOKEN_LINES if summary.tokens.get(line))
        or "0",
    )
    table.add_row("cost", f"${summary.cost['total']:.6f} (${summary.mean_cost:.6f} a question)")
    table.add_row("time", f"{summary.wall_s:.1f} s wall, {summary.seconds:.1f} s sampling")
    table.add_row("results", summary.results)
    (console or Console()).print(table)


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Callable[..., None]
) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `eval` to the CLI's subcommands; its handler by name."""
    add_parser(sub, common)
    return {"eval": command}
