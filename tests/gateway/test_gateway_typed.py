"""The gateway decides by what a run declares, never by a word in a message (issue 39): a run
without an answer is the key's budget running out (429 `insufficient_quota`) where its loop says
it stopped for the budget (`budget_stop` in its outcome, the rule an eval reads too), and a loop's
own `no_answer` (422) otherwise, whatever its reason's words. On main the gateway looked for
"budget" in the reason, so both runs below were told as the other."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from pydantic import BaseModel, ConfigDict

from lanefold.config import load_config
from lanefold.primitives import LoopContext, Outcome
from tests.gateway.test_gateway import chat, gateway

pytest.importorskip("starlette")


class SilentParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str
    budget_stop: bool


class Silent:
    """A loop that samples nothing and answers nothing, saying why in its own words."""

    name: ClassVar[str] = "silent_probe"
    Params: ClassVar[type[BaseModel]] = SilentParams

    def __init__(self, params: SilentParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        detail = {"budget_stop": True} if self.params.budget_stop else {}
        return Outcome(status="no_answer", reason=self.params.reason, detail=detail)


def _loop(folder: Path, reason: str, budget_stop: bool) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vote.toml"
    path.write_text(
        f'[loop]\ncoordinator = "{__name__}:Silent"\nreason = "{reason}"\n'
        f"budget_stop = {str(budget_stop).lower()}\n\n"
        '[backend]\nkind = "simulated"\n'
    )
    return path


@pytest.mark.parametrize(
    ("reason", "budget_stop", "status", "code"),
    [
        ("the budget committee has not met yet", False, 422, "no_answer"),
        ("nothing could be funded", True, 429, "insufficient_quota"),
    ],
)
def test_a_run_without_an_answer_is_told_by_its_budget_stop_not_its_words(
    tmp_path: Path, reason: str, budget_stop: bool, status: int, code: str
) -> None:
    loops = {"vote": load_config(_loop(tmp_path / "loops", reason, budget_stop))}
    with gateway(tmp_path, loops) as (client, _):
        answer = client.post("/chat/completions", json=chat())
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == (code, code)
    assert reason in error["message"]
