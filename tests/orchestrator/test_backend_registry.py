"""Backends are a registry kind: a backend written outside the library, named in a config as
`module:Class` beside it, registered by `@register_backend`, or installed with an entry point,
runs a loop through `orchestrator run` and Python; its `[backend]` table is validated by its
own model (unknown keys refused whatever that model allows), errors naming `backend.<key>`.

The plug-in module is written next to the config, as a user keeps it; sys.path, sys.modules
and the registry are restored after each test.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict

import lanefold
from lanefold.cli import main
from lanefold.primitives import BACKENDS, Sample, SampleRequest, Usage, register_backend

QUESTION = "What is 6 * 7?"
MODULE = '''
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from lanefold.primitives import Sample, Usage


class EchoBackend:
    """Every lane answers `config.answer`."""

    max_lanes_per_request = None
    shares_prefix = False

    def __init__(self, config):
        self.name = f"echo:{config.answer}"
        self.answer = config.answer

    def count_prompt_tokens(self, prompt):
        return None

    async def sample(self, request):
        for lane in request.lanes:
            yield Sample(lane=lane.lane, text=f"Answer: {self.answer}", finish_reason="stop",
                         usage=Usage(input_tokens=5, output_tokens=3))

    async def aclose(self):
        pass


class EchoConfig(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)  # the loader refuses unknown keys anyway

    kind: Literal["echo"] = "echo"
    answer: str = "42"

    def build(self):
        return EchoBackend(self)

    def preflight(self):
        return ["answer: must not be 'forbidden'"] if self.answer == "forbidden" else []
'''
CONFIG = '[loop]\nk = 3\n[backend]\nkind = "{kind}"\n{extra}'


class RegisteredBackend:
    """The same echo, for a backend registered by decorator in this process."""

    max_lanes_per_request = None
    shares_prefix = False

    def __init__(self, answer: str) -> None:
        self.name, self.answer = "registered", answer

    def count_prompt_tokens(self, prompt: str) -> int | None:
        return None

    async def sample(self, request: SampleRequest) -> Any:
        for lane in request.lanes:
            yield Sample(
                lane=lane.lane,
                text=f"Answer: {self.answer}",
                finish_reason="stop",
                usage=Usage(input_tokens=5, output_tokens=3),
            )

    async def aclose(self) -> None:
        pass


class Registered(BaseModel):
    """A plug-in model that allows unknown keys by its own config."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: Literal["echo_registered"] = "echo_registered"
    answer: str = "7"

    def build(self) -> RegisteredBackend:
        return RegisteredBackend(self.answer)


@pytest.fixture
def registry() -> Iterator[None]:
    """The backend registry as the test found it."""
    saved = BACKENDS.snapshot()
    yield
    BACKENDS.restore(saved)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, registry: None) -> Iterator[Path]:
    """A user's folder holding `mybackend.py`; sys.path and sys.modules restored after."""
    (tmp_path / "mybackend.py").write_text(MODULE)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("mybackend", None)
    yield tmp_path
    sys.modules.pop("mybackend", None)


@pytest.fixture
def registered(registry: None) -> type[Registered]:
    return register_backend("echo_registered")(Registered)


def write(folder: Path, kind: str, extra: str = "", name: str = "loop") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(CONFIG.format(kind=kind, extra=extra))
    return path


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


# -- runs -----------------------------------------------------------------------------------------


