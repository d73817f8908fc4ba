"""`[prompt] form`: one rule for what a lane sends (issue 38). A config's prompt goes as the
user's turn of a chat wherever the backend takes one, whatever runs it; a config can say "raw";
a log written before the key resumes sending what it sent."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import lanefold
from lanefold.backends.simulated import SimulatedBackend, SimulatedConfig
from lanefold.config import load_config, parse_config
from lanefold.execution import Session, open_store
from lanefold.primitives import ConfigError, LaneOutcome, SampleRequest, hash_config

QUESTION = "What is 17 * 23?"
JUDGED: dict[str, Any] = {
    "loop": {"k": 3, "seed": 5, "reducer": "judge_argmax"},
    "prompt": {"template": "Question: {question}\nEnd with 'Answer: <n>'.\n"},
    "backend": {"kind": "simulated"},
    "judge": {"template": "Q: {question}\nA: {candidate}\nScore (0-10):"},
}


class Capturing(SimulatedBackend):
    """The simulated backend, keeping every request it was sent."""

    def __init__(self) -> None:
        super().__init__(SimulatedConfig())
        self.seen: list[SampleRequest] = []

    def sample(self, request: SampleRequest) -> AsyncIterator[LaneOutcome]:
        self.seen.append(request)
        return super().sample(request)

    def sent(self, purpose: str) -> list[list[tuple[str, str]] | None]:
        """What each request of `purpose` sent besides its prompt: its turns, or None (raw)."""
        return [
            None if r.messages is None else [(m.role, m.content) for m in r.messages]
            for r in self.seen
            if r.purpose == purpose
        ]


def backend(kind: str, **keys: Any) -> dict[str, Any]:
    found = {"kind": kind, **keys}
    if kind == "openai":
        found.setdefault("base_url", "http://127.0.0.1:9/v1")
        found.setdefault("model", "m")
    return found


@pytest.mark.parametrize(
    ("section", "served", "completed"),
    [
        (backend("simulated"), "chat", "raw"),
        (backend("engine"), "chat", "raw"),
        (backend("openai"), "chat", "chat"),  # /chat/completions takes only chats
        (backend("openai", api="completions"), "raw", "raw"),
    ],
    ids=["simulated", "engine", "openai chat", "openai completions"],
)
def test_auto_is_a_chat_wherever_the_backend_takes_one(
    section: dict[str, Any], served: str, completed: str
) -> None:
    config = parse_config({"backend": section})
    assert config.prompt.form == "auto"
    assert config.prompt_form() == served
    assert config.prompt_form(completion=True) == completed  # a gateway /v1/completions request


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"prompt": {"form": "raw"}, "backend": backend("openai")}, 'only "chat" prompts'),
        ({"prompt": {"form": "chat"}, "backend": backend("openai", api="completions")}, 'only "raw"'),
        ({"prompt": {"form": "chat"}, "backend": backend("engine", chat_template=False)}, 'only "raw"'),
        ({"prompt": {"form": "text"}}, "prompt.form: Input should be 'auto', 'chat' or 'raw'"),
    ],
    ids=["raw on a chat endpoint", "chat on a completions endpoint", "chat, template off", "unknown"],
)
def test_a_form_the_backend_cannot_send_is_refused_naming_the_key(raw: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=r"prompt\.form") as caught:
        parse_config(raw)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_every_wave_of_a_run_sends_its_prompt_as_a_chat_by_default(tmp_path: Path) -> None:
    captured = Capturing()
    result = lanefold.run_sync(parse_config(JUDGED), QUESTION, runs_dir=tmp_path, backend=captured)
    assert result.status == "answered"
    prompt = JUDGED["prompt"]["template"].format(question=QUESTION)
    assert captured.sent("sample") == [[("user", prompt)]]
    judged = captured.sent("judge")
    assert len(judged) == 3 and all(
        turns is not None and [r for r, _ in turns] == ["user"] for turns in judged
    )

    raw = Capturing()
    lanefold.run_sync(
        parse_config({**JUDGED, "prompt": {**JUDGED["prompt"], "form": "raw"}}),
        QUESTION,
        runs_dir=tmp_path,
        backend=raw,
    )
    assert raw.sent("sample") == [None] and raw.sent("judge") == [None] * 3


def test_a_raw_form_refuses_a_chats_earlier_turns_before_any_record(tmp_path: Path) -> None:
    store = open_store(None, tmp_path / "runs")
    config = parse_config({**JUDGED, "prompt": {**JUDGED["prompt"], "form": "raw"}})

    async def go() -> None:
        async with Session(config, store=store, backend=Capturing()) as session:
            await session.run(QUESTION, conversation=[("system", "Be brief.")])

    with pytest.raises(ConfigError, match='"raw" sends the prompt as text'):
        anyio.run(go)
    assert list(store.list_runs()) == []


def test_a_log_from_before_the_form_resumes_sending_what_it_sent(tmp_path: Path) -> None:
    # A gateway's chat run as 0.2 wrote it before `[prompt] form`: its sampled lanes sent the
    # chat, its judges a raw prompt. A crash cut the sample wave after its first lane.
    runs = tmp_path / "runs"
    store = open_store(None, runs)

    async def first() -> str:
        async with Session(parse_config(JUDGED), store=store, backend=Capturing()) as session:
            return (await session.run(QUESTION, conversation=[])).run_id

    run_id = anyio.run(first)
    path = runs / run_id / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    cut = next(i for i, e in enumerate(events) if e["type"] == "lane.completed")
    events = events[: cut + 1]
    started = events[0]["data"]
    del started["config"]["prompt"]["form"]
    started["config_hash"] = hash_config(started["config"])
    path.write_text("".join(json.dumps(e) + "\n" for e in events))

    resumed = Capturing()
    result = lanefold.resume_sync(run_id, runs_dir=runs, backend=resumed)
    assert result.status == "answered" and result.resumes == 1
    prompt = JUDGED["prompt"]["template"].format(question=QUESTION)
    assert resumed.sent("sample") == [[("user", prompt)]]  # the chat, as the wave sent it
    assert resumed.sent("judge") == [None] * 3  # raw, as 0.2's judges went


def test_the_engines_chat_template_key_is_deprecated_for_the_form(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "loop.toml"
    path.write_text('[backend]\nkind = "engine"\nchat_template = false\n')
    with caplog.at_level(logging.WARNING, logger="lanefold"):
        config = load_config(path)
    assert config.prompt_form() == "raw"  # it still means what it said, for 0.2
    (record,) = [r for r in caplog.records if r.name == "lanefold.config"]
    assert str(path) in record.getMessage()
    assert (
        'backend.chat_template is deprecated (it goes in 0.3): use [prompt] form = "raw"'
        in record.getMessage()
    )
    recorded = config.model_dump(mode="json")
    assert recorded["backend"]["chat_template"] is False and recorded["prompt"]["form"] == "auto"
    assert "chat_template" not in parse_config({"backend": {"kind": "engine"}}).model_dump()["backend"]
