"""Verifiers: callables and commands score a candidate, and every failure becomes a Verdict."""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from lanefold.coordinators import CommandVerifier, as_verifier
from lanefold.primitives import CallableVerifier, Verdict, Verifier, import_verifier
from lanefold.primitives._errors import ConfigError


def python(code: str) -> list[str]:
    """A command that runs `code` in this interpreter."""
    return [sys.executable, "-c", code]


def is_gone(pid: int) -> bool:
    """No such process, or only a zombie left for its (non-test) parent to reap."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


# --- callables ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.5, Verdict(0.5, True)),
        (7, Verdict(7.0, True)),
        (0, Verdict(0.0, False)),
        (-1.5, Verdict(-1.5, False)),
        (True, Verdict(1.0, True)),
        (False, Verdict(0.0, False)),
        (None, Verdict(None, None, "verifier gave no score")),
    ],
)
async def test_callable_return_values(value: object, expected: Verdict) -> None:
    def sync(question: str, text: str, answer: str | None) -> object:
        return value

    async def asynchronous(question: str, text: str, answer: str | None) -> object:
        return value

    assert await CallableVerifier(sync).verify("q", "t", "a") == expected  # type: ignore[arg-type]
    assert await CallableVerifier(asynchronous).verify("q", "t", "a") == expected  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "value",
    ["7", math.nan, math.inf, -math.inf, 10**400, [1], object()],
    ids=["str", "nan", "inf", "-inf", "huge-int", "list", "object"],
)
async def test_callable_non_numbers_are_bad_output(value: object) -> None:
    verdict = await CallableVerifier(lambda q, t, a: value).verify("q", "t", None)  # type: ignore[arg-type,return-value]
    assert (verdict.score, verdict.passed, verdict.error) == (None, False, "bad_output")
    assert "not a number" in verdict.detail
    assert len(verdict.detail) <= 200


@pytest.mark.anyio
async def test_callable_raise_is_recorded() -> None:
    def broken(question: str, text: str, answer: str | None) -> float:
        raise ValueError("no parse")

    verdict = await CallableVerifier(broken).verify("q", "t", None)
    assert verdict == Verdict(None, False, "verifier raised ValueError: no parse", error="raised")


@pytest.mark.anyio
async def test_callables_own_timeout_error_is_a_raise_not_a_timeout() -> None:
    async def fetch(question: str, text: str, answer: str | None) -> float:
        raise TimeoutError("upstream")

    verdict = await CallableVerifier(fetch, timeout_s=60).verify("q", "t", None)
    assert verdict.error == "raised"
    assert verdict.detail == "verifier raised TimeoutError: upstream"


@pytest.mark.anyio
async def test_callable_gets_question_text_and_answer() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def record(question: str, text: str, answer: str | None) -> bool:
        seen.append((question, text, answer))
        return True

    await CallableVerifier(record).verify("2+2?", "It is 4.", "4")
    await CallableVerifier(record).verify("2+2?", "No idea.", None)
    assert seen == [("2+2?", "It is 4.", "4"), ("2+2?", "No idea.", None)]


@pytest.mark.anyio
async def test_async_call_forms_are_awaited() -> None:
    class Scorer:
        async def __call__(self, question: str, text: str, answer: str | None) -> float:
            return 0.25

    async def coroutine_fn(question: str, text: str, answer: str | None) -> float:
        return 0.5

    assert (await CallableVerifier(Scorer()).verify("q", "t", None)).score == 0.25
    returns_coroutine = CallableVerifier(lambda q, t, a: coroutine_fn(q, t, a))
    assert (await returns_coroutine.verify("q", "t", None)).score == 0.5


@pytest.mark.anyio
async def test_hung_sync_callable_times_out() -> None:
    release = threading.Event()

    def hang(question: str, text: str, answer: str | None) -> float:
        release.wait(30)
        return 1.0

    try:
        verdict = await CallableVerifier(hang, timeout_s=0.2).verify("q", "t", None)
    finally:
        release.set()  # let the abandoned thread finish
    assert verdict == Verdict(None, False, "verifier timed out after 0.2 s", error="timeout")


@pytest.mark.anyio
async def test_hung_async_callable_times_out() -> None:
    async def hang(question: str, text: str, answer: str | None) -> float:
        await anyio.sleep_forever()
        return 1.0

    verdict = await CallableVerifier(hang, timeout_s=0.1).verify("q", "t", None)
    assert (verdict.score, verdict.passed, verdict.error) == (None, False, "timeout")


@pytest.mark.anyio
async def test_cancellation_is_not_swallowed() -> None:
    release = threading.Event()

    def hang_sync(question: str, text: str, answer: str | None) -> float:
        release.wait(30)
        return 1.0

    async def hang_async(question: str, text: str, answer: str | None) -> float:
        await anyio.sleep_forever()
        return 1.0

    try:
        for fn in (hang_sync, hang_async):
            verdicts: list[Verdict] = []
            with anyio.move_on_after(0.1) as scope:
                verdicts.append(await CallableVerifier(fn, timeout_s=None).verify("q", "t", None))
            assert scope.cancelled_caught
            assert verdicts == []
    finally:
        release.set()


@pytest.mark.anyio
async def test_max_concurrency_bounds_running_calls() -> None:
    active = peak = 0
    full = anyio.Event()
    release = anyio.Event()

    async def slow(question: str, text: str, answer: str | None) -> float:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active == 3:
            full.set()
        await release.wait()
        active -= 1
        return 1.0

    verifier = CallableVerifier(slow, max_concurrency=3, timeout_s=None)
    verdicts: list[Verdict] = []

    async def one() -> None:
        verdicts.append(await verifier.verify("q", "t", None))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(one)
        await full.wait()
        for _ in range(20):  # give the seven waiting calls every chance to get in
            await anyio.lowlevel.checkpoint()
        assert active == 3
        release.set()
    assert peak == 3
    assert verdicts == [Verdict(1.0, True)] * 10


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"timeout_s": 0}, "judge.verifier_timeout_s: must be > 0"),
        ({"timeout_s": -1.0}, "judge.verifier_timeout_s: must be > 0"),
        ({"timeout_s": math.nan}, "judge.verifier_timeout_s: must be > 0"),
        ({"max_concurrency": 0}, "max_concurrency (of the verifier): must be >= 1"),
    ],
)
def test_limits_are_validated(kwargs: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(key)):
        CallableVerifier(lambda q, t, a: 1.0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape(key)):
        CommandVerifier(python("pass"), **kwargs)  # type: ignore[arg-type]


def test_callable_name_defaults_to_module_and_qualname() -> None:
    def check(question: str, text: str, answer: str | None) -> bool:
        return True

    assert CallableVerifier(check).name == f"{__name__}:{check.__qualname__}"
    assert CallableVerifier(check, name="mine").name == "mine"


# --- commands ----------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("pass", Verdict(1.0, True)),
        ("print(0.75)", Verdict(0.75, True)),
        ("print('checking...'); print('0.5'); print()", Verdict(0.5, True)),
        ("print('all good')", Verdict(1.0, True)),
        ("print('nan')", Verdict(1.0, True)),  # not a finite number: scored by exit status
        ("import sys; sys.exit(1)", Verdict(0.0, False, "exit status 1")),
        ("import sys; print(0.3); sys.exit(2)", Verdict(0.3, False, "exit status 2")),
    ],
)
async def test_command_exit_status_and_stdout(code: str, expected: Verdict) -> None:
    assert await CommandVerifier(python(code)).verify("q", "t", None) == expected


@pytest.mark.anyio
async def test_command_failure_detail_is_a_short_stderr_tail() -> None:
    code = "import sys; sys.stderr.write('noise\\n' * 200 + 'AssertionError:\\n  wrong'); sys.exit(1)"
    verdict = await CommandVerifier(python(code)).verify("q", "t", None)
    assert (verdict.score, verdict.passed, verdict.error) == (0.0, False, None)
    assert len(verdict.detail) <= 200
    assert "\n" not in verdict.detail
    assert verdict.detail.startswith("exit status 1: ")
    assert verdict.detail.endswith("AssertionError: wrong")


@pytest.mark.anyio
@pytest.mark.parametrize("text", ["héllo ✓\n{x} $HOME", ""])
async def test_command_reads_the_text_on_stdin(text: str) -> None:
    code = f"import sys; sys.exit(0 if sys.stdin.buffer.read().decode('utf-8') == {text!r} else 3)"
    assert (await CommandVerifier(python(code)).verify("q", text, None)).passed is True


@pytest.mark.anyio
async def test_command_need_not_read_stdin() -> None:
    verdict = await CommandVerifier(python("pass")).verify("q", "x" * 1_000_000, None)
    assert verdict == Verdict(1.0, True)


@pytest.mark.anyio
async def test_command_env_carries_question_and_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANEFOLD_TEST_INHERITED", "yes")
    code = (
        "import os, sys; e = os.environ; "
        "sys.exit(0 if (e['LANEFOLD_QUESTION'], e['LANEFOLD_ANSWER'], e['LANEFOLD_TEST_INHERITED'])"
        " == (sys.argv[1], sys.argv[2], 'yes') else 1)"
    )
    assert (await CommandVerifier([*python(code), "2+2? ✓", "4"]).verify("2+2? ✓", "t", "4")).passed
    assert (await CommandVerifier([*python(code), "q", ""]).verify("q", "t", None)).passed


@pytest.mark.anyio
async def test_command_runs_in_cwd(tmp_path: Path) -> None:
    (tmp_path / "marker").write_text("here")
    code = "import os, sys; sys.exit(0 if os.path.exists('marker') else 1)"
    assert (await CommandVerifier(python(code), cwd=tmp_path).verify("q", "t", None)).passed


@pytest.mark.anyio
async def test_hung_command_is_killed_with_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n"
    )
    verdict = await CommandVerifier(python(code), timeout_s=1.5).verify("q", "t", None)
    assert verdict == Verdict(None, False, "verifier timed out after 1.5 s", error="timeout")
    parent, child = (int(pid) for pid in pids.read_text().split())
    assert is_gone(parent)  # killed and reaped, not left a zombie
    if sys.platform == "linux":
        with anyio.fail_after(10):  # the orphan is reaped by init, not by us
            while not is_gone(child):  # noqa: ASYNC110  # init reaps it: no event to wait on
                await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_cancelled_command_is_reaped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    verifier = CommandVerifier(python(code), timeout_s=None)
    with anyio.move_on_after(1.5) as scope:
        await verifier.verify("q", "t", None)
    assert scope.cancelled_caught
    assert is_gone(int(pid_file.read_text()))


@pytest.mark.anyio
@pytest.mark.parametrize("argv", [["/nonexistent/lanefold-check"], [os.devnull]])
async def test_command_that_cannot_start(argv: list[str]) -> None:
    verdict = await CommandVerifier(argv).verify("q", "t", None)
    assert (verdict.score, verdict.passed, verdict.error) == (None, False, "exit")
    assert verdict.detail.startswith("cannot start ")


@pytest.mark.anyio
async def test_command_with_a_missing_cwd_cannot_start(tmp_path: Path) -> None:
    verdict = await CommandVerifier(python("pass"), cwd=tmp_path / "missing").verify("q", "t", None)
    assert verdict.error == "exit"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "judge.verifier_command: must not be empty"),
        ("python check.py", "judge.verifier_command: must be a list of strings"),
        ([sys.executable, 3], "judge.verifier_command: every item must be a string"),
    ],
)
def test_command_argv_is_validated(argv: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        CommandVerifier(argv)  # type: ignore[arg-type]


def test_command_name_defaults_to_the_quoted_argv() -> None:
    argv = ["python", "check it.py", "--strict"]
    assert CommandVerifier(argv).name == "command:" + shlex.join(argv)
    assert CommandVerifier(argv).name == "command:python 'check it.py' --strict"
    assert CommandVerifier(argv, name="tests").name == "tests"


# --- as_verifier and import_verifier -----------------------------------------------------------


@pytest.fixture
def check_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An importable module `lanefold_check_module` with a `check` verifier."""
    name = "lanefold_check_module"
    (tmp_path / f"{name}.py").write_text(
        "def check(question, text, answer):\n    return answer == '4'\n\nNOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.anyio
async def test_import_verifier(check_module: str) -> None:
    verifier = import_verifier(f"{check_module}:check", timeout_s=5)
    assert verifier.name == f"{check_module}:check"
    assert await verifier.verify("2+2?", "4", "4") == Verdict(1.0, True)
    assert await verifier.verify("2+2?", "5", "5") == Verdict(0.0, False)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "lanefold_no_such_module:f",
            "judge.verifier: cannot import 'lanefold_no_such_module:f': ModuleNotFoundError: ",
        ),
        (
            "lanefold_check_module:missing",
            "judge.verifier: cannot import 'lanefold_check_module:missing': AttributeError: ",
        ),
        (
            "lanefold_check_module:NOT_CALLABLE",
            "judge.verifier: 'lanefold_check_module:NOT_CALLABLE' is not callable",
        ),
        ("lanefold_check_module", "judge.verifier: 'lanefold_check_module' must look like 'module:function'"),
    ],
)
def test_import_verifier_errors(check_module: str, spec: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        import_verifier(spec)
    assert str(raised.value).startswith(message)


def test_as_verifier_dispatch(check_module: str) -> None:
    command = CommandVerifier(python("pass"))
    assert as_verifier(command) is command
    assert isinstance(command, Verifier)

    wrapped = as_verifier(lambda q, t, a: 1.0)
    assert isinstance(wrapped, CallableVerifier)
    assert isinstance(wrapped, Verifier)

    imported = as_verifier(f"{check_module}:check")
    assert isinstance(imported, CallableVerifier)
    assert imported.name == f"{check_module}:check"

    for argv in (python("pass"), tuple(python("pass"))):
        made = as_verifier(argv, timeout_s=5, max_concurrency=2)
        assert isinstance(made, CommandVerifier)
        assert made.name == "command:" + shlex.join(python("pass"))

    with pytest.raises(ConfigError, match=re.escape("judge.verifier: expected a Verifier")):
        as_verifier(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=re.escape("judge.verifier_timeout_s")):
        as_verifier(lambda q, t, a: 1.0, timeout_s=0)
