"""Scorers are a plug-in kind: registered by decorator, named as `module:attr` beside the
working directory, or found through the `lanefold.scorers` entry-point group."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import lanefold
from lanefold.evaluate import SCORERS, Item, Score, register_scorer, resolve_scorer, run_eval
from lanefold.primitives import ConfigError, Verifier


@register_scorer("ends_with")
class EndsWith:
    """Right when the answer ends with the spec's argument (default: the gold)."""

    needs_text = False

    def __init__(self, suffix: str | None = None) -> None:
        self.suffix = suffix
        self.name = "ends_with" + (f":{suffix}" if suffix else "")

    @classmethod
    def from_spec(cls, argument: str | None) -> EndsWith:
        return cls(argument)

    def check(self, items: Sequence[Item]) -> None:
        pass

    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        want = self.suffix or (item.answer or "")
        return Score(1.0 if answer is not None and answer.endswith(want) else 0.0)

    def verifier(self, items: Sequence[Item]) -> Verifier | None:
        return None


def _config() -> lanefold.LoopConfig:
    return lanefold.parse_config(
        {
            "loop": {"k": 2, "seed": 3},
            "backend": {"kind": "simulated", "accuracy": 1.0},
            "log": {"fsync": "never"},
        }
    )


def _items() -> list[Item]:
    return [Item(i, f"Question {i}?", "391", source=f"<test>:{i + 1}") for i in range(3)]


@pytest.mark.anyio
async def test_a_registered_scorer_scores_an_eval(tmp_path: Path) -> None:
    right = await run_eval(_config(), _items(), eval_id="mine", runs_dir=tmp_path, scorer="ends_with:91")
    wrong = await run_eval(_config(), _items(), eval_id="other", runs_dir=tmp_path, scorer="ends_with:7")
    assert (right.correct, wrong.correct) == (3, 0)
    assert "ends_with" in SCORERS.names()


def test_built_in_scorers_are_registered_with_their_arguments() -> None:
    assert {"exact", "numeric", "humaneval"} <= set(SCORERS.names())
    assert resolve_scorer("numeric:0.5").name == "numeric:0.5"
    assert resolve_scorer("humaneval:3").name == "humaneval:3"
    with pytest.raises(ConfigError, match=r"^--scorer: 'exact:x': the exact scorer takes no argument$"):
        resolve_scorer("exact:x")


@pytest.fixture
def beside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "myscorers.py").write_text(
        "from lanefold.evaluate import Score\n"
        "class Always:\n"
        "    name = 'always'\n"
        "    needs_text = False\n"
        "    def check(self, items): pass\n"
        "    async def score(self, item, answer, text): return Score(1.0)\n"
        "    def verifier(self, items): return None\n"
        "def never(gold, answer, item): return False\n"
        "NOT_A_SCORER = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import sys

    sys.modules.pop("myscorers", None)


def test_module_attr_names_a_scorer_class_or_a_function(beside: Path) -> None:
    assert resolve_scorer("myscorers:Always").name == "always"
    assert resolve_scorer("myscorers:never").name == "myscorers:never"
    with pytest.raises(ConfigError, match=r"^--scorer: 3 is not a Scorer"):
        resolve_scorer("myscorers:NOT_A_SCORER")


def test_an_unknown_scorer_lists_the_registered_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_scorer("nope")
    message = str(caught.value)
    assert message.startswith("--scorer: unknown scorer 'nope': ")
    assert "numeric[:TOL]" in message and "ends_with" in message and "\n" not in message


@register_scorer("test_raises")
class Raises(EndsWith):
    async def score(self, item: Item, answer: str | None, text: str | None) -> Score:
        raise KeyError("gold")


@pytest.mark.anyio
async def test_a_scorer_that_raises_scores_zero_with_its_error(tmp_path: Path) -> None:
    from lanefold.evaluate import read_results

    summary = await run_eval(_config(), _items(), eval_id="raises", runs_dir=tmp_path, scorer="test_raises")
    assert (summary.n, summary.correct) == (3, 0)
    rows = read_results(tmp_path / "raises" / "results.jsonl")
    assert all("raised KeyError" in (row.error or "") for row in rows.values())
