"""The screenshots docs/view.md shows, taken of a small runs folder built here on the simulated
backend: a run, an eval, a compare, a sweep, a gateway key with its runs; each page served by the
view on loopback and taken in headless Chromium (Debian's `chromium`, driven by Playwright) at
a fixed viewport, so the PNGs stay small and the same size.

    .venv/bin/python scripts/view_screenshots.py [--out docs/view] [--keep DIR]

The one way docs/view/ is written: the browser tests check the pages, this draws them. It
needs the dev extra (playwright) and chromium on PATH, and prints each file it wrote.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from starlette.testclient import TestClient

from lanefold.config import parse_config
from lanefold.execution import open_store
from lanefold.serve import gateway_app
from lanefold.view._app import create_app

ROOT = Path(__file__).resolve().parents[1]
VIEWPORT = {"width": 1200, "height": 800}
BACKEND = (
    '[backend]\nkind = "simulated"\nanswer = "391"\naccuracy = 0.6\ndistractors = ["381", "401"]\n'
    "latency_ms = [0, 5]\nprompt_tokens = 40\noutput_tokens = 60\nshares_prefix = true\n"
    "[pricing]\ninput_per_mtok = 0.15\ncached_input_per_mtok = 0.075\noutput_per_mtok = 0.60\n"
    "[extract]\nmethod = \"regex\"\nregex = 'Answer:\\s*([-0-9.,]+)'\n"
)
CONFIGS = {  # what each config file holds beside BACKEND
    "greedy.toml": "[loop]\nk = 1\nseed = 3\n[sampling]\ntemperature = 0.0\nmax_tokens = 96\n",
    "vote.toml": "[loop]\nk = 5\nseed = 3\nmin_quorum = 1\n[sampling]\ntemperature = 0.8\nmax_tokens = 96\n",
    "wide.toml": "[loop]\nk = 9\nseed = 5\nmin_quorum = 1\n[sampling]\ntemperature = 0.8\nmax_tokens = 96\n",
}
GATEWAY_LOOP = {  # what the key `alice` asks the gateway's model `vote` for
    "loop": {"k": 4, "max_concurrency": 4, "seed": 7, "min_quorum": 2},
    "sampling": {"max_tokens": 32, "temperature": 0.8},
    "backend": {"kind": "simulated", "prompt_tokens": 20, "output_tokens": 10, "latency_ms": [0, 0]},
    "pricing": {"input_per_mtok": 0.15, "cached_input_per_mtok": 0.075, "output_per_mtok": 0.6},
}
# (file name, path): each page the docs show
PAGES = [
    ("runs", "/"),
    ("run", "/runs/done"),
    ("eval", "/evals/ev"),
    ("evals", "/evals"),
    ("compare", "/compares/cmp"),
    ("sweep", "/sweeps/sw"),
    ("search", "/?question=17"),
    ("keys", "/keys"),
    ("key-page", "/keys/alice"),
    ("budgets", "/budgets"),
]


def orchestrator(folder: Path, *argv: str) -> str:
    """`orchestrator ARGV` run in `folder`, its output; stops the script where it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "lanefold", *argv], cwd=folder, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"view_screenshots: orchestrator {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def build(folder: Path) -> Path:
    """A runs folder with a run, an eval, a compare, a sweep and a key's runs; its path."""
    for name, body in CONFIGS.items():
        (folder / name).write_text(body + BACKEND)
    questions = [{"question": f"What is 17 * 23? (copy {i})", "answer": "391"} for i in range(12)]
    (folder / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    example = str(ROOT / "examples" / "simulated.toml")
    orchestrator(folder, "run", example, "--question", "What is 17 * 23?", "--run-id", "done")
    orchestrator(folder, "eval", "vote.toml", "--dataset", "q.jsonl", "--eval-id", "ev")
    orchestrator(
        folder, "compare", "greedy.toml", "vote.toml", "wide.toml", "--dataset", "q.jsonl",
        "--equal-budget", "tokens", "--compare-id", "cmp",
    )  # fmt: skip
    orchestrator(
        folder, "sweep", "greedy.toml", "vote.toml", "--dataset", "q.jsonl", "--budgets", "300,600,1200",
        "--sweep-id", "sw",
    )  # fmt: skip
    runs = folder / "runs"
    made = json.loads(orchestrator(folder, "keys", "create", "alice", "--max-tokens", "100000", "--json"))
    loop = parse_config(GATEWAY_LOOP)
    app = gateway_app({"vote": loop}, open_store(None, runs), store_keys=True)
    with TestClient(app, base_url="http://gateway/v1") as client:
        for question in ("What is 17 * 23?", "What is 19 * 21?"):
            body = {"model": "vote", "messages": [{"role": "user", "content": question}]}
            sent = client.post(
                "/chat/completions", json=body, headers={"Authorization": f"Bearer {made['key']}"}
            )
            if sent.status_code != 200:
                sys.exit(f"view_screenshots: the gateway answered {sent.status_code}: {sent.text}")
    return runs


@contextmanager
def served(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port in a thread; its address."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sys.exit("view_screenshots: the view did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def take(runs: Path, out: Path) -> list[Path]:
    """Each page of PAGES, and the key prompt, as `out/<name>.png`."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("view_screenshots: no chromium on PATH: apt-get install chromium")
    out.mkdir(parents=True, exist_ok=True)
    taken = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
        with served(create_app(open_store(None, runs), runs_dir=runs)) as base:
            for name, path in PAGES:
                page.goto(base + path)
                page.wait_for_load_state("load")
                if name == "run":  # a lane opened, as a click on its bar opens it
                    page.locator("#waterfall rect.bar").first.click()
                taken.append(out / f"{name}.png")
                page.screenshot(path=str(taken[-1]))
        with served(create_app(open_store(None, runs), api_key="sesame", runs_dir=runs)) as base:
            page.goto(base + "/")
            taken.append(out / "key.png")
            page.screenshot(path=str(taken[-1]))
        browser.close()
    return taken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "view", help="default docs/view")
    parser.add_argument("--keep", type=Path, help="build the runs folder here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        runs = build(folder)
        for path in take(runs, args.out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
