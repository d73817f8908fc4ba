"""Bad input the command used to answer with a traceback, each now one line naming the place
and exit 2 (issue 38): a `--store` URL that does not parse (`postgresql://u:pw@[::1`, a port
that is not one), and a dataset line nested 50,000 deep. The password of a `--store` URL is
never shown."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import EXAMPLE, cli

import lanefold
from lanefold.evaluate import load_dataset

BAD_URLS = {
    "unclosed IPv6": "postgresql://u:pw-9f3e@[::1",
    "port not a number": "postgresql://u:pw-9f3e@db:fivek/lanefold",
    "port out of range": "postgresql://u:pw-9f3e@db:99999/lanefold",
    "IPv6 not an address": "postgresql://u:pw-9f3e@[zz::1]/lanefold",
}


@pytest.mark.parametrize("url", BAD_URLS.values(), ids=BAD_URLS.keys())
@pytest.mark.parametrize(
    "argv",
    [("list",), ("show", "some-run"), ("tail", "some-run"), ("run", EXAMPLE, "--question", "Q?")],
    ids=["list", "show", "tail", "run"],
)
def test_a_store_url_that_does_not_parse_is_one_line_without_the_password(
    capsys: pytest.CaptureFixture[str], url: str, argv: tuple[str, ...]
) -> None:
    refused = cli(capsys, *argv, "--store", url)
    assert refused.code == 2, refused
    assert refused.error_line.startswith(f"orchestrator {argv[0]}: store.url: not a valid URL"), refused
    assert "pw-9f3e" not in refused.err


def test_a_store_url_that_does_not_parse_is_refused_from_python_and_a_config_too() -> None:
    with pytest.raises(lanefold.ConfigError, match=r"^store\.url: not a valid URL"):
        lanefold.open_store("postgresql://u:pw@[::1")
    with pytest.raises(lanefold.ConfigError, match=r"loop\.toml: store\.url: .*not a valid URL") as refused:
        lanefold.parse_config({"store": {"url": "postgresql://db:fivek/x"}}, source="loop.toml")
    assert "\n" not in str(refused.value)


def test_a_dataset_line_nested_50000_deep_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "deep.jsonl"
    deep = "[" * 50_000 + "]" * 50_000
    data.write_text(
        f'{{"question": "Q?", "answer": "1"}}\n{{"question": "Q?", "answer": "1", "x": {deep}}}\n'
    )
    refused = cli(capsys, "eval", EXAMPLE, "--dataset", data, "--runs-dir", tmp_path / "runs")
    assert refused.code == 2, refused
    assert refused.error_line == f"orchestrator eval: {data}:2: nested deeper than 32 levels"
    with pytest.raises(lanefold.ConfigError, match=r"deep\.jsonl:2: nested deeper than 32 levels"):
        load_dataset(str(data))
