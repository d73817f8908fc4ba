"""`bfcl:<category>`: the Berkeley Function Calling Leaderboard read from a cached `bfcl-eval`
wheel, each question with its own tools, scored by BFCL's AST check. The wheel is built by the
test (`archives.build_bfcl_wheel`, holding BFCL's own entries and possible answers) and the
fetch runs a stand-in for pip: nothing is fetched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from lanefold.evaluate import load_dataset, resolve_scorer
from lanefold.evaluate._bfcl import WHEEL_NAME, bfcl_cache, bfcl_schema, load_bfcl
from lanefold.evaluate._bfcl_check import BfclAst
from lanefold.evaluate._item import Item
from lanefold.primitives import ConfigError, LanefoldError, canonical_json
from tests.orchestrator.archives import build_bfcl_wheel

OTHERS = (
    "without it, use the shipped sample examples/datasets/arithmetic/*.jsonl, "
    "bigbench:<task>, openai-evals:<name>, humaneval or a .jsonl or .csv file of your own "
    "(`orchestrator datasets` lists them)"
)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return build_bfcl_wheel(tmp_path / "cache" / WHEEL_NAME).parent


def by_id(items: list[Item]) -> dict[str, Item]:
    return {item.meta["id"]: item for item in items}


def test_an_entry_is_its_user_turn_its_own_tools_and_its_simplest_right_call(cache: Path) -> None:
    items = load_bfcl("simple_python", cache_dir=cache)
    first = items[0]
    assert (first.index, first.question) == (
        0,
        "Find the area of a triangle with a base of 10 units and height of 5 units.",
    )
    assert first.answer == '{"arguments":{"base":10,"height":5},"name":"calculate_triangle_area"}'
    assert [tool.name for tool in first.tools] == ["calculate_triangle_area"]
    assert first.meta["category"] == "simple_python" and first.meta["scorer"] == "bfcl"
    assert first.source == f"{WHEEL_NAME}:bfcl_eval/data/BFCL_v4_simple_python.json:1"
    # a dotted name is called with `_`, as BFCL calls it for OpenAI-style models
    assert by_id(items)["simple_python_1"].tools[0].name == "math_factorial"
    # a dict argument's gold is one value per key
    assert json.loads(by_id(items)["simple_python_94"].answer or "")["arguments"]["update_info"] == {
        "email": "johndoe@email.com",
        "name": "John Doe",
    }


def test_python_flavoured_types_become_json_schema_once() -> None:
    bfcl = {
        "type": "dict",
        "properties": {
            "x": {"type": "float", "description": "X."},
            "where": {"type": "tuple", "items": {"type": "float"}},
            "data": {"type": "any"},
            "info": {"type": "dict", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            "unit": {"type": "string", "default": "units", "optional": True},
            "odd": {"type": "Set"},
            "metrics": {"type": "array", "items": {"type": "string"}, "enum": ["trust", "view"]},
        },
        "required": ["x"],
    }
    assert bfcl_schema(bfcl) == {
        "type": "object",
        "properties": {
            "x": {"type": "number", "description": "X. This is a float type value."},
            "where": {
                "type": "array",
                "items": {"type": "number", "description": " This is a float type value."},
            },
            "data": {"type": "string"},
            "info": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            "unit": {"type": "string", "description": " Default is: units."},  # no default filled
            "odd": {"type": "string"},
            # BFCL puts an array's allowed items on the array: moved where JSON Schema reads them
            "metrics": {"type": "array", "items": {"type": "string", "enum": ["trust", "view"]}},
        },
        "required": ["x"],
    }


def test_a_system_message_comes_before_the_users(cache: Path) -> None:
    item = by_id(load_bfcl("live_simple", cache_dir=cache))["live_simple_256-137-0"]
    roles = [m["role"] for m in item.meta["messages"]]
    assert roles == ["system", "user"]
    assert item.question == "\n\n".join(m["content"] for m in item.meta["messages"])


def score(item: Item, answer: str | None) -> float:
    async def go() -> float:
        return (await BfclAst().score(item, answer, None)).value

    return anyio.run(go)


def call(name: str, **arguments: Any) -> str:
    return canonical_json({"name": name, "arguments": arguments})


@pytest.mark.parametrize("category", ["simple_python", "multiple", "live_simple"])
def test_each_entrys_own_right_call_passes_the_check(cache: Path, category: str) -> None:
    items = load_bfcl(category, cache_dir=cache)
    assert items and all(score(item, item.answer) == 1.0 for item in items)


# (entry, the call, right?): BFCL's rules on its own entries.
RULES = [
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5, unit="units"), True),
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5, unit="cm"), False),
    ("simple_python_0", call("triangle_area", base=10, height=5), False),  # another name
    ("simple_python_0", call("calculate_triangle_area", base=10), False),  # a required one missing
    ("simple_python_0", call("calculate_triangle_area", base=10, height=5, colour="red"), False),
    ("simple_python_0", call("calculate_triangle_area", base=10.5, height=5), False),  # float for int
    ("simple_python_0", call("calculate_triangle_area", base="10", height=5), False),  # text for int
    ("simple_python_1", call("math_factorial", number=5), True),
    ("simple_python_1", call("math.factorial", number=5), False),
    ("simple_python_13", call("calculate_area_under_curve", function="Y = X**2", interval=[1, 3]), True),
    ("simple_python_13", call("calculate_area_under_curve", function="x**3", interval=[1, 3]), False),
    ("simple_python_13", call("calculate_area_under_curve", function="x**2", interval=[3, 1]), False),
    (
        "simple_python_14",
        call("calculate_derivative", function="3x**2 + 2x - 1", x_value=0),
        True,
    ),  # int for float
    ("simple_python_14", call("calculate_derivative", function="3x^2+2x-1"), True),  # ^ and spaces dropped
    ("simple_python_14", call("calculate_derivative", function="3x**2 + 2x - 1", x_value=1), False),
    (
        "simple_python_83",
        call("calculate_distance", coord1=[33.4484, -112.074], coord2=[34.0522, -118.2437]),
        False,
    ),
    (
        "simple_python_83",
        call("calculate_distance", coord1=[33.4484, -112.074], coord2=[34.0522, -118.2437], unit="Miles"),
        True,
    ),
    (
        "simple_python_94",
        call(
            "update_user_info", user_id=43523, update_info={"name": "john doe", "email": "johndoe@email.com"}
        ),
        True,
    ),
    (
        "simple_python_94",
        call("update_user_info", user_id=43523, update_info={"name": "John Doe"}),
        False,
    ),  # a key missing
    (
        "simple_python_94",
        call(
            "update_user_info",
            user_id=43523,
            update_info={"name": "John Doe", "email": "johndoe@email.com", "age": 3},
        ),
        False,
    ),
    (
        "simple_python_96",
        call(
            "database_query",
            table="user",
            conditions=[
                {"field": "age", "operation": ">", "value": "25"},
                {"field": "job", "operation": "=", "value": "engineer"},
            ],
        ),
        True,
    ),
    (
        "simple_python_96",
        call(
            "database_query",
            table="user",
            conditions=[
                {"field": "job", "operation": "=", "value": "engineer"},
                {"field": "age", "operation": ">", "value": "25"},
            ],
        ),
        False,  # a list of dicts in order
    ),
    ("simple_python_109", call("random_forest_train", n_estimators=100, max_depth=5, data="my_data"), True),
    ("multiple_0", call("triangle_properties_get", side1=5, side2=4, side3=3, get_area=True), True),
    (
        "multiple_0",
        call("triangle_properties_get", side1=5, side2=4, side3=3, get_area=1),
        False,
    ),  # int for bool
    ("multiple_0", call("circle_properties_get", radius=5.0), False),  # the other tool
    ("live_simple_0-0-0", call("get_user_info", user_id=7890), False),  # left out, and needed
    ("live_simple_0-0-0", call("get_user_info", user_id=7890, special="Black"), True),
]


@pytest.mark.parametrize(("entry", "answer", "right"), RULES)
def test_bfcls_rules_on_its_own_entries(cache: Path, entry: str, answer: str, right: bool) -> None:
    items = {
        **by_id(load_bfcl("simple_python", cache_dir=cache)),
        **by_id(load_bfcl("multiple", cache_dir=cache)),
        **by_id(load_bfcl("live_simple", cache_dir=cache)),
    }
    assert score(items[entry], answer) == (1.0 if right else 0.0)


def test_an_answer_that_is_no_call_is_wrong(cache: Path) -> None:
    item = load_bfcl("simple_python", cache_dir=cache)[0]
    assert score(item, None) == score(item, "391") == score(item, '{"base": 10}') == 0.0


def test_the_dataset_names_its_scorer_and_others_refuse_what_it_cannot_score(cache: Path) -> None:
    items = load_bfcl("multiple", cache_dir=cache)
    assert resolve_scorer(None, items).name == "bfcl"
    assert resolve_scorer("bfcl", items).name == "bfcl"
    with pytest.raises(ConfigError, match="no BFCL functions and ground truth for the bfcl scorer"):
        resolve_scorer("bfcl", [Item(0, "2 + 2?", "4", source="q.jsonl:1")])


@pytest.mark.parametrize(
    ("category", "why"),
    [
        ("parallel", "its answers are several calls, and a lane's answer is one call"),
        ("simple_java", "its arguments are Java or JavaScript source text, which this source does not read"),
        ("irrelevance", "its right answer is no call, which a tool_call answer cannot say"),
        ("multi_turn_base", "it is a multi-turn or agentic category"),
        ("simple", "no such category"),
    ],
)
def test_a_category_it_cannot_score_is_one_config_error(cache: Path, category: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_bfcl(category, cache_dir=cache)
    assert str(caught.value) == (
        f"--dataset bfcl:{category}: {why}; name one of simple_python, multiple, live_simple, live_multiple"
    )


def test_a_category_the_archive_lacks_is_named(cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"--dataset bfcl:live_multiple: the .* archive holds no "):
        load_bfcl("live_multiple", cache_dir=cache)


def fake_pip(wheel: bool, output: str = "") -> Any:
    """Stands in for `pip download --no-deps bfcl-eval==2026.3.23 -d DIR`."""

    def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        assert argv[1:5] == ["-m", "pip", "download", "--no-deps"], argv
        assert "bfcl-eval==2026.3.23" in argv and "--only-binary=:all:" in argv
        kwargs["stdout"].write(output.encode())
        if wheel:
            build_bfcl_wheel(Path(argv[argv.index("-d") + 1]) / WHEEL_NAME)
        return subprocess.CompletedProcess(argv, 0 if wheel else 1)

    return run


def test_the_first_load_fetches_the_wheel_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(wheel=True))
    cache = tmp_path / "cache"
    assert len(load_bfcl("multiple", cache_dir=cache)) == 3
    assert sorted(p.name for p in cache.iterdir()) == [WHEEL_NAME, "fetch.log"]

    def no_pip(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("fetched twice")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert len(load_bfcl("simple_python", cache_dir=cache)) == 8


OFFLINE = (
    "WARNING: Retrying after connection broken by 'NameResolutionError(\"Failed to resolve "
    "'pypi.org' ([Errno -3] Temporary failure in name resolution)\")': /simple/bfcl-eval/\n"
    "ERROR: No matching distribution found for bfcl-eval==2026.3.23\n"
)


def test_a_missing_wheel_with_no_network_is_one_line_naming_what_works(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(subprocess, "run", fake_pip(wheel=False, output=OFFLINE))
    with pytest.raises(ConfigError) as caught:
        load_bfcl("simple_python", cache_dir=tmp_path)
    assert str(caught.value) == (
        "--dataset bfcl:simple_python: pip could not reach the package index to fetch "
        f"bfcl-eval==2026.3.23 (no network?; pip's log: {tmp_path / 'fetch.log'}); {OTHERS}"
    )
    assert "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fetch.log"]


def test_a_damaged_wheel_is_named_with_the_way_out(tmp_path: Path) -> None:
    (tmp_path / WHEEL_NAME).write_bytes(b"not a zip")
    with pytest.raises(LanefoldError, match="delete it to fetch again"):
        load_bfcl("simple_python", cache_dir=tmp_path)


def test_the_cache_follows_lanefold_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path))
    assert bfcl_cache() == tmp_path / "bfcl"


def test_load_dataset_reads_the_spec_and_refuses_field_names(cache: Path) -> None:
    items = load_dataset("bfcl:simple_python", limit=2, cache_dir=cache)
    assert [i.meta["id"] for i in items] == ["simple_python_0", "simple_python_1"]
    with pytest.raises(ConfigError, match=r"--answer-field: applies to JSONL and CSV files"):
        load_dataset("bfcl:simple_python", answer_field="x", cache_dir=cache)


GOLD_0 = '{"name": "calculate_triangle_area", "arguments": {"height": 5, "base": 10}}'
GOLD_1 = '{"name": "math_factorial", "arguments": {"number": 5.0}}'
WRONG_13 = '{"name": "calculate_area_under_curve", "arguments": {"function": "x**2", "interval": [2, 3]}}'
QUESTIONS = {
    "Find the area of a triangle with a base of 10 units and height of 5 units.": GOLD_0,
    "Calculate the factorial of 5 using math functions.": GOLD_1,
    "Calculate the area under the curve y=x^2 from x=1 to x=3.": WRONG_13,
}


def tool_config(tmp_path: Path, extract: str = 'method = "tool_call"') -> Path:
    answers = "\n".join(f"{json.dumps(q)} = {json.dumps(a)}" for q, a in QUESTIONS.items())
    path = tmp_path / "calls.toml"
    path.write_text(
        f"""
