"""A package outside the library adds plug-ins of every kind, each one module plus its entry
point, and the command line uses them by name: nothing under orchestrator/ knows them.

The package is built here, into a temporary folder: its modules and a `.dist-info` with
`entry_points.txt` (what pip would install), found on PYTHONPATH by a fresh `orchestrator`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTERNAL = ("lanefold_ext",)

MODULES = {
    # A loop: ask once per phrasing, the first answer wins. One module, one entry point.
    "lanefold_ext/loop.py": """
        from typing import ClassVar

        from pydantic import BaseModel, ConfigDict, Field

        from lanefold.primitives import Allowance, CostShape, LoopContext, Outcome


        class Params(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)
            phrasings: int = Field(2, ge=1)


        class FirstOfPhrasings:
            name: ClassVar[str] = "ext_first"
            Params: ClassVar[type[BaseModel]] = Params

            def __init__(self, params: Params) -> None:
                self.params = params

            @staticmethod
            def cost_shape(params: Params, *, prompt_tokens: int, max_tokens: int) -> CostShape:
                return CostShape(params.phrasings, params.phrasings * (prompt_tokens + 8), 0)

            @staticmethod
            def fit(params: Params, budget: Allowance) -> Params:
                def price(n: int) -> float:
                    return budget.price(params.model_copy(update={"phrasings": n})) or 0

                n = params.phrasings
                while n > 1 and price(n) > budget.amount:
                    n -= 1
                return params.model_copy(update={"phrasings": n})

            async def run(self, ctx: LoopContext, question: str) -> Outcome:
                prompts = [ctx.prompt(f"{question} (take {i + 1})")
                           for i in range(self.params.phrasings)]
                lanes = await ctx.wave(prompts)
                best = next((lane for lane in lanes if lane.answer), None)
                if best is None:
                    return Outcome(reason="no phrasing gave an answer")
                return Outcome(answer=best.answer, winner_lane=best.lane,
                               winner_text=best.text)
    """,
    # A scorer: right when the answer has the gold's last digit.
    "lanefold_ext/scorer.py": """
        from lanefold.evaluate import Score


        class LastDigit:
            name = "ext_last_digit"
            needs_text = False

            def check(self, items):
                pass

            async def score(self, item, answer, text):
                right = bool(answer) and bool(item.answer) and answer[-1] == item.answer[-1]
                return Score(1.0 if right else 0.0)

            def verifier(self, items):
                return None
    """,
    # A store: runs as files under the folder an `ext://` URL names (a RunStore of its own).
    "lanefold_ext/store.py": """
        from pathlib import Path
        from typing import ClassVar
        from urllib.parse import urlsplit

        from lanefold.stores.files import RunStore


        class ExtStore(RunStore):
            schemes: ClassVar[tuple[str, ...]] = ("ext",)

            @classmethod
            def from_url(cls, url, *, runs_dir="runs", password_env=None):
                return cls(Path(urlsplit(url).path))
    """,
    # A backend: every lane answers the number its config names, a token per character.
    "lanefold_ext/backend.py": """
        from typing import Literal

        from pydantic import BaseModel, ConfigDict

        from lanefold.primitives import Sample, Usage


        class ConstantBackend:
            max_lanes_per_request = None
            shares_prefix = False

            def __init__(self, answer: str) -> None:
                self.name = f"ext_constant:{answer}"
                self.answer = answer

            def count_prompt_tokens(self, request):
                return len(request.prompt)

            async def sample(self, request):
                for lane in request.lanes:
                    text = f"Answer: {self.answer}"
                    yield Sample(lane=lane.lane, text=text, finish_reason="stop",
                                 usage=Usage(input_tokens=len(request.prompt),
                                             output_tokens=len(text)))

            async def aclose(self):
                pass


        class ConstantConfig(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)
            kind: Literal["ext_constant"] = "ext_constant"
            answer: str = "7"

            def build(self):
                return ConstantBackend(self.answer)
    """,
    # A hook: appends each event's type to the file its [[hooks]] table names, and raises on
    # every event besides (a hook can never change a run).
    "lanefold_ext/hook.py": """
        from pydantic import BaseModel, ConfigDict


        class Params(BaseModel):
            model_config = ConfigDict(extra="forbid", frozen=True)
            path: str


        class TypesToFile:
            Params = Params

            def __init__(self, params: Params) -> None:
                self.path = params.path

            def on_event(self, event) -> None:
                with open(self.path, "a") as f:
                    f.write(event.type + "\\n")
                raise RuntimeError("a hook that raises on every event")
    """,
    # A verifier: passes an answer ending in 1.
    "lanefold_ext/verifier.py": """
        def ends_in_one(question, text, answer):
            return bool(answer) and answer.endswith("1")
    """,
}
ENTRY_POINTS = """\
[lanefold.loops]
ext_first = lanefold_ext.loop:FirstOfPhrasings

