"""Every count a config takes is bounded when the config is read, so `validate` refuses what
`run` cannot do: `[sampling] max_tokens` above 2**53 used to pass `validate` and crash `run`
with an internal error (the wave's hold is past what a bill can hold). And a config read is
bounded: `validate /dev/zero` used to read forever."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from cli_support import cli

import lanefold
from lanefold.cli import main

BIG = 2**53 + 1
LIMIT = 2**31 - 1  # the most output tokens a lane may be given (lanefold.primitives.MAX_LANE_TOKENS)

# (the config's sections, then keys of its simulated [backend])
TOO_BIG = {
    "sampling.max_tokens": (f"[sampling]\nmax_tokens = {BIG}\n", ""),
    "judge.max_tokens": (
        f'[loop]\nreducer = "judge_argmax"\n[judge]\ntemplate = "{{candidate}} Score:"\nmax_tokens = {BIG}\n',
        "",
    ),
    "loop.json_max_tokens": (f'[loop]\ncoordinator = "plan_verify_replan"\njson_max_tokens = {BIG}\n', ""),
    "backend.prompt_tokens": ("", f"prompt_tokens = {BIG}\n"),
    "backend.output_tokens": ("", f"output_tokens = {BIG}\n"),
    "backend.judge_output_tokens": ("", f"judge_output_tokens = {BIG}\n"),
    "budget.max_tokens": (f"[budget]\nmax_tokens = {2**60}\n", ""),
    "budget.max_requests": (f"[budget]\nmax_requests = {2**60}\n", ""),
    "budget.max_cost_usd": ("[budget]\nmax_cost_usd = 1e300\n", ""),
    "pricing.input_per_mtok": ("[pricing]\ninput_per_mtok = 1e300\n", ""),
    "pricing.output_per_mtok": ("[pricing]\noutput_per_mtok = 1e300\n", ""),
}


def _config(folder: Path, sections: str, backend: str) -> Path:
    path = folder / "loop.toml"
    path.write_text(f'{sections}[backend]\nkind = "simulated"\n{backend}')
    return path


@pytest.mark.parametrize("field", TOO_BIG)
def test_a_count_past_its_bound_is_refused_by_validate_and_run(
    field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, *TOO_BIG[field])
    for argv in (["validate", path], ["run", path, "--question", "Q?", "--runs-dir", tmp_path / "runs"]):
        refused = cli(capsys, *argv)
        assert refused.code == 2, refused
        assert refused.error_line.startswith(f"orchestrator {argv[0]}: {path}: {field}: "), refused.error_line
    assert not (tmp_path / "runs").exists()  # refused before a run was created


def test_the_largest_lane_allotment_runs(tmp_path: Path) -> None:
    config = lanefold.parse_config(
        {"loop": {"k": 3, "seed": 1}, "sampling": {"max_tokens": LIMIT}, "backend": {"kind": "simulated"}}
    )
    result = lanefold.run_sync(config, "What is 17 * 23?", runs_dir=tmp_path)
    assert result.status == "answered"
    with pytest.raises(lanefold.ConfigError, match=r"sampling\.max_tokens: .*2147483647"):
        lanefold.parse_config({"sampling": {"max_tokens": LIMIT + 1}, "backend": {"kind": "simulated"}})


def test_validate_dev_zero_is_one_line_not_a_read_forever(capsys: pytest.CaptureFixture[str]) -> None:
    done: list[int] = []
    worker = threading.Thread(target=lambda: done.append(main(["validate", "/dev/zero"])), daemon=True)
    worker.start()
    worker.join(30)  # a generous bound: the read stops at a few MiB
    assert done == [2], "validate /dev/zero did not return"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("orchestrator validate: /dev/zero: larger than ")


def test_a_config_past_the_size_bound_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.toml"
    path.write_text("[loop]\nk = 2\n" + "# padding\n" * 500_000)  # 5 MB of comments
    refused = cli(capsys, "validate", path)
    assert refused.code == 2
    assert refused.error_line.startswith(f"orchestrator validate: {path}: larger than ")


def test_a_log_written_before_the_bounds_stays_readable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Logs are never deprecated: a run recorded with a count past today's bound (one a release
    # before the bound could run: 10**11 tokens a lane, a budget of 2**60) is still shown.
    import json

    from lanefold.primitives import hash_config

    path = tmp_path / "loop.toml"
    path.write_text('[loop]\nk = 2\n[backend]\nkind = "simulated"\n')
    runs = tmp_path / "runs"
    ran = cli(capsys, "run", path, "--question", "Q?", "--runs-dir", runs, "--json")
    log = runs / ran.json["run_id"] / "events.jsonl"
    lines = log.read_text().splitlines()
    started = json.loads(lines[0])
    started["data"]["config"]["sampling"]["max_tokens"] = 10**11
    started["data"]["config"]["budget"]["max_tokens"] = 2**60
    started["data"]["config_hash"] = hash_config(started["data"]["config"])
    log.write_text("\n".join([json.dumps(started), *lines[1:]]) + "\n")
    shown = cli(capsys, "show", ran.json["run_id"], "--runs-dir", runs, "--json")
    assert shown.code == 0, shown.err
    with pytest.raises(lanefold.ConfigError, match=r"sampling\.max_tokens: .*2147483647"):
        lanefold.parse_config(started["data"]["config"])
