"""A plug-in that cannot be imported is an error of its own class (issue 39), so whoever acts on
it asks its class, never its words: `PluginImportError` (naming the config key and the spec),
and `PluginNotImportedError` where a reader of a record (`tail`, `show`) did not import it on
purpose. On main both were plain ConfigErrors, told apart by a substring of their message."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import lanefold
from lanefold.config import recorded_config
from lanefold.execution import open_store, read_state
from lanefold.primitives import ConfigError, PluginImportError, PluginNotImportedError
from lanefold.primitives.internal import import_object, plugin_folders, without_plugin_imports

LOOP = """\
from typing import ClassVar

from pydantic import BaseModel

from lanefold import LoopContext, Outcome


class OnceParams(BaseModel):
    pass


class Once:
    name: ClassVar[str] = "once_probe_39"
    Params: ClassVar[type[BaseModel]] = OnceParams

    def __init__(self, params: OnceParams) -> None:
        self.params = params

    async def run(self, ctx: LoopContext, question: str) -> Outcome:
        (lane,) = await ctx.wave([ctx.prompt(question)])
        return Outcome(answer=lane.answer, winner_lane=lane.lane)
"""


def test_a_module_that_cannot_be_imported_is_a_plugin_import_error_naming_its_key() -> None:
    with pytest.raises(PluginImportError) as caught:
        import_object("no_such_module_39:f", key="judge.verifier")
    error = caught.value
    assert isinstance(error, ConfigError) and error.exit_code == 2
    assert (error.key, error.spec) == ("judge.verifier", "no_such_module_39:f")
    assert str(error) == (
        "judge.verifier: cannot import 'no_such_module_39:f': "
        "ModuleNotFoundError: No module named 'no_such_module_39'"
    )


def test_an_attribute_the_module_lacks_is_a_plugin_import_error_too() -> None:
    with pytest.raises(PluginImportError, match=r"loop.reducer: cannot import 'json:no_such_attr'"):
        import_object("json:no_such_attr", key="loop.reducer")


def test_a_reader_of_a_record_skips_a_plug_in_with_an_error_of_its_own() -> None:
    with without_plugin_imports() as skipped, pytest.raises(PluginNotImportedError) as caught:
        import_object("no_such_module_39:f", key="hooks[1].kind")
    assert isinstance(caught.value, PluginImportError)
    assert caught.value.key == "hooks[1].kind" and skipped == ["no_such_module_39:f"]
    assert (
        str(caught.value) == "hooks[1].kind: 'no_such_module_39:f' is not imported by a reader of the record"
    )


def test_the_recorded_config_of_a_run_whose_loop_is_gone_says_where_to_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "once_probe_39.py").write_text(LOOP)
    (folder / "loop.toml").write_text(
        '[loop]\ncoordinator = "once_probe_39:Once"\n\n[backend]\nkind = "simulated"\naccuracy = 1.0\n'
    )
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    result = lanefold.run_sync(lanefold.load_config(folder / "loop.toml"), "What is 1 + 1?", runs_dir=runs)
    (folder / "once_probe_39.py").unlink()
    monkeypatch.delitem(sys.modules, "once_probe_39")
    state = read_state(open_store(None, runs), result.run_id)
    with pytest.raises(PluginImportError) as caught:
        recorded_config(state, "events.jsonl")
    assert caught.value.key == "loop.coordinator"
    assert str(caught.value).endswith(
        f"; the loop must be importable to go on: run from {folder} "
        "or put the folder that holds it on PYTHONPATH"
    )


def test_plugin_folders_touch_the_file_system_only_to_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run enters a config's plug-in folder several times (its loop class, hooks, backend),
    usually for names already imported: the folder is resolved (symlinks followed, a file-system
    walk) only where a module is imported from it, and then it is found there."""
    (tmp_path / "beside_config_mod.py").write_text("VALUE = 41\n")
    resolved: list[str] = []
    real = os.path.realpath

    def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
        resolved.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os.path, "realpath", counted)
    with plugin_folders(tmp_path):
        assert import_object("json:dumps", key="k") is json.dumps  # imported already
        assert resolved == []
        assert import_object("beside_config_mod:VALUE", key="k") == 41
    assert str(tmp_path) in resolved
    sys.modules.pop("beside_config_mod", None)
