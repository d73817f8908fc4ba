"""The built-in verifier is registered as every plug-in kind's built-ins are (issue 39): `command`
in `VERIFIERS`, made from a spec's argument as a registered scorer is (`NAME[:ARG]`), so
`[judge] verifier = "command:python check.py"` judges as `verifier_command` does and the name a
command verifier records (`command:<argv>`) names it again. On main no verifier was registered,
and `command:...` was read as a module named `command`."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import lanefold
from lanefold.coordinators import CommandVerifier
from lanefold.primitives import VERIFIERS, ConfigError, import_verifier, register_verifier
from tests.orchestrator.test_verifier_config import (
    CHECK,
    QUESTION,
    RUN,
    config_file,
    run_cli,
    script,
    verdicts,
)


def test_the_command_verifier_is_registered_by_name() -> None:
    assert VERIFIERS.get("command") is CommandVerifier
    assert lanefold.register_verifier is register_verifier  # public in the facade as every kind's


def test_a_command_named_in_judge_verifier_judges_as_verifier_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = script(tmp_path, "check.py", CHECK.format(question=QUESTION))
    results = []
    for name, judge in (
        ("by_key", {"verifier_command": argv}),
        ("by_name", {"verifier": "command:" + shlex.join(argv)}),
    ):
        (tmp_path / name).mkdir()
        cfg = config_file(tmp_path / name, loop={"reducer": "judge_argmax"}, judge=judge)
        code, result, err = run_cli(capsys, cfg, tmp_path / name / "runs")
        assert code == 0, err
        results.append(result)
    by_key, by_name = results
    assert by_key["answer"] == by_name["answer"] == "391"
    assert by_key["scores"] == by_name["scores"]
    judged = verdicts(by_name["events"])
    assert {v.judge for v in judged.values()} == {v.judge for v in verdicts(by_key["events"]).values()}
    assert {v.judge for v in judged.values()} == {"command:" + shlex.join(argv)}
    assert (tmp_path / "by_name" / "runs" / RUN).is_dir()


def test_the_name_a_command_verifier_records_makes_it_again() -> None:
    made = CommandVerifier(["python", "check.py", "--strict"])
    again = import_verifier(made.name, timeout_s=5, max_concurrency=2)
    assert isinstance(again, CommandVerifier) and again.name == made.name
    assert repr(again) == "CommandVerifier('command:python check.py --strict', timeout_s=5)"


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (
            "command",
            "judge.verifier: the command verifier runs a command: 'command:ARGV' (or judge.verifier_command)",
        ),
        (
            "command:",
            "judge.verifier: the command verifier runs a command: 'command:ARGV' (or judge.verifier_command)",
        ),
        ("command:python 'unclosed", """judge.verifier: "command:python 'unclosed": No closing quotation"""),
    ],
)
def test_a_command_verifier_without_a_command_is_one_line(spec: str, said: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        import_verifier(spec)
    assert str(caught.value) == said
