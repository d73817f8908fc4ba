"""Config files: bad ones exit 2 with one line naming the file and the field; good ones validate.

The CLI runs in-process (`lanefold.cli._main.main`), which is what the `orchestrator` script calls.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

import lanefold
from lanefold.cli import main
from lanefold.config._loop_config import MAX_NESTING

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
SECTIONS = ("loop", "prompt", "sampling", "extract", "backend", "budget", "pricing", "judge", "log")


class BadConfig:
    def __init__(
        self, name: str, text: str, field: str | None, *, suffix: str = ".toml", raw: bytes | None = None
    ) -> None:
        self.name, self.text, self.field, self.suffix, self.raw = name, text, field, suffix, raw

    def write(self, folder: Path) -> Path:
        path = folder / f"{self.name}{self.suffix}"
        if self.raw is not None:
            path.write_bytes(self.raw)
        else:
            path.write_text(self.text, encoding="utf-8")
        return path


BAD_CONFIGS = [
    pytest.param(BadConfig("unknown_top", "colour = 'blue'\n", "colour"), id="unknown-key-top"),
    pytest.param(BadConfig("unknown_loop", "[loop]\nkay = 3\n", "loop.kay"), id="unknown-key-loop"),
    pytest.param(
        BadConfig("unknown_backend", "[backend]\nkind = 'simulated'\nspeed = 3\n", "backend.speed"),
        id="unknown-key-backend",
    ),
    pytest.param(BadConfig("wrong_type", "[loop]\nk = 'eight'\n", "loop.k"), id="wrong-type"),
    pytest.param(BadConfig("wrong_section_type", "loop = 3\n", "loop"), id="section-not-table"),
    pytest.param(
        BadConfig("wrong_list", "[sampling]\nstop = 'END'\n", "sampling.stop"), id="wrong-type-list"
    ),
    pytest.param(BadConfig("bool_for_int", "[loop]\nk = true\n", "loop.k"), id="bool-for-int"),
    pytest.param(BadConfig("str_for_int", "[loop]\nk = '8'\n", "loop.k"), id="string-for-int"),
    pytest.param(
        BadConfig(
            "str_for_bool", "[backend]\nkind = 'simulated'\nshares_prefix = 'yes'\n", "backend.shares_prefix"
        ),
        id="string-for-bool",
    ),
    pytest.param(BadConfig("k0", "[loop]\nk = 0\n", "loop.k"), id="k-zero"),
    pytest.param(
        BadConfig("conc0", "[loop]\nmax_concurrency = 0\n", "loop.max_concurrency"), id="concurrency-zero"
    ),
    pytest.param(
        BadConfig("no_question", "[prompt]\ntemplate = 'Answer this.'\n", "prompt.template"),
        id="template-without-question",
    ),
    pytest.param(
        BadConfig(
            "no_candidate",
            "[loop]\nreducer = 'judge_argmax'\n[judge]\ntemplate = 'Rate the answer to {question}.'\n",
            "judge.template",
        ),
        id="judge-template-without-candidate",
    ),
    pytest.param(
        BadConfig(
            "bad_verifier",
            "[loop]\nreducer = 'judge_argmax'\n[judge]\nverifier = 'no_colon_here'\n",
            "judge.verifier",
        ),
        id="verifier-not-module-function",
    ),
    pytest.param(
        BadConfig("unknown_kind", "[backend]\nkind = 'carrier-pigeon'\n", "backend.kind"),
        id="unknown-backend-kind",
    ),
    pytest.param(
        BadConfig("missing_kind", "[backend]\nanswer = '5'\n", "backend.kind"), id="missing-backend-kind"
    ),
    pytest.param(
        BadConfig(
            "judge_kind",
            "[loop]\nreducer = 'judge_argmax'\n[judge]\n"
            "template = '{question} {candidate}'\n[judge.backend]\nkind = 'nope'\n",
            "judge.backend.kind",
        ),
        id="unknown-judge-backend-kind",
    ),
    pytest.param(
        BadConfig("tag_named_key", "[backend]\nkind = 'simulated'\nopenai = 1\n", "backend.openai"),
        id="unknown-key-named-like-a-backend",
    ),
    pytest.param(
        BadConfig("neg_tokens", "[budget]\nmax_tokens = -1\n", "budget.max_tokens"), id="negative-max-tokens"
    ),
    pytest.param(
        BadConfig("neg_cost", "[budget]\nmax_cost_usd = -0.5\n", "budget.max_cost_usd"),
        id="negative-max-cost",
    ),
    pytest.param(
        BadConfig("neg_price", "[pricing]\ninput_per_mtok = -1.0\n", "pricing.input_per_mtok"),
        id="negative-price",
    ),
    pytest.param(BadConfig("bad_fsync", "[log]\nfsync = 'sometimes'\n", "log.fsync"), id="bad-fsync-policy"),
    pytest.param(
        BadConfig("quorum", "[loop]\nk = 2\nmin_quorum = 3\n", "loop.min_quorum"), id="quorum-above-k"
    ),
    pytest.param(
        BadConfig("judge_nothing", "[loop]\nreducer = 'judge_argmax'\n", "judge.template"),
        id="judge-argmax-without-judge",
    ),
    pytest.param(BadConfig("malformed", "[loop\nk = 3\n", None), id="malformed-toml"),
    pytest.param(BadConfig("not_utf8", "", None, raw=b"[loop]\nk = 3\n# caf\xe9\n"), id="not-utf8"),
    pytest.param(BadConfig("bad_json", '{"loop": {"k": 0}}', "loop.k", suffix=".json"), id="json-k-zero"),
    pytest.param(BadConfig("malformed_json", '{"loop": ', None, suffix=".json"), id="malformed-json"),
    pytest.param(BadConfig("list_json", "[1, 2]", None, suffix=".json"), id="json-not-object"),
]


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {stderr!r}"
    assert "Traceback" not in stderr
    return lines[0]


def _names(line: str, field: str) -> bool:
    # the dotted field as a whole token: `loop.k` must not be satisfied by `loop.kay`
    return re.search(rf"(?<![\w.]){re.escape(field)}(?![\w.])", line) is not None


@pytest.mark.parametrize("bad", BAD_CONFIGS)
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_config_exits_2_with_one_line_naming_file_and_field(
    bad: BadConfig, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad.write(tmp_path)
    runs = tmp_path / "runs"
    argv = (
        [command, str(path)]
        if command == "validate"
        else [command, str(path), "--question", "q", "--runs-dir", str(runs)]
    )
    code = main(argv)
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert code == 2
    assert out == ""
    assert str(path) in line
    if bad.field is not None:
        assert _names(line, bad.field), f"{bad.field!r} not named in {line!r}"
    assert not runs.exists(), "a bad config must not start a run"


def test_malformed_toml_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "late.toml"
    path.write_text("[loop]\nk = 3\nseed = = 4\n")
    assert main(["validate", str(path)]) == 2
    assert "line 3" in _one_line(capsys.readouterr().err)


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nowhere.toml"
    for argv in (
        ["validate", str(path)],
        ["run", str(path), "--question", "q", "--runs-dir", str(tmp_path / "runs")],
    ):
        assert main(argv) == 2
        line = _one_line(capsys.readouterr().err)
        assert str(path) in line


def test_directory_as_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path)]) == 2
    assert str(tmp_path) in _one_line(capsys.readouterr().err)


def test_several_errors_make_one_line_for_run_and_a_list_for_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "many.toml"
    path.write_text("[loop]\nk = 0\nmax_concurrency = 0\nbogus = 1\n")
    assert main(["run", str(path), "--question", "q", "--runs-dir", str(tmp_path / "runs")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert _names(line, "loop.k")
    assert "2 more" in line
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    *errors, count = err.splitlines()
    assert count == "orchestrator validate: 3 errors"
    for error, field in zip(errors, ["loop.k", "loop.max_concurrency", "loop.bogus"], strict=True):
        assert error.startswith(f"orchestrator validate: {path}: {field}: "), error


# -- good configs -----------------------------------------------------------------------------------


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"self_consistency.toml", "best_of_n.toml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert str(path) in out and "ok" in out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_values_survive_loading(path: Path) -> None:
    # Every value the file states is the value the resolved config holds (nothing dropped).
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    resolved = lanefold.load_config(path).model_dump(mode="json")
    for section, values in raw.items():
        for key, value in values.items():
            got = resolved[section][key]
            assert got == value or (isinstance(value, list) and list(got) == value), f"{section}.{key}"


def test_json_config_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = ROOT / "examples" / "simulated.toml"
    raw = tomllib.loads(source.read_text(encoding="utf-8"))
    path = tmp_path / "simulated.json"
    path.write_text(json.dumps(raw))
    assert main(["validate", str(path)]) == 0
    assert "k=8" in capsys.readouterr().out
    assert lanefold.load_config(path) == lanefold.load_config(source)


def test_defaults_make_a_valid_config(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    config = lanefold.load_config(path)
    assert config == lanefold.parse_config({})
    assert config.loop.k >= 1 and config.loop.min_quorum <= config.loop.k


def test_schema_is_json_schema_of_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    schema = json.loads(out)
    assert schema["type"] == "object"
    assert set(SECTIONS) <= set(schema["properties"])
    # editors flag unknown keys only if the schema forbids them, as the loader does
    assert schema["additionalProperties"] is False
    for name, definition in schema["$defs"].items():
        if definition.get("type") == "object" and name != "HookSection":
            assert definition.get("additionalProperties") is False, name
    # a [[hooks]] table's keys are its hook's own (checked by its Params when the config loads)
    assert schema["$defs"]["HookSection"]["required"] == ["kind"]
    # [loop] is one of each registered loop's keys (shared ones included)
    variants = {v["properties"]["coordinator"]["const"]: v for v in schema["$defs"]["LoopSection"]["oneOf"]}
    loop = variants["parallel_sample"]["properties"]
    assert loop["k"]["minimum"] == 1
    assert loop["max_concurrency"]["minimum"] == 1


def test_schema_refs_resolve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    refs = re.findall(r'"\$ref":\s*"#/\$defs/([^"]+)"', json.dumps(schema))
    assert refs
    assert sorted(set(refs) - set(schema["$defs"])) == []


# -- the Python API -----------------------------------------------------------------------------------


def test_load_config_raises_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[loop]\nk = 0\n")
    with pytest.raises(lanefold.ConfigError, match=r"loop\.k") as caught:
        lanefold.load_config(path)
    assert str(path) in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(lanefold.ConfigError, match="cannot read"):
        lanefold.load_config(tmp_path / "missing.toml")
    (tmp_path / "broken.toml").write_text("k = = 1\n")
    with pytest.raises(lanefold.ConfigError, match="TOML"):
        lanefold.load_config(tmp_path / "broken.toml")


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"loop": {"k": 0}}, "loop.k"),
        ({"loop": {"max_concurrency": 0}}, "loop.max_concurrency"),
        ({"budget": {"max_tokens": -1}}, "budget.max_tokens"),
        ({"extra": 1}, "extra"),
        ({"prompt": {"template": "no placeholder"}}, "prompt.template"),
    ],
)
def test_parse_config_raises_config_error_naming_source(raw: dict[str, object], field: str) -> None:
    with pytest.raises(lanefold.ConfigError) as caught:
        lanefold.parse_config(raw, source="inline")
    message = str(caught.value)
    assert message.startswith("inline: ")
    assert _names(message, field)
    assert "\n" not in message
    assert caught.value.exit_code == 2


def test_config_hash_tracks_the_resolved_config() -> None:
    base = lanefold.parse_config({})
    assert lanefold.config_hash(base) == lanefold.config_hash(lanefold.parse_config({}))
    # stating a default explicitly resolves to the same config, so to the same hash
    same = lanefold.parse_config({"loop": {"k": base.loop.k}})
    assert lanefold.config_hash(same) == lanefold.config_hash(base)
    other = lanefold.parse_config({"loop": {"k": base.loop.k + 1}})
    assert lanefold.config_hash(other) != lanefold.config_hash(base)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", lanefold.config_hash(base))


def test_a_configs_record_and_hash_are_made_once_and_a_changed_copy_makes_its_own() -> None:
    base = lanefold.parse_config({"loop": {"k": 3}})
    recorded, digest = base.recorded(), lanefold.config_hash(base)
    assert recorded == base.model_dump(mode="json") and base.recorded() is recorded  # one dict, kept
    assert lanefold.config_hash(base) == digest
    loop = base.loop.model_copy(update={"k": 5})
    changed = base.model_copy(update={"loop": loop})
    assert changed.recorded()["loop"]["k"] == 5 and recorded["loop"]["k"] == 3
    assert lanefold.config_hash(changed) == lanefold.config_hash(lanefold.parse_config({"loop": {"k": 5}}))
    assert lanefold.config_hash(changed) != digest
    assert changed.loop_params.k == 5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[backend]\nkind = 'carrier-pigeon'\n", "backend.kind"),
        ("[backend]\nkind = 'simulated'\nspeed = 3\n", "backend.speed"),
        ("kind = 'simulated'\naccuracy = 2.0\n", "backend.accuracy"),
    ],
)
def test_serve_with_a_bad_backend_config_exits_2(
    text: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "backend.toml"
    path.write_text(text)
    assert main(["serve", "--backend-config", str(path), "--port", "9"]) == 2
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert out == ""
    assert str(path) in line
    assert _names(line, field), line


def test_the_serve_example_is_a_backend_config() -> None:
    from lanefold.config._loop_config import load_backend_config

    backend = load_backend_config(ROOT / "examples" / "serve" / "engine.toml")
    assert backend.kind == "engine"


# -- nesting is bounded ---------------------------------------------------------------------------

DEEP = 100_000
TOO_DEEP = f"nested deeper than {MAX_NESTING} levels (tables and arrays within each other)"
NESTED = [
    pytest.param(".json", '{"loop": ' + "[" * DEEP + "]" * DEEP + "}", id="json-arrays"),
    pytest.param(".json", '{"loop": ' + '{"a": ' * DEEP + "1" + "}" * DEEP + "}", id="json-objects"),
    pytest.param(
        ".json", '{"backend": {"headers": ' + "[" * 40 + "]" * 40 + "}}", id="json-just-past-the-bound"
    ),
    pytest.param(".toml", "x = " + "[" * DEEP + "]" * DEEP + "\n", id="toml-arrays"),
    pytest.param(".toml", "x = " + "{a = " * 2000 + "1" + "}" * 2000 + "\n", id="toml-inline-tables"),
    pytest.param(".toml", ".".join(["a"] * DEEP) + " = 1\n", id="toml-dotted-key"),
    pytest.param(".toml", "[" + ".".join(["a"] * DEEP) + "]\nx = 1\n", id="toml-table-header"),
]


@pytest.mark.timeout(60)  # a dotted key of 100,000 parts took tomllib minutes: refused first
@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize(("suffix", "text"), NESTED)
def test_a_config_nested_past_the_bound_is_one_line_naming_the_file(
    suffix: str, text: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 100,000 deep used to end in a RecursionError traceback (or tomllib's quadratic time).
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    argv = ["run", str(path), "--question", "q?", "--runs-dir", str(tmp_path / "runs")]
    code = main(argv if command == "run" else ["validate", str(path)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert _one_line(err) == f"orchestrator {command}: {path}: {TOO_DEEP}"
    assert not (tmp_path / "runs").exists()


def test_nesting_is_bounded_in_python_too_and_the_bound_is_roomy(tmp_path: Path) -> None:
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(5000):  # a dict built in code, as deep as Python's stack allows to build
        inner["a"] = inner = {}
    with pytest.raises(lanefold.ConfigError, match=re.escape(f"inline: {TOO_DEEP}")):
        lanefold.parse_config({"backend": {"kind": "simulated", "x": deep}}, source="inline")
    # At the bound, a config is read as ever (and refused for what it says, not its depth).
    within: object = 1
    for _ in range(MAX_NESTING - 2):
        within = [within]
    path = tmp_path / "within.json"
    path.write_text(json.dumps({"backend": {"kind": "simulated", "x": within}}))
    with pytest.raises(lanefold.ConfigError, match=r"backend\.x: unknown key"):
        lanefold.load_config(path)
    # A URL, a regex and a dotted template are text: their dots are no nesting.
    path = tmp_path / "dots.toml"
    path.write_text(
        '[prompt]\ntemplate = "' + "a." * 200 + '{question}"\n'
        "[extract]\nregex = '" + r"(\d+)\." * 100 + "'\n  # " + "." * 300 + "\n"
    )
    assert lanefold.load_config(path).prompt.template.startswith("a.a.")
