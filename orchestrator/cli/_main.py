"""The `orchestrator` command: run, resume, reduce, tail, show, list, eval, compare, curve,
validate, schema, serve, view, budget, keys, doctor.

Exit codes: 0 done, 1 the run failed, 2 bad usage / config / log, 3 budget exhausted before
quorum, 4 the run ended without an answer, 130/143 interrupted by SIGINT/SIGTERM (resumable).
Errors are one line on stderr naming the place (file, field, line).
"""

from __future__ import annotations

try:  # the command's modules: half a second of imports, start-up as much as main() is
    import argparse
    import contextlib
    import os
    import shlex
    import sys
    from collections.abc import Callable, Sequence

    from lanefold.cli._signals import command_signals, decided, importing_quietly, pause_point

    with importing_quietly():
        import lanefold.cli._budget as budget_cli
        import lanefold.cli._compare as compare_cli
        import lanefold.cli._curve as curve_cli
        import lanefold.cli._datasets as datasets_cli
        import lanefold.cli._doctor as doctor_cli
        import lanefold.cli._eval as eval_cli
        import lanefold.cli._keys as keys_cli
        import lanefold.cli._list as list_cli
        import lanefold.cli._runs as runs
        import lanefold.cli._schema as schema_cli
        import lanefold.cli._serve as serve_cli
        import lanefold.cli._sweep as sweep_cli
        import lanefold.cli._view as view_cli
        from lanefold.cli._flags import Parser
        from lanefold.cli._shared import SIGNAL_EXIT, Handler, Interrupted, error, logging_to_stderr, where
        from lanefold.config import VERSION
        from lanefold.execution import resume_command
        from lanefold.primitives import LanefoldError

        pause_point("import")
except KeyboardInterrupt as stop:  # a signal while the command starts: nothing exists to tell of
    raise SystemExit(getattr(stop, "exit_code", 130)) from None


__all__ = ("main",)

# Commands that read or write a store take --store (the rest: --runs-dir at most).
_STORE_COMMANDS = frozenset(
    {"run", "resume", "tail", "show", "reduce", "eval", "validate", "list", "view", "serve"}
)
_GROUPS = (
    runs,
    eval_cli,
    compare_cli,
    curve_cli,
    sweep_cli,
    datasets_cli,
    budget_cli,
    keys_cli,
    list_cli,
    serve_cli,
    view_cli,
    schema_cli,
    doctor_cli,
)
_COMMANDS: dict[str, Handler] = {}


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

    for group in _GROUPS:
        _COMMANDS.update(group.add_commands(sub, common))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `orchestrator` command on `argv`; its exit code.

    `argv` None: this process's own command line, so the process is the command's: from here
    to its exit a signal is answered as `orchestrator.cli._signals` says (before anything is
    recorded, exit 130/143 with at most a line; once the command's end is decided, ignored,
    so a run whose record is complete exits with its own code). Given `argv` (a test, a
    program), the signal handlers found are put back on return.
    """
    with command_signals(own_process=argv is None):
        try:
            pause_point("start")
            args = _parser().parse_args(argv)
            with logging_to_stderr(args.verbose):
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
            return SIGNAL_EXIT.get(getattr(stop, "signal_name", "SIGINT"), 130)


def _main(args: argparse.Namespace) -> int:
    handler: Callable[[argparse.Namespace], int] = _COMMANDS[args.command]
    try:
        return handler(args)
    except LanefoldError as exc:
        error(args.command, str(exc))
        return exc.exit_code
    except Interrupted as stop:
        error(
            args.command,
            f"interrupted by {stop.signal_name}"
            + (
                f"; continue with: {_continuation(args, stop.run_id)}"
                if stop.run_id
                else " before the run started"
            ),
        )
        return SIGNAL_EXIT.get(stop.signal_name, 130)
    except KeyboardInterrupt as stop:  # while the command started, before its work began
        decided()
        name = getattr(stop, "signal_name", "SIGINT")
        error(args.command, f"interrupted by {name}")
        return SIGNAL_EXIT.get(name, 130)


def _continuation(args: argparse.Namespace, run_id: str) -> str:
    """The command that finishes what a signal stopped, as it can be pasted: `resume` for a
    run; for a re-reduction the same `reduce` again (it finishes the reduction it opened)."""
    if args.command != "reduce":
        return resume_command(run_id, where(args))
    target = ["--eval", args.eval] if getattr(args, "eval", None) else [run_id]
    words = ["orchestrator", "reduce", *target, "--reducer", args.reducer]
    if getattr(args, "verifier", None) is not None:
        words += ["--verifier", args.verifier]
    if getattr(args, "verifier_command", None) is not None:
        words += ["--verifier-command", args.verifier_command]
    if args.extract_regex is not None:
        words += ["--extract-regex", args.extract_regex]
    if args.extract is not None:
        words += ["--extract", args.extract]
    return shlex.join(words + where(args))