[loop]
coordinator = "parallel_sample"
k = 3
seed = 3
reducer = "majority_vote"

[prompt]
template = "{{question}}\\nAnswer with one call of a tool.\\n"

[extract]
{extract}

[backend]
kind = "simulated"
accuracy = 1.0
distractors = ['{{"name": "none", "arguments": {{}}}}']
vary_json = true

[backend.answers]
{answers}
""",
        encoding="utf-8",
    )
    return path


def test_an_eval_on_bfcl_runs_each_question_with_its_tools_and_scores_its_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    build_bfcl_wheel(tmp_path / "cache" / "bfcl" / WHEEL_NAME)
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    argv = ["eval", str(tool_config(tmp_path)), "--dataset", "bfcl:simple_python", "--limit", "3"]
    code = main([*argv, "--eval-id", "bf", "--runs-dir", str(runs), "--json"])
    assert code == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert (summary["n"], summary["correct"], summary["scorer"]) == (3, 2, "bfcl")
    rows = [json.loads(line) for line in (runs / "bf" / "results.jsonl").read_text().splitlines()]
    rows.sort(key=lambda row: row["index"])  # the file is in landing order, questions run at once
    assert [(row["answer"], row["correct"]) for row in rows] == [
        ('{"arguments":{"base":10,"height":5},"name":"calculate_triangle_area"}', True),
        ('{"arguments":{"number":5},"name":"math_factorial"}', True),
        ('{"arguments":{"function":"x**2","interval":[2,3]},"name":"calculate_area_under_curve"}', False),
    ]
    started = json.loads((runs / "bf.1" / "events.jsonl").read_text().splitlines()[0])["data"]
    assert [tool["function"]["name"] for tool in started["tools"]] == ["math_factorial"]
    manifest = json.loads((runs / "bf" / "eval.json").read_text())
    assert (manifest["dataset"], manifest["scorer"]) == ("bfcl:simple_python", "bfcl")


def test_a_config_that_reads_no_call_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lanefold.cli import main

    build_bfcl_wheel(tmp_path / "cache" / "bfcl" / WHEEL_NAME)
    monkeypatch.setenv("LANEFOLD_CACHE", str(tmp_path / "cache"))
    config = tool_config(tmp_path, extract="regex = '(.+)'")
    code = main(
        ["eval", str(config), "--dataset", "bfcl:simple_python", "--runs-dir", str(tmp_path / "runs")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().splitlines() == [
        f"orchestrator eval: {WHEEL_NAME}:bfcl_eval/data/BFCL_v4_simple_python.json:1: its question "
        "is answered by a call of its tools, and the config extracts 'regex': set [extract] "
        'method = "tool_call"'
    ]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_executors_job_carries_its_items_tools_to_its_run(cache: Path, tmp_path: Path) -> None:
    from lanefold.config import load_config
    from lanefold.execution import Job, JobSession

    item = load_bfcl("simple_python", cache_dir=cache)[1]
    session = JobSession(load_config(tool_config(tmp_path)), runs_dir=tmp_path / "runs")

    async def go() -> str | None:
        async with session:
            return (await session.run_job(Job(1, item.question, "job-1", 3, item.tools))).answer

    assert anyio.run(go) == '{"arguments":{"number":5},"name":"math_factorial"}'
    started = json.loads((tmp_path / "runs" / "job-1" / "events.jsonl").read_text().splitlines()[0])
    assert [tool["function"]["name"] for tool in started["data"]["tools"]] == ["math_factorial"]