def test_a_backend_beside_its_config_runs_a_loop_through_the_cli(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, runs = write(folder, "mybackend:EchoConfig", 'answer = "42"\n'), folder / "runs"
    assert (
        main(
            [
                "run",
                str(config),
                "--question",
                QUESTION,
                "--runs-dir",
                str(runs),
                "--run-id",
                "echo",
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["answer"] == "42" and sum(result["votes"].values()) == 3
    started = json.loads((runs / "echo" / "events.jsonl").read_text().splitlines()[0])
    # The record names the backend as the config did, so a reader finds it again.
    assert started["data"]["config"]["backend"] == {"kind": "mybackend:EchoConfig", "answer": "42"}
    assert started["data"]["backend"] == "echo:42"
    sys.modules.pop("mybackend", None)
    assert main(["show", "echo", "--runs-dir", str(runs), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == "42"


def test_a_backend_named_as_module_class_runs_from_python(folder: Path) -> None:
    config = lanefold.parse_config(
        {"loop": {"k": 2}, "backend": {"kind": "mybackend:EchoConfig", "answer": "9"}}, folder=folder
    )
    assert type(config.backend).__name__ == "EchoConfig"
    assert config.backend.kind == "mybackend:EchoConfig"
    assert lanefold.build_backend(config.backend).name == "echo:9"
    result = lanefold.run_sync(config, QUESTION, runs_dir=folder / "runs")
    assert result.answer == "9"


def test_a_backend_registered_by_decorator_runs_from_python_and_the_cli(
    registered: type[Registered], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = lanefold.parse_config({"loop": {"k": 2}, "backend": {"kind": "echo_registered"}})
    assert isinstance(config.backend, registered)
    assert lanefold.run_sync(config, QUESTION, runs_dir=tmp_path / "runs").answer == "7"
    path = write(tmp_path, "echo_registered", 'answer = "8"\n')
    assert (
        main(["run", str(path), "--question", QUESTION, "--runs-dir", str(tmp_path / "runs"), "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["answer"] == "8"


def test_a_backend_config_built_in_python_is_taken_as_it_is(
    registered: type[Registered], tmp_path: Path
) -> None:
    config = lanefold.LoopConfig(backend=registered(answer="5"))
    assert config.backend == registered(answer="5")
    assert config.model_dump(mode="json")["backend"] == {"kind": "echo_registered", "answer": "5"}


ENTRY_POINTS = "[lanefold.backends]\nep_echo = mybackend:EchoConfig\n"


def test_an_entry_point_alone_registers_a_backend(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = folder / "mybackend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mybackend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(folder))
    table, _ = BACKENDS.snapshot()
    BACKENDS.restore((table, False))  # as if no entry point had been loaded yet
    config = lanefold.parse_config({"loop": {"k": 2}, "backend": {"kind": "ep_echo"}})
    assert type(config.backend).__name__ == "EchoConfig" and config.backend.kind == "ep_echo"
    assert "ep_echo" in BACKENDS.names() and "echo" in BACKENDS.names()


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "validate"])
def test_an_unknown_kind_is_one_line_naming_backend_kind(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "carrier_pigeon")
    runs = tmp_path / "runs"
    argv = [command, str(path)] + (["--question", "q", "--runs-dir", str(runs)] if command == "run" else [])
    assert main(argv) == 2
    line = one_line(capsys)
    assert (
        f"{path}: backend.kind: unknown backend 'carrier_pigeon' (known: engine, openai, "
        f"simulated; or give 'module:attr')"
    ) in line
    assert not runs.exists()


def test_a_missing_or_unimportable_kind_names_backend_kind(tmp_path: Path) -> None:
    with pytest.raises(lanefold.ConfigError, match=r"^<config>: backend\.kind: required"):
        lanefold.parse_config({"backend": {"answer": "5"}})
    with pytest.raises(
        lanefold.ConfigError, match=r"^<config>: judge\.backend\.kind: cannot import 'nowhere_xyz:C'"
    ):
        lanefold.parse_config({"judge": {"backend": {"kind": "nowhere_xyz:C"}}}, folder=tmp_path)


@pytest.mark.parametrize("kind", ["mybackend:EchoConfig", "echo_registered"])
def test_unknown_keys_are_refused_whatever_the_plugin_model_allows(
    kind: str, folder: Path, registered: type[Registered], capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(folder, kind, "speed = 3\n")
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.load_config(path)
    assert str(caught.value) == f"{path}: backend.speed: unknown key"
    assert main(["run", str(path), "--question", "q", "--runs-dir", str(folder / "runs")]) == 2
    assert one_line(capsys).endswith(f"{path}: backend.speed: unknown key")
    judged = (
        '[loop]\nreducer = "judge_argmax"\n[judge]\ntemplate = "{candidate}"\n'
        f'[judge.backend]\nkind = "{kind}"\nspeed = 3\n'
    )
    path.write_text(judged)
    with pytest.raises(lanefold.ConfigError, match=r"judge\.backend\.speed: unknown key$"):
        lanefold.load_config(path)


def test_every_error_of_a_backend_table_is_a_line_of_validate(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(folder, "simulated", "accuracy = 2.0\nspeed = 3\n")
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(f"{path}: ")[1].split(":")[0] for line in lines[:-1]] == [
        "backend.accuracy",
        "backend.speed",
    ]


def test_a_backends_own_preflight_is_run_and_validate_lists_it(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(folder, "mybackend:EchoConfig", 'answer = "forbidden"\n')
    assert main(["validate", str(path)]) == 2
    assert one_line(capsys).endswith(f"{path}: backend.answer: must not be 'forbidden'")
    runs = folder / "runs"
    assert main(["run", str(path), "--question", "q", "--runs-dir", str(runs)]) == 2
    assert "backend.answer: must not be 'forbidden'" in one_line(capsys)
    assert not runs.exists()


def test_what_is_not_a_backend_config_is_refused(registry: None, tmp_path: Path) -> None:
    class NoBuild(BaseModel):
        kind: str = "nobuild"

    with pytest.raises(TypeError, match="has no 'build' method"):
        register_backend("nobuild")(NoBuild)
    with pytest.raises(TypeError, match="is not a pydantic model"):
        register_backend("plain")(RegisteredBackend)
    (tmp_path / "notabackend.py").write_text("class Thing:\n    pass\n")
    try:
        with pytest.raises(
            lanefold.ConfigError, match=r"backend\.kind: notabackend:Thing is not a pydantic model"
        ):
            lanefold.parse_config({"backend": {"kind": "notabackend:Thing"}}, folder=tmp_path)
    finally:
        sys.modules.pop("notabackend", None)


# -- the schema -----------------------------------------------------------------------------------


def test_the_schema_lists_each_registered_backends_keys(
    registered: type[Registered], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["backend"] == {"$ref": "#/$defs/BackendSection"}
    variants = {v["properties"]["kind"]["const"]: v for v in schema["$defs"]["BackendSection"]["oneOf"]}
    assert {"engine", "openai", "simulated", "echo_registered"} <= set(variants)
    echo = variants["echo_registered"]
    assert set(echo["properties"]) == {"kind", "answer"}
    assert echo["additionalProperties"] is False  # as the loader, whatever the model allows
    assert {"base_url", "model"} <= set(variants["openai"]["required"])
