"""`orchestrator validate` lists every error of a config, one `file: where: what` line each and
then their count, exit 2; a valid config prints its one `ok` line. `load_config` (and so `run`)
still raises the first error, with how many more there are."""

from __future__ import annotations

from pathlib import Path

import pytest

import lanefold
from lanefold.cli import main
from lanefold.config._loop_config import config_errors

ROOT = Path(__file__).resolve().parents[2]

# Errors in four sections, the loop's own keys among them, and a nan: each is named.
MANY = """\
[loop]
k = 0
reducer = "no_such_reducer"
typo = 1

[sampling]
temperature = nan
stop = "END"

[backend]
kind = "simulated"
speed = 3

[budget]
max_tokens = -1
"""


def validate(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, list[str], str]:
    code = main(["validate", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, err.splitlines(), out


def test_every_error_is_a_line_then_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "many.toml"
    path.write_text(MANY.replace("nan", "0.5"))
    code, lines, out = validate(capsys, path)
    assert (code, out) == (2, "")
    *errors, count = lines
    assert count == "orchestrator validate: 6 errors"
    where = [line.removeprefix(f"orchestrator validate: {path}: ").split(": ")[0] for line in errors]
    assert where == [
        "loop.reducer",
        "loop.k",
        "loop.typo",
        "sampling.stop",
        "backend.speed",
        "budget.max_tokens",
    ]
    assert all(line.startswith(f"orchestrator validate: {path}: ") for line in errors)
    assert f"{path}: loop.typo: unknown key" in errors[2]


def test_the_first_error_alone_is_what_load_config_raises(tmp_path: Path) -> None:
    path = tmp_path / "many.toml"
    path.write_text(MANY.replace("nan", "0.5"))
    errors = config_errors(path)
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.load_config(path)
    assert str(caught.value) == f"{errors[0]} (and {len(errors) - 1} more)"


def test_every_nan_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A config holding nan or inf is refused before the rest is read: their places, all of them.
    path = tmp_path / "nan.toml"
    path.write_text(MANY + "\n[pricing]\ninput_per_mtok = inf\n")
    code, lines, _ = validate(capsys, path)
    assert code == 2
    assert lines == [
        f"orchestrator validate: {path}: sampling.temperature: must be a finite number",
        f"orchestrator validate: {path}: pricing.input_per_mtok: must be a finite number",
        "orchestrator validate: 2 errors",
    ]


def test_what_only_the_preflight_sees_is_listed_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "preflight.toml"
    path.write_text(
        '[loop]\nreducer = "judge_argmax"\n'
        '[judge]\nverifier = "lanefold_validate_gone:score"\n'
        '[judge.backend]\nkind = "engine"\nmodel = "/nope/judge.gguf"\n'
        '[backend]\nkind = "engine"\nmodel = "/nope/missing.gguf"\n'
    )
    code, lines, _ = validate(capsys, path)
    assert code == 2
    *errors, count = lines
    assert count == "orchestrator validate: 3 errors"
    assert [e.removeprefix(f"orchestrator validate: {path}: ").split(":")[0] for e in errors] == [
        "judge.verifier",
        "backend.model",
        "judge.backend.model",
    ]


def test_a_single_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.toml"
    path.write_text("[loop]\nk = 0\n")
    code, lines, _ = validate(capsys, path)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"orchestrator validate: {path}: loop.k: ")


@pytest.mark.parametrize(("text", "said"), [("[loop\nk = 3\n", "not valid TOML"), (None, "cannot read")])
def test_a_file_that_cannot_be_read_is_one_line(
    text: str | None, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.toml"
    if text is not None:
        path.write_text(text)
    code, lines, _ = validate(capsys, path)
    assert code == 2
    assert len(lines) == 1 and said in lines[0] and str(path) in lines[0]


def test_a_loop_that_cannot_be_found_is_named_once_with_the_other_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "loop.toml"
    path.write_text('[loop]\ncoordinator = "no_such_loop"\nk = 0\n[budget]\nmax_tokens = -1\n')
    code, lines, _ = validate(capsys, path)
    assert code == 2
    *errors, count = lines
    assert count == f"orchestrator validate: {len(errors)} errors"
    assert sum("no_such_loop" in e for e in errors) == 1
    assert any("budget.max_tokens" in e for e in errors)


def test_a_valid_config_prints_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "examples" / "simulated.toml"
    assert config_errors(path) == []
    code, lines, out = validate(capsys, path)
    assert (code, lines) == (0, [])
    assert out.startswith(f"{path}: ok (parallel_sample") and out.endswith("backend=simulated)\n")


# -- validate makes every check run makes before a run is created ----------------------------------

VAR = "LF_TEST_VALIDATE_KEY"
BASE = "Sk-Live-9Qx7AbCdEfGhIjKl"
KEYS = {  # each one `run` refuses (exit 2) when it builds the openai backend; validate passed all
    "unset": None,
    "empty": "",
    "crlf": BASE + "\r\n",
    "cr": BASE + "\r",
    "lf": BASE + "\n",
    "leading space": " " + BASE,
    "trailing space": BASE + " ",
    "tab": "\t" + BASE,
    "non-ascii": BASE[:9] + "é" + BASE[9:],
    "control": BASE[:9] + "\x01" + BASE[9:],
    "delete": BASE + "\x7f",
}
OPENAI = f'kind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\napi_key_env = "{VAR}"\n'
WHERE = {
    "backend": f"[loop]\nk = 2\n[backend]\n{OPENAI}",
    "judge.backend": (
        '[loop]\nk = 2\nreducer = "judge_argmax"\n[judge]\ntemplate = "{candidate}"\n'
        f'[backend]\nkind = "simulated"\n[judge.backend]\n{OPENAI}'
    ),
}


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("key", KEYS.values(), ids=KEYS.keys())
def test_validate_refuses_every_key_run_refuses(
    key: str | None,
    where: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(WHERE[where])
    if key is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, key)
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--question", "q?", "--runs-dir", str(runs)]) == 2
    ran = capsys.readouterr().err
    assert VAR in ran and not list(runs.glob("*/events.jsonl"))
    code, lines, out = validate(capsys, path)
    assert (code, out) == (2, "")
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"orchestrator validate: {path}: {where}.api_key_env: environment variable {VAR}"
    )
    assert ran.rstrip("\n").split(f"environment variable {VAR}")[1] in lines[0]  # run's words
    monkeypatch.setenv(VAR, BASE)
    assert validate(capsys, path)[0] == 0


STORE = '[store]\nurl = "postgresql://lanefold@127.0.0.1:9/db"\npassword_env = "LF_TEST_PG_PW"\n'


@pytest.mark.parametrize(
    ("text", "flags", "said"),
    [
        (STORE, [], "store.password_env: the environment variable LF_TEST_PG_PW is not set"),
        (
            '[budget]\nshared = "fleet"\n[store]\nurl = "mysql://h/db"\n',
            [],
            "store.url: no store serves mysql:// URLs",
        ),
    ],
)
def test_validate_checks_the_store_as_run_does_without_connecting(
    text: str,
    flags: list[str],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LF_TEST_PG_PW", raising=False)
    path = tmp_path / "store.toml"
    path.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n' + text)
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--question", "q?", "--runs-dir", str(runs), *flags]) == 2
    assert said.split(":")[0] in capsys.readouterr().err and not runs.exists()
    code, lines, _ = validate(capsys, path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"orchestrator validate: {path}: {said}"), lines


def test_a_shared_budget_on_files_validates_and_run_refuses_one_the_store_does_not_keep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n[budget]\nshared = "fleet"\n')
    assert validate(capsys, path)[0] == 0  # the files store keeps named budgets too
    runs = tmp_path / "runs"
    assert main(["run", str(path), "--question", "q?", "--runs-dir", str(runs)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "budget.shared: no budget named 'fleet'" in line and "orchestrator budget set fleet" in line
    assert not runs.exists()  # refused before the run exists


def test_a_shared_budget_with_a_store_flag_validates_without_a_connection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n[budget]\nshared = "fleet"\n')
    # Nothing listens at port 9: validate does not connect (whether the budget exists is run's).
    code = main(["validate", str(path), "--store", "postgresql://lanefold@127.0.0.1:9/db"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    assert out.startswith(f"{path}: ok")
