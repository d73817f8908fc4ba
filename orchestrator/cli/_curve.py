"""`orchestrator curve EVAL_ID --k 1,2,4,8,16`: scaling curves from one eval's pool of lanes.

Reads the eval's results and run logs, calls no backend, prints the table and writes
`runs/<eval_id>/curve.json` and `curve.png`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from lanefold.config import VOTE_REDUCER
from lanefold.evaluate import CURVE_REDUCERS as REDUCERS
from lanefold.evaluate import Curve, read_pool, scaling_curve
from lanefold.primitives import ConfigError

__all__ = ("add_commands", "add_parser", "command", "parse_ks", "plot_curve")

log = logging.getLogger("lanefold.evaluate")


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add `curve` to the `orchestrator` command's subparsers."""
    p = sub.add_parser("curve", help="pass@k and majority@k from an eval's lanes, no sampling")
    p.add_argument("eval_id")
    p.add_argument(
        "--k",
        required=True,
        metavar="K,K,...",
        help="the k values, comma-separated (e.g. 1,2,4,8,16); each at most the lanes of every question",
    )
    p.add_argument(
        "--reducer",
        default=VOTE_REDUCER,
        help=f"{VOTE_REDUCER} (default: majority@k beside pass@k) or pass (pass@k only)",
    )
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="seed of the random subsets where majority@k is subsampled (default: from the eval id)",
    )
    common(p)
    p.add_argument("--json", action="store_true", help="print curve.json")


def command(args: argparse.Namespace) -> int:
    """Compute the curve, write curve.json and curve.png, print the table (or the JSON)."""
    ks = parse_ks(args.k)
    if args.reducer not in REDUCERS:
        raise ConfigError(f"--reducer: unknown reducer {args.reducer!r}: use {' or '.join(REDUCERS)}")
    pool = read_pool(args.runs_dir, args.eval_id)
    curve = scaling_curve(pool, ks, reducer=args.reducer, seed=args.seed)
    folder = Path(args.runs_dir) / args.eval_id
    data = curve.as_json()
    _write_atomic(folder / "curve.json", json.dumps(data, indent=2) + "\n")
    png = plot_curve(curve, folder / "curve.png")
    if args.json:
        print(json.dumps(data))
    else:
        _table(curve, [folder / "curve.json", *([png] if png else [])])
    return 0


def parse_ks(text: str) -> list[int]:
    """`"1,2,4"` -> [1, 2, 4]: positive integers, sorted, each once."""
    ks = set()
    for part in text.split(","):
        try:
            k = int(part.strip())
        except ValueError:
            raise ConfigError(
                f"--k {text!r}: {part.strip()!r} is not an integer; give k values such as 1,2,4,8,16"
            ) from None
        if k < 1:
            raise ConfigError(f"--k {text!r}: k must be at least 1, got {k}")
        ks.add(k)
    return sorted(ks)


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _table(curve: Curve, written: list[Path]) -> None:
    low, high = curve.lanes
    lanes = f"{low} lanes" if low == high else f"{low}-{high} lanes"
    failed = f" ({curve.failed} failed runs left out)" if curve.failed else ""
    scorer = f", scored {curve.scorer}" if curve.scorer else ""
    print(
        f"eval {curve.eval_id}: {curve.questions} questions{failed}, {lanes} each{scorer}; "
        "± is the standard error across questions"
    )
    voting = curve.reducer == VOTE_REDUCER
    print((f"{'k':>4}  {'pass@k':<15}" + ("  majority@k" if voting else "")).rstrip())
    sampled = False
    for p in curve.points:
        line = f"{p.k:>4}  {p.pass_at_k:.3f} ± {p.pass_at_k_se:.3f}  "
        if p.majority_at_k is not None and p.majority_at_k_se is not None:
            mark = "*" if p.exact != curve.questions else ""
            sampled = sampled or bool(mark)
            line += f"  {p.majority_at_k:.3f} ± {p.majority_at_k_se:.3f}{mark}"
        print(line.rstrip())
    if voting:
        print("majority@k: a vote over k of a question's lanes, ties to the first lane")
    if sampled:
        print(
            f"* estimated from {curve.subsamples} random subsets (seed {curve.seed}) for "
            "some questions; ± includes that error"
        )
    print("wrote " + ", ".join(str(path) for path in written))


def plot_curve(curve: Curve, path: Path) -> Path | None:
    """Draw accuracy against k (log scale) with standard-error bars; None, with a warning,
    where matplotlib (the `eval` extra) is not installed."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'lanefold[eval]'): %s not drawn", path)
        return None
    matplotlib.use("Agg")  # headless: no display, no window
    from matplotlib import pyplot as plt

    ks = [p.k for p in curve.points]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    try:
        ax.errorbar(
            ks,
            [p.pass_at_k for p in curve.points],
            yerr=[p.pass_at_k_se for p in curve.points],
            marker="o",
            capsize=3,
            label="pass@k",
        )
        if curve.reducer == VOTE_REDUCER:
            ax.errorbar(
                ks,
                [p.majority_at_k or 0.0 for p in curve.points],
                yerr=[p.majority_at_k_se or 0.0 for p in curve.points],
                marker="s",
                capsize=3,
                label="majority@k",
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_ylim(0.0, 1.02)
        ax.set_xlabel("k (lanes drawn from the pool)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{curve.eval_id}: {curve.questions} questions")
        ax.grid(True, alpha=0.3)
        ax.legend()
        partial = path.with_name(path.name + ".partial")
        fig.savefig(partial, format="png", bbox_inches="tight")
        os.replace(partial, path)
    finally:
        plt.close(fig)
    return path


def add_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Callable[..., None]
) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `curve` to the CLI's subcommands; its handler by name."""
    add_parser(sub, common)
    return {"curve": command}
