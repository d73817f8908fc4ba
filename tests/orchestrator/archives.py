"""Dataset archives in their real formats, built by the tests so that none is ever fetched: a
BIG-bench `benchmark_tasks` folder in miniature, an `evals` wheel holding a registry, and a
`bfcl-eval` wheel holding a few of BFCL's own entries (`tests/orchestrator/bfcl/`, copied line
for line from bfcl_eval-2026.3.23's data and possible answers)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

ADDITION = {
    "name": "1_digit_addition",
    "examples": [
        {"input": "What is 0 plus 0?", "target": "0", "target_scores": {"2": 0.0, "banana": 0.0, "0": 1.0}},
        {"input": "What is 1 plus 2?", "target": ["3", "three"]},
    ],
}
CHOICE = {
    "name": "colours",
    "task_prefix": "Pick one.\n",
    "examples": [{"input": "The sky is", "target_scores": {"red": 0, "blue": 1, "green": 0}}],
}


def tasks_tree(root: Path) -> Path:
    """A benchmark_tasks folder in miniature: a group with two subtasks, and a choice task."""
    for path, data in {
        "arithmetic/task.json": {"name": "arithmetic", "description": "a group"},
        "arithmetic/1_digit_addition/task.json": ADDITION,
        "arithmetic/1_digit_subtraction/task.json": {
            "examples": [{"input": "What is 5 minus 2?", "target": "3"}]
        },
        "colours/task.json": CHOICE,
    }.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(json.dumps(data))
    (root / "arithmetic" / "generate_examples.py").write_text("# not kept\n")
    return root


SYSTEM = "Answer with a number only."
# The registry as the evals 3.0.1.post1 wheel lays it out: an eval name whose `id` names a spec
# (not always `<name>.dev.v0`) with `args.samples_jsonl`, a model-graded set without `ideal`,
# an eval reading from elsewhere (no samples_jsonl), one naming a file the wheel lacks, and a
# registry file that does not parse.
REGISTRY = {
    "evals/registry/evals/sums.yaml": """\
sums:
  id: sums.test.v1
  description: Small sums, asked in chat messages.
  metrics: [accuracy]
sums.test.v1:
  class: evals.elsuite.basic.match:Match
  args:
    samples_jsonl: sums/samples.jsonl
graded:
  id: graded.dev.v0
  metrics: [accuracy]
graded.dev.v0:
  class: evals.elsuite.modelgraded.classify:ModelBasedClassify
  args:
    samples_jsonl: graded/samples.jsonl
    eval_type: cot_classify
""",
    "evals/registry/evals/elsewhere.yaml": """\
hub-set:
  id: hub-set.test.v1
  metrics: [accuracy]
hub-set.test.v1:
  class: evals.elsuite.mmlu:MMLU
  args:
    dataset: hf://cais/mmlu?name=anatomy
missing-file:
  id: missing-file.dev.v0
  metrics: [accuracy]
missing-file.dev.v0:
  class: evals.elsuite.basic.match:Match
  args:
    samples_jsonl: nowhere/samples.jsonl
""",
    "evals/registry/evals/broken.yaml": "broken: [never closed\n",
}
SUMS: list[Any] = [
    {
        "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "2 + 2 ="}],
        "ideal": ["4", "four"],
    },
    {"input": "What is 3 plus 4?", "ideal": "7", "source": "hand-written"},
    {"input": [{"role": "user", "content": "9 - 1 ="}]},  # no ideal: skipped
    {"input": [{"role": "user", "content": "1 + 1 ="}], "ideal": ""},  # empty: skipped
    {"input": {"codeword": "at"}, "ideal": "at"},  # not text: skipped
    {
        "input": [
            {"role": "system", "content": SYSTEM},
            {"role": "system", "name": "example_user", "content": "1 + 2 ="},
            {"role": "system", "name": "example_assistant", "content": "3"},
            {"role": "user", "content": "5 + 5 ="},
        ],
        "ideal": 10,
    },
]
GRADED = [
    {"input": [{"role": "user", "content": "Write a poem."}]},
    {"input": "Write another.", "choice": "Y"},
]


def build_evals_wheel(path: Path) -> Path:
    """An `evals-3.0.1.post1-py3-none-any.whl` in miniature at `path`: a zip with the package's
    registry YAML and JSONL data where the real wheel has them, and a little code beside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("evals/__init__.py", "")
        zf.writestr("evals-3.0.1.post1.dist-info/METADATA", "Name: evals\nVersion: 3.0.1.post1\n")
        for member, text in REGISTRY.items():
            zf.writestr(member, text)
        zf.writestr(
            "evals/registry/data/sums/samples.jsonl", "".join(json.dumps(row) + "\n" for row in SUMS) + "\n"
        )
        zf.writestr(
            "evals/registry/data/graded/samples.jsonl", "".join(json.dumps(row) + "\n" for row in GRADED)
        )
        zf.writestr("evals/registry/data/sums/make_samples.py", "# not data\n")
    return path


BFCL_ENTRIES = Path(__file__).resolve().parent / "bfcl"


def build_bfcl_wheel(path: Path, *, extra: dict[str, str] | None = None) -> Path:
    """A `bfcl_eval-2026.3.23-py3-none-any.whl` in miniature at `path`: BFCL's entries of
    `simple_python`, `multiple` and `live_simple` (a few each) and their possible answers where
    the real wheel has them, a little code beside; `extra` adds members (name: text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("bfcl_eval/__init__.py", "")
        zf.writestr("bfcl_eval-2026.3.23.dist-info/METADATA", "Name: bfcl-eval\nVersion: 2026.3.23\n")
        for file in sorted(BFCL_ENTRIES.glob("*.json")):
            answers = file.name.startswith("possible_answer_")
            name = file.name.removeprefix("possible_answer_")
            folder = "bfcl_eval/data/possible_answer/" if answers else "bfcl_eval/data/"
            zf.writestr(folder + name, file.read_text(encoding="utf-8"))
        for member, text in (extra or {}).items():
            zf.writestr(member, text)
    return path
