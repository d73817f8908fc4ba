"""Evaluating loops on datasets: what `orchestrator eval`, `compare`, `curve`, `sweep` and `datasets` run.

Each question is one governed run through one Session (the model loaded once); an eval's
folder holds its manifest, per-question results and summary; `compare` runs several configs
on the same questions, `curve` reads an eval's pool of lanes again without sampling, `sweep`
fits every config at every budget for accuracy against paid spend;
`datasets` lists what `--dataset` can name here.
"""

from __future__ import annotations

from lanefold.evaluate import _bfcl_check  # noqa: F401  (registers the bfcl scorer)
from lanefold.evaluate._catalog import SOURCE_NAMES, Source, find_source, list_sources
from lanefold.evaluate._compare import Compared, Comparison, McNemar, run_compare
from lanefold.evaluate._compare_plot import readable, spend_label
from lanefold.evaluate._curve import REDUCERS as CURVE_REDUCERS
from lanefold.evaluate._curve import Curve, Pool, majority_at_k, read_pool, scaling_curve
from lanefold.evaluate._datasets import DatasetSpec, load_dataset
from lanefold.evaluate._equal_budget import BUDGET_MODES, prompt_tokens, worst_case
from lanefold.evaluate._eval import resume_hint, run_eval
from lanefold.evaluate._eval_records import (
    TOKEN_LINES,
    EvalManifest,
    EvalSummary,
    FittedBudget,
    QuestionResult,
    RescoreSpec,
    is_eval,
    pass_at_k,
    read_manifest,
    read_results,
    read_summary,
    summarize,
    wilson_interval,
)
from lanefold.evaluate._fetch import cache_root
from lanefold.evaluate._fit_record import FitRecord
from lanefold.evaluate._item import Item
from lanefold.evaluate._paired import holm, mcnemar
from lanefold.evaluate._pilot import frontier as pareto_frontier
from lanefold.evaluate._pilot import is_pilot, pilot_id
from lanefold.evaluate._rescore import rereductions, rescore_eval
from lanefold.evaluate._scorer import SCORERS, Score, Scorer, register_scorer
from lanefold.evaluate._scoring import resolve_scorer
from lanefold.evaluate._sweep import Sweep, parse_budgets, run_sweep
from lanefold.evaluate._sweep_records import SweepPoint

__all__ = (
    "BUDGET_MODES",
    "CURVE_REDUCERS",
    "SCORERS",
    "SOURCE_NAMES",
    "TOKEN_LINES",
    "Compared",
    "Comparison",
    "Curve",
    "DatasetSpec",
    "EvalManifest",
    "EvalSummary",
    "FitRecord",
    "FittedBudget",
    "Item",
    "McNemar",
    "Pool",
    "QuestionResult",
    "RescoreSpec",
    "Score",
    "Scorer",
    "Source",
    "Sweep",
    "SweepPoint",
    "cache_root",
    "find_source",
    "holm",
    "is_eval",
    "is_pilot",
    "list_sources",
    "load_dataset",
    "majority_at_k",
    "mcnemar",
    "pareto_frontier",
    "parse_budgets",
    "pass_at_k",
    "pilot_id",
    "prompt_tokens",
    "read_manifest",
    "read_pool",
    "read_results",
    "read_summary",
    "readable",
    "register_scorer",
    "rereductions",
    "rescore_eval",
    "resolve_scorer",
    "resume_hint",
    "run_compare",
    "run_eval",
    "run_sweep",
    "scaling_curve",
    "spend_label",
    "summarize",
    "wilson_interval",
    "worst_case",
)
