"""Evaluating loops on datasets: `orchestrator eval`, `compare`, `curve`, `sweep` and `datasets`.

Each question is one governed run through one Session (the model loaded once); an eval's
folder holds its manifest, per-question results and summary; `compare` runs several configs
on the same questions, `curve` reads an eval's pool of lanes again without sampling, `sweep`
fits every config at every budget for accuracy against paid spend;
`datasets` lists what `--dataset` can name here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from lanefold.evaluate import _compare_cli, _curve_cli, _datasets_cli, _eval_cli, _sweep_cli
from lanefold.evaluate._compare import Comparison, McNemar, run_compare
from lanefold.evaluate._curve import Curve, Pool, majority_at_k, read_pool, scaling_curve
from lanefold.evaluate._datasets import DatasetSpec, load_dataset
from lanefold.evaluate._eval import run_eval
from lanefold.evaluate._eval_records import (
    EvalManifest,
    EvalSummary,
    QuestionResult,
    pass_at_k,
    read_manifest,
    read_results,
    wilson_interval,
)
from lanefold.evaluate._eval_view import is_eval, show_eval, tail_eval
from lanefold.evaluate._item import Item
from lanefold.evaluate._scoring import SCORERS, Score, Scorer, register_scorer, resolve_scorer
from lanefold.evaluate._sweep import Sweep, run_sweep

__all__ = (
    "SCORERS",
    "Comparison",
    "Curve",
    "DatasetSpec",
    "EvalManifest",
    "EvalSummary",
    "Item",
    "McNemar",
    "Pool",
    "QuestionResult",
    "Score",
    "Scorer",
    "Sweep",
    "add_commands",
    "is_eval",
    "load_dataset",
    "majority_at_k",
    "pass_at_k",
    "read_manifest",
    "read_pool",
    "read_results",
    "register_scorer",
    "resolve_scorer",
    "run_compare",
    "run_eval",
    "run_sweep",
    "scaling_curve",
    "show_eval",
    "tail_eval",
    "wilson_interval",
)

Handler = Callable[[argparse.Namespace], int]


def add_commands(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    common: Callable[[argparse.ArgumentParser], None],
) -> dict[str, Handler]:
    """Add `eval`, `compare`, `curve`, `sweep` and `datasets` to the CLI's subcommands; their
    handlers by name."""
    handlers: dict[str, Handler] = {}
    for name, module in (
        ("eval", _eval_cli),
        ("compare", _compare_cli),
        ("curve", _curve_cli),
        ("sweep", _sweep_cli),
        ("datasets", _datasets_cli),
    ):
        module.add_parser(sub, common)
        handlers[name] = module.command
    return handlers
