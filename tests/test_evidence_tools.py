"""`bench/evidence/tools/`: the structured arithmetic form's scorer (`answer_field:right`) and the
configs the evidence page sweeps; on the simulated backend, so every figure is fixed by its seeds."""

from __future__ import annotations

import importlib.util
import shutil
import tomllib
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from lanefold import parse_config
from lanefold.evaluate import Item, run_eval, run_sweep

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "bench" / "evidence" / "tools"
SCHEMA = '{ type = "object", properties = { answer = { type = "integer" } }, required = ["answer"] }'
CONFIG = f"""[loop]
k = 5
seed = 1

[extract]
method = "json"
schema = {SCHEMA}

[backend]
kind = "simulated"
accuracy = 1.0
answer = '{{"answer": 391}}'
distractors = ['{{"answer": 381}}']
vary_json = true

[log]
fsync = "never"
"""


def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "evidence_report", ROOT / "bench" / "evidence" / "report.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_structured_answer_is_scored_by_its_field_where_exact_calls_it_wrong(tmp_path: Path) -> None:
    # The scorer is looked up beside the config, as the evidence's sweep finds it.
    shutil.copy(TOOLS / "answer_field.py", tmp_path / "answer_field.py")
    config = tmp_path / "vote.toml"
    config.write_text(CONFIG)
    items = [Item(i, f"What is {i} plus 391?", "391") for i in range(6)]
    runs = tmp_path / "runs"

    async def go() -> tuple[float, float]:
        field = await run_eval(
            str(config), items, eval_id="field", runs_dir=runs, scorer="answer_field:right"
        )
        exact = await run_eval(str(config), items, eval_id="exact", runs_dir=runs, scorer="exact")
        return field.accuracy, exact.accuracy

    field, exact = anyio.run(go)
    assert exact == 0.0  # '{"answer":391}' is not the text "391"
    assert field == 1.0


@pytest.mark.parametrize(
    ("answer", "right"),
    [
        ('{"answer":15}', True),
        ('{"answer":16}', False),
        ('{"value":15}', False),
        ("15", False),
        ("not json", False),
        (None, False),
    ],
)
def test_the_field_scorer_reads_the_answer_field_only(answer: str | None, right: bool) -> None:
    spec = importlib.util.spec_from_file_location("answer_field", TOOLS / "answer_field.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.right("15", answer, None) is right


@pytest.mark.parametrize("path", sorted(TOOLS.glob("*.toml")), ids=lambda p: p.name)
def test_the_evidence_configs_load_and_hold_their_answers_to_a_form(path: Path) -> None:
    config = parse_config(tomllib.loads(path.read_text()))
    assert config.extract.resolved_method in ("json", "tool_call")
    greedy = path.stem.endswith("-greedy")
    assert (config.loop.k == 1 and config.sampling.temperature == 0) is greedy


def test_the_lanes_table_says_how_many_lanes_answered_and_were_right(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A distractor the schema refuses is a lane without an answer, as a cut-off lane is.
    tail = CONFIG.split("[backend]")[1].replace("accuracy = 1.0", "accuracy = 0.5")
    tail = tail.replace("""{"answer": 381}""", """{"answer": "381"}""")
    extract = f'[extract]\nmethod = "json"\nschema = {SCHEMA}\n[backend]{tail}'
    greedy = tmp_path / "greedy.toml"
    greedy.write_text("[loop]\nk = 1\nseed = 3\n[sampling]\ntemperature = 0\n" + extract)
    vote = tmp_path / "vote.toml"
    vote.write_text("[loop]\nk = 5\nseed = 3\n" + extract)
    runs = tmp_path / "runs"
    items = [Item(i, f"What is {i} plus 391?", '{"answer":391}') for i in range(20)]

    async def go() -> None:
        await run_sweep(
            [str(greedy), str(vote)], items, sweep_id="ev", budgets=[400], runs_dir=runs, plot=False
        )

    anyio.run(go)
    report().lanes(runs, "ev")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "lanes of sweep ev: 20 questions of <items>"
    assert out[1].split() == [
        "loop",
        "budget",
        "lanes",
        "answered",
        "lane",
        "right",
        "some",
        "lane",
        "right",
        "accuracy",
    ]
    rows = {line.split()[0]: [float(x) for x in line.split()[2:]] for line in out[2:]}
    assert set(rows) == {"greedy", "vote"}
    k, answered, right, some, accuracy = rows["vote"]
    assert k > 1 and 0 < answered < 1  # the refused distractor is no answer
    assert right == pytest.approx(answered, abs=0.001)  # every valid lane here is right
    assert some >= accuracy > 0