[lanefold.scorers]
ext_last_digit = lanefold_ext.scorer:LastDigit

[lanefold.backends]
ext_constant = lanefold_ext.backend:ConstantConfig

[lanefold.hooks]
ext_types = lanefold_ext.hook:TypesToFile

[lanefold.stores]
ext_store = lanefold_ext.store:ExtStore

[lanefold.verifiers]
ext_ends_in_one = lanefold_ext.verifier:ends_in_one
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    for name, text in MODULES.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    (site / "lanefold_ext" / "__init__.py").write_text("")
    info = site / "lanefold_ext-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lanefold-ext\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def orchestrator(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    return subprocess.run(
        [str(Path(sys.executable).with_name("orchestrator")), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _config(folder: Path, name: str, loop: str, **sections: str) -> Path:
    text = f'[loop]\n{loop}\n\n[backend]\nkind = "simulated"\naccuracy = 1.0\n'
    for section, body in sections.items():
        text += f"\n[{section}]\n{body}\n"
    path = folder / name
    path.write_text(text)
    return path


def _dataset(folder: Path) -> Path:
    path = folder / "qs.jsonl"
    path.write_text(
        "".join(json.dumps({"question": f"Question {i}?", "answer": "391"}) + "\n" for i in range(3))
    )
    return path


def test_a_loop_from_an_entry_point_runs(installed: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, "ext.toml", 'coordinator = "ext_first"\nphrasings = 3')
    done = orchestrator(installed, tmp_path, "run", str(config), "--question", "What is 17 * 23?", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["answer"], len(result["lanes"])) == ("391", 3)


def test_a_backend_from_an_entry_point_answers(installed: Path, tmp_path: Path) -> None:
    config = tmp_path / "const.toml"
    config.write_text(
        '[loop]\ncoordinator = "ext_first"\n\n[backend]\nkind = "ext_constant"\nanswer = "42"\n'
    )
    done = orchestrator(installed, tmp_path, "run", str(config), "--question", "6 * 7?", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "42"
    config.write_text(config.read_text() + "answr = 1\n")
    refused = orchestrator(installed, tmp_path, "run", str(config), "--question", "6 * 7?")
    assert refused.returncode == 2
    assert refused.stderr.strip().endswith("backend.answr: unknown key"), refused.stderr


def test_a_hook_from_an_entry_point_sees_the_run_and_changes_nothing(installed: Path, tmp_path: Path) -> None:
    seen = tmp_path / "types.txt"
    plain = _config(tmp_path, "plain.toml", 'coordinator = "ext_first"')
    hooked = tmp_path / "hooked.toml"
    hooked.write_text(plain.read_text() + f'\n[[hooks]]\nkind = "ext_types"\npath = "{seen}"\n')
    results = []
    for config, run_id in ((plain, "plain"), (hooked, "hooked")):
        done = orchestrator(
            installed,
            tmp_path,
            "run",
            str(config),
            "--question",
            "What is 17 * 23?",
            "--run-id",
            run_id,
            "--json",
        )
        assert done.returncode == 0, done.stderr
        results.append(json.loads(done.stdout))
    types = seen.read_text().split()
    assert types[0] == "run.started" and types[-1] == "run.completed"
    logged = [
        json.loads(line)["type"]
        for line in (tmp_path / "runs" / "hooked" / "events.jsonl").read_text().splitlines()
    ]
    assert types == logged
    assert (results[0]["answer"], results[0]["votes"]) == (results[1]["answer"], results[1]["votes"])


def test_runs_land_in_an_entry_points_store_and_list_reads_them(installed: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, "ext.toml", 'coordinator = "ext_first"')
    url = f"ext://{tmp_path / 'elsewhere'}"
    done = orchestrator(
        installed,
        tmp_path,
        "run",
        str(config),
        "--question",
        "What is 17 * 23?",
        "--run-id",
        "r1",
        "--store",
        url,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "elsewhere" / "r1" / "events.jsonl").is_file()
    assert not (tmp_path / "runs").exists()
    listed = orchestrator(installed, tmp_path, "list", "--store", url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["run_id"] for line in listed.stdout.splitlines()] == ["r1"]


def test_an_eval_scores_with_an_entry_points_scorer(installed: Path, tmp_path: Path) -> None:
    config = _config(tmp_path, "ext.toml", 'coordinator = "ext_first"')
    done = orchestrator(
        installed,
        tmp_path,
        "eval",
        str(config),
        "--dataset",
        str(_dataset(tmp_path)),
        "--scorer",
        "ext_last_digit",
        "--eval-id",
        "e",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["correct"] == 3


def test_compare_fits_the_external_loop_to_an_equal_token_budget(installed: Path, tmp_path: Path) -> None:
    wide = _config(
        tmp_path, "wide.toml", 'coordinator = "ext_first"\nphrasings = 8', sampling="max_tokens = 64"
    )
    narrow = _config(
        tmp_path, "narrow.toml", 'coordinator = "ext_first"\nphrasings = 2', sampling="max_tokens = 64"
    )
    done = orchestrator(
        installed,
        tmp_path,
        "compare",
        str(wide),
        str(narrow),
        "--dataset",
        str(_dataset(tmp_path)),
        "--equal-budget",
        "tokens",
        "--budget",
        "400",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    compared = json.loads(done.stdout.splitlines()[-1])
    caps = [entry.get("fitted") or {} for entry in compared["configs"]]
    assert caps[0].get("phrasings", 8) < 8, caps  # fitted down to what 400 tokens hold
    assert all(entry["correct"] == 3 for entry in compared["configs"])
    assert all(entry["paid_mean"] <= 1.05 * entry["budget"] for entry in compared["configs"])


def test_sweep_fits_the_external_loop_at_every_budget(installed: Path, tmp_path: Path) -> None:
    wide = _config(
        tmp_path, "wide.toml", 'coordinator = "ext_first"\nphrasings = 8', sampling="max_tokens = 64"
    )
    done = orchestrator(
        installed,
        tmp_path,
        "sweep",
        str(wide),
        "--dataset",
        str(_dataset(tmp_path)),
        "--budgets",
        "200,400",
        "--sweep-id",
        "ext",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    (line,) = json.loads(done.stdout.splitlines()[-1])["configs"]
    phrasings = [point["fitted"].get("phrasings", 8) for point in line["points"]]
    assert phrasings[0] <= phrasings[1] < 8, phrasings  # fitted down, more at the larger budget
    assert all(point["source"] == "eval" and point["accuracy"] == 1.0 for point in line["points"])
    assert all(point["paid_mean"] <= 1.05 * point["budget"] for point in line["points"])


def test_a_verifier_from_an_entry_point_judges(installed: Path, tmp_path: Path) -> None:
    config = _config(
        tmp_path, "vote.toml", 'k = 4\nreducer = "any_pass"', judge='verifier = "ext_ends_in_one"'
    )
    done = orchestrator(installed, tmp_path, "run", str(config), "--question", "What is 17 * 23?", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answer"] == "391"


def test_the_facade_names_none_of_them() -> None:
    names = [
        name
        for module in MODULES.values()
        for name in (
            "ext_first",
            "ext_last_digit",
            "ext_ends_in_one",
            "ExtStore",
            "ext_constant",
            "ext_types",
        )
        if name in module
    ] + list(EXTERNAL)
    named = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "orchestrator").rglob("*.py")
        for name in set(names)
        if name in path.read_text()
    )
    assert named == []
