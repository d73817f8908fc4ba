"""Write the arithmetic sample shipped in `examples/datasets/arithmetic/`, the data a first eval
needs with no network: every 1-digit addition and multiplication (0-9 x 0-9, 100 each) and a
seeded 100 of the 8,100 2-digit additions (10-99 x 10-99), with their gold answers.

    python scripts/make_arithmetic_sample.py            # (re)write the files
    python scripts/make_arithmetic_sample.py --check    # exit 1 if a committed file differs

Each file is JSON Lines as `orchestrator eval` reads it, `{"question": "What is 7 plus 5?",
"answer": "12"}`, worded as the examples' few-shot prompt asks ("What is 120 plus 35?"), so a
135M model answers in a few tokens. The order is shuffled by a fixed seed (so `--limit 20` draws
a spread, not 0 + 0 to 1 + 9) using only `random.Random.random()`, the one draw Python promises
to keep the same across versions: the files are the same on every machine, and a test checks
that the committed ones are exactly what this script writes.
"""

from __future__ import annotations

import argparse
import json
import operator
import random
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "examples" / "datasets" / "arithmetic"
SEED = 20250601
TWO_DIGIT_SAMPLE = 100

Pair = tuple[int, int]


def shuffled(pairs: Iterable[Pair], rng: random.Random) -> list[Pair]:
    """The pairs in a seeded order: each gets one `rng.random()` key, in the order given."""
    keyed = [(rng.random(), pair) for pair in pairs]
    return [pair for _, pair in sorted(keyed)]


def rows(pairs: Iterable[Pair], word: str, op: Callable[[int, int], int]) -> list[dict[str, str]]:
    return [{"question": f"What is {a} {word} {b}?", "answer": str(op(a, b))} for a, b in pairs]


def tasks() -> dict[str, list[dict[str, str]]]:
    """Each file's name and rows; one generator seeded once, drawn from in this order."""
    rng = random.Random(SEED)
    one_digit = [(a, b) for a in range(10) for b in range(10)]
    two_digit = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    return {
        "1_digit_addition.jsonl": rows(shuffled(one_digit, rng), "plus", operator.add),
        "1_digit_multiplication.jsonl": rows(shuffled(one_digit, rng), "times", operator.mul),
        "2_digit_addition.jsonl": rows(shuffled(two_digit, rng)[:TWO_DIGIT_SAMPLE], "plus", operator.add),
    }


def render(task_rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in task_rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed file is not what would be written",
    )
    args = parser.parse_args(argv)
    stale = []
    for name, task_rows in tasks().items():
        path, text = FOLDER / name, render(task_rows)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} ({len(task_rows)} questions)")
    for path in stale:
        print(
            f"{path.relative_to(ROOT)}: differs from what this script writes; run it to rewrite",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
