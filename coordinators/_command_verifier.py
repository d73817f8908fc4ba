"""A command as a verifier: the candidate text on stdin, its exit status and stdout the verdict.

It lives beside the reducers that call verifiers, not in primitives: it starts processes. It is
the built-in verifier `command` (`[judge] verifier = "command:python check.py"`, the same as
`verifier_command = ["python", "check.py"]`), registered as every kind's built-ins are.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc

from lanefold.primitives import (
    CallableVerifier,
    ConfigError,
    Verdict,
    Verifier,
    VerifierFn,
    check_verifier_limits,
    import_verifier,
    one_line,
    register_verifier,
)

__all__ = ("CommandVerifier", "as_verifier")

_POSIX = os.name == "posix"


@register_verifier("command")
class CommandVerifier:
    """A command as a Verifier: the candidate text on stdin, exit status 0 passes.

    The score is the number on the last non-empty line of stdout, else 1.0 on exit 0 and 0.0
    otherwise. The question and extracted answer arrive as the environment variables
    LANEFOLD_QUESTION and LANEFOLD_ANSWER. Past `timeout_s` the command (and, on POSIX, its
    process group, so a shell's children go too) is killed and reaped.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float | None = 30.0,
        max_concurrency: int = 4,
        cwd: str | Path | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(argv, str | bytes):
            raise ConfigError("judge.verifier_command: must be a list of strings, not one string")
        if not argv:
            raise ConfigError("judge.verifier_command: must not be empty")
        if not all(isinstance(arg, str) for arg in argv):
            raise ConfigError("judge.verifier_command: every item must be a string")
        check_verifier_limits(timeout_s, max_concurrency)
        self._argv = tuple(argv)
        self.name = name or "command:" + shlex.join(self._argv)
        self._cwd = cwd
        self._timeout_s = timeout_s
        self._limiter = anyio.CapacityLimiter(max_concurrency)

    def __repr__(self) -> str:
        return f"CommandVerifier({self.name!r}, timeout_s={self._timeout_s})"

    @classmethod
    def from_spec(
        cls, argument: str | None, *, timeout_s: float | None = 30.0, max_concurrency: int = 4
    ) -> CommandVerifier:
        """`command:ARGV`: the argument split as a shell splits words (`shlex`), never run by a
        shell; the name a command verifier records (`command:<argv>`) makes the same one."""
        try:
            argv = shlex.split(argument or "")
        except ValueError as exc:
            raise ConfigError(f"judge.verifier: {'command:' + (argument or '')!r}: {exc}") from None
        if not argv:
            raise ConfigError(
                "judge.verifier: the command verifier runs a command: "
                "'command:ARGV' (or judge.verifier_command)"
            )
        return cls(argv, timeout_s=timeout_s, max_concurrency=max_concurrency)

    async def verify(self, question: str, text: str, answer: str | None) -> Verdict:
        """Run the command once on `text`; its exit status and stdout make the Verdict."""
        # Environment variables cannot hold NUL; the rest of the text passes as written.
        env = {
            **os.environ,
            "LANEFOLD_QUESTION": question.replace("\0", ""),
            "LANEFOLD_ANSWER": (answer or "").replace("\0", ""),
        }
        async with self._limiter:
            try:
                with anyio.fail_after(self._timeout_s):
                    code, out, err = await self._run(text.encode("utf-8", "replace"), env)
            except TimeoutError:
                return Verdict.timed_out(self._timeout_s)
            except OSError as exc:  # the exec failed (TimeoutError, an OSError too, is ours)
                return Verdict(None, False, one_line(f"cannot start {self._argv[0]!r}: {exc}"), error="exit")
        number = _number_on_last_line(out.decode("utf-8", "replace"))
        if code == 0:
            return Verdict(1.0 if number is None else number, True)
        # The tail of stderr, else of stdout (where many test runners report), for the feedback
        # a loop may show the model next; a stdout that is only the score says nothing more.
        detail = f"exit status {code}"
        said = out.decode("utf-8", "replace")
        if number is not None and len(said.strip().splitlines()) == 1:
            said = ""
        if tail := one_line(err.decode("utf-8", "replace") or said, 180, keep_end=True):
            detail += f": {tail}"
        return Verdict(0.0 if number is None else number, False, detail)

    async def _run(self, data: bytes, env: dict[str, str]) -> tuple[int, bytes, bytes]:
        process = await anyio.open_process(
            self._argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self._cwd,
            env=env,
            start_new_session=_POSIX,
        )
        out: list[bytes] = []
        err: list[bytes] = []
        finished = False
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_feed, process, data)
                tg.start_soon(_drain, process.stdout, out)
                tg.start_soon(_drain, process.stderr, err)
                code = await process.wait()
            finished = True
            return code, b"".join(out), b"".join(err)
        finally:
            with anyio.CancelScope(shield=True):  # reap even while being cancelled
                if not finished:
                    _kill(process)
                await process.aclose()


def as_verifier(
    obj: Verifier | VerifierFn | str | Sequence[str],
    *,
    timeout_s: float | None = 30.0,
    max_concurrency: int = 4,
) -> Verifier:
    """Any accepted verifier form as a Verifier: a Verifier as is, a callable wrapped,
    a `module:function` string imported, a list of strings run as a command."""
    if isinstance(obj, Verifier):
        return obj
    if isinstance(obj, str):
        return import_verifier(obj, timeout_s=timeout_s, max_concurrency=max_concurrency)
    if callable(obj):
        return CallableVerifier(obj, timeout_s=timeout_s, max_concurrency=max_concurrency)
    if isinstance(obj, Sequence) and not isinstance(obj, bytes):
        return CommandVerifier(obj, timeout_s=timeout_s, max_concurrency=max_concurrency)
    raise ConfigError(
        f"judge.verifier: expected a Verifier, a callable, 'module:function' or "
        f"a command list, got {type(obj).__name__}"
    )


def _number_on_last_line(stdout: str) -> float | None:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        number = float(lines[-1])
    except ValueError:
        return None
    return number if math.isfinite(number) else None  # "nan" or "inf" is no score


async def _feed(process: anyio.abc.Process, data: bytes) -> None:
    assert process.stdin is not None
    try:
        if data:
            await process.stdin.send(data)
        await process.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # a command may exit without reading its input; its exit status still counts


async def _drain(stream: anyio.abc.ByteReceiveStream | None, into: list[bytes]) -> None:
    assert stream is not None
    async for chunk in stream:
        into.append(chunk)


def _kill(process: anyio.abc.Process) -> None:
    try:
        if _POSIX:
            os.killpg(process.pid, signal.SIGKILL)  # the session leader's pid is the group id
        else:
            process.kill()
    except OSError:
        pass  # already gone (ProcessLookupError), or no longer ours to signal
