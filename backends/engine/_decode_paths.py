"""Which way a model's decode steps go on this machine, chosen once and recorded.

The engine has about eight ways through a step (one or two rows by compiled loops or torch's
kernels, packed copies by oneDNN or AMX's tiles, a lone lane's whole step in one call, the K
forks' whole step over tiles, the shared-prefix attention compiled or over tiles, or layer by
layer through torch), and which applies depends on the CPU, the dtype, the threads and, for two
choices, on which kernel streams faster here, which only a measurement says (`_trials`). So that
a user gets the same path (and the same rounding) on every load and can see which it was:

- the choice is one `DecodePaths`, made once per (machine, model, dtype, threads): by rules
  where the CPU's features, oneDNN's own check and numba decide, by a trial where only a
  measurement can;
- a trial's answer is kept in `${LANEFOLD_CACHE:-~/.cache/lanefold}/engine/paths/<key>.json`,
  keyed by all of that plus the library's, the kernels', torch's and numba's versions, and
  reused by every later load (and process) with the same key: a second load measures nothing.
  A folder that cannot be written is not an error (the next load measures again);
- every lane the engine returns carries it (`Sample.extra["decode_paths"]`, in the run's
  `lane.completed`), and `orchestrator doctor` prints it for the embedded model.

"The model", for the key, is what the trials read: the hidden width (their matrices' width) and
whether every matrix fits AMX's tiles. Where the engine changes its threads between steps
(`ThreadTuner`), the products are chosen again for the new count; the packed copies, laid out at
load, stay as they are.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from lanefold.backends.engine import _arith, _lane_step, _layers, _products, _shared_attention, _tiled_step
from lanefold.backends.engine._cache_folder import cache_dir
from lanefold.backends.engine._compiled import numba_version, sources_digest
from lanefold.backends.engine._machine import Machine, library_version, machine
from lanefold.backends.engine._trials import Trial, tiles_read_faster, torch_reads_faster
from lanefold.backends.engine._weights import ModelArgs

__all__ = ("DecodePaths", "Measure", "Shape", "choose_paths", "for_threads", "paths_dir")

logger = logging.getLogger(__name__)

_LAYOUT = 1  # bump when what a kept choice holds, or how the key is made, changes

Decided = Literal["rules", "measured", "cached"]


@dataclass(frozen=True, slots=True)
class Shape:
    """What of a model the choice reads: its hidden width (the trials' matrices are as wide),
    its head size (attention over tiles takes heads of a multiple of 32) and whether every
    matrix's sides are multiples of 32 (AMX's tiles take them)."""

    width: int
    head_dim: int
    tileable: bool

    @classmethod
    def of(cls, args: ModelArgs) -> Shape:
        """The shape of a model of `args`: its q|k|v, o, gate|up, down and head, as `_model` keeps them."""
        a = args
        sides = (
            (a.num_heads + 2 * a.num_kv_heads) * a.head_dim,
            a.num_heads * a.head_dim,
            a.hidden_size,
            2 * a.intermediate_size,
            a.intermediate_size,
            a.vocab_size,
        )
        return cls(a.hidden_size, a.head_dim, all(side % 32 == 0 for side in sides))


@dataclass(frozen=True, slots=True)
class DecodePaths:
    """The way each kind of step goes for one model on this machine (see the module).

    `products`: one- and two-row products, by the compiled `loops` or `torch`'s kernels;
    `packed`: the copies a bf16 model keeps for three rows and more (`none`, `onednn`, `tiles`);
    `lone_lane`: a lone lane's step, in one compiled call over `tiles` or through the `loops`,
    or `layers` one by one; `shared_prefix`: decode attention over a prefix a group shares,
    over `tiles`, through the compiled `loops`, or `torch`'s products; `forks`: K forks of one
    prompt, every layer in one call over `tiles`, or `layers` one by one; `arithmetic` and
    `attention`: the dtypes products of several rows and torch's fused attention run in.
    `decided`: by `rules` alone, or a trial `measured` now or read back (`cached`); `trials`:
    each trial's best pass per kernel, in ms; `key`: the kept choice's file name.
    """

    device: str
    cpu: str
    dtype: str
    threads: int
    products: Literal["loops", "torch"]
    packed: Literal["none", "onednn", "tiles"]
    lone_lane: Literal["tiles", "loops", "layers"]
    shared_prefix: Literal["tiles", "loops", "torch"]
    forks: Literal["tiles", "layers"]
    arithmetic: str
    attention: str
    decided: Decided
    key: str
    trials: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def by_torch(self) -> bool:
        """Whether one- and two-row products go through torch's kernels."""
        return self.products == "torch"

    def record(self) -> dict[str, Any]:
        """The choice as JSON: what a lane's `backend.decode_paths` and `orchestrator doctor` show."""
        return asdict(self)


class Measure(Protocol):
    """The two trials (`_trials`): a test passes answers of its own, which are never kept."""

    def products(self, threads: int, dtype: torch.dtype, width: int) -> Trial:
        """Whether torch's one-row products read faster than the loops."""
        ...

    def tiles(self, threads: int, width: int) -> Trial:
        """Whether AMX's tiles stream 8 rows faster than oneDNN's packed copies."""
        ...


class _Measured:
    def products(self, threads: int, dtype: torch.dtype, width: int) -> Trial:
        return torch_reads_faster(threads, dtype, width)

    def tiles(self, threads: int, width: int) -> Trial:
        return tiles_read_faster(threads, width)


class _Kept(BaseModel):
    """A kept choice, `paths/<key>.json`: the trials' answers (None: not needed or not run yet)."""

    model_config = ConfigDict(extra="forbid")

    layout: int
    inputs: dict[str, Any]
    torch_faster: bool | None = None
    tiles_faster: bool | None = None
    trials: dict[str, dict[str, float]] = {}


# Choices already made in this process, by key (a model built again measures and reads nothing)
_CHOSEN: dict[str, _Kept] = {}


def paths_dir() -> Path:
    """Where kept choices live: `${LANEFOLD_CACHE:-~/.cache/lanefold}/engine/paths`."""
    return cache_dir() / "paths"


def choose_paths(
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    threads: int | None = None,
    *,
    packed: Literal["none", "onednn", "tiles"] | None = None,
    measure: Measure | None = None,
) -> DecodePaths:
    """The decode paths of a model of `shape` in `dtype` on `device` at `threads` threads
    (torch's now by default). `packed`: the copies a built model already keeps (the choice
    for another thread count keeps them). `measure`: the trials' answers instead of measuring
    them, neither read from nor kept in the cache (for tests)."""
    threads = torch.get_num_threads() if threads is None else threads
    here = machine()
    name = str(dtype).removeprefix("torch.")
    if device.type != "cpu":  # on a GPU everything is torch's, in the model's dtype
        return DecodePaths(
            device.type, here.kind, name, threads, "torch", "none", "layers", "torch", "layers",
            name, name, "rules", _key(_inputs(here, False, shape, name, threads, device)),
        )  # fmt: skip
    loops = _loops_ready()
    packs = _arith.packs(dtype, device)
    bf16 = dtype == torch.bfloat16
    # a trial where both kernels apply: torch's one-row products where there is something for
    # them to read (fp32, or oneDNN's packed bf16); the tiles where a bf16 model packs and fits
    product_trial = loops and (dtype == torch.float32 or (bf16 and packs))
    tiles_trial = packed is None and packs and here.amx and shape.tileable and _tiled_step.ready()
    inputs = _inputs(here, loops, shape, name, threads, device)
    key = _key(inputs)
    kept, decided = _decided(key, inputs, product_trial, tiles_trial, measure, threads, dtype, shape.width)
    if packed is None:
        packed = "tiles" if tiles_trial and kept.tiles_faster else "onednn" if packs else "none"
    products: Literal["loops", "torch"] = "loops"
    if not loops or dtype not in (torch.float32, torch.bfloat16) or (product_trial and kept.torch_faster):
        products = "torch"
    lone_lane: Literal["tiles", "loops", "layers"] = "layers"
    if packed == "tiles":
        lone_lane = "tiles"
    elif products == "loops":
        lone_lane = "loops"
    arithmetic = _arith.compute_dtype(dtype, device)
    shared_prefix: Literal["tiles", "loops", "torch"] = "loops" if loops else "torch"
    if arithmetic == torch.bfloat16 and here.amx and shape.head_dim % 32 == 0:
        shared_prefix = "tiles" if _shared_attention.tiles_ready() else shared_prefix
    forks: Literal["tiles", "layers"] = "layers"
    if packed == "tiles" and shared_prefix == "tiles":
        forks = "tiles"
    return DecodePaths(
        "cpu", here.kind, name, threads, products, packed, lone_lane, shared_prefix, forks,
        str(arithmetic).removeprefix("torch."), str(_arith.sdpa_dtype(dtype, device)).removeprefix("torch."),
        decided, key, dict(kept.trials),
    )  # fmt: skip


def _loops_ready() -> bool:
    """Whether every module of compiled loops is ready (compiling or loading them now)."""
    modules = (_products, _layers, _lane_step, _shared_attention)
    return all(module.ready() for module in modules)


def for_threads(paths: DecodePaths, shape: Shape, dtype: torch.dtype, threads: int) -> DecodePaths:
    """`paths` chosen again for `threads` threads: the products may change, the copies stay."""
    return choose_paths(shape, dtype, torch.device(paths.device), threads, packed=paths.packed)


def _inputs(
    here: Machine, loops: bool, shape: Shape, dtype: str, threads: int, device: torch.device
) -> dict[str, Any]:
    """Everything a choice depends on, as JSON reads it back: what the key hashes and a kept
    choice repeats."""
    inputs = {
        "layout": _LAYOUT,
        "lanefold": library_version(),
        "kernels": sources_digest()[:16],
        "torch": torch.__version__,
        "numba": numba_version(),
        "machine": asdict(here),
        "loops": loops,
        "device": device.type,
        "dtype": dtype,
        "width": shape.width,
        "tileable": shape.tileable,
        "threads": threads,
    }
    return dict(json.loads(json.dumps(inputs)))


def _key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _decided(
    key: str,
    inputs: dict[str, Any],
    product_trial: bool,
    tiles_trial: bool,
    measure: Measure | None,
    threads: int,
    dtype: torch.dtype,
    width: int,
) -> tuple[_Kept, Decided]:
    """The trials' answers for `key`: none where no trial applies; a test's own (`measure`);
    else this process's, the kept file's, or measured now and kept."""
    if not (product_trial or tiles_trial):
        return _Kept(layout=_LAYOUT, inputs=inputs), "rules"
    trial = (product_trial, tiles_trial, threads, dtype, width)
    if measure is not None:
        return _measured(_Kept(layout=_LAYOUT, inputs=inputs), measure, *trial), "measured"
    kept = _CHOSEN.get(key) or _read(key, inputs)
    missing = (product_trial and kept is not None and kept.torch_faster is None) or (
        tiles_trial and kept is not None and kept.tiles_faster is None
    )
    if kept is not None and not missing:
        _CHOSEN[key] = kept
        return kept, "cached"
    kept = _measured(kept or _Kept(layout=_LAYOUT, inputs=inputs), _Measured(), *trial)
    _CHOSEN[key] = kept
    _write(key, kept)
    return kept, "measured"


def _measured(
    kept: _Kept,
    measure: Measure,
    product_trial: bool,
    tiles_trial: bool,
    threads: int,
    dtype: torch.dtype,
    width: int,
) -> _Kept:
    """`kept` with the trials it lacks run now."""
    trials = dict(kept.trials)
    torch_faster, tiles_faster = kept.torch_faster, kept.tiles_faster
    if product_trial and torch_faster is None:
        found = measure.products(threads, dtype, width)
        torch_faster, trials["products"] = found.faster, found.ms
    if tiles_trial and tiles_faster is None:
        found = measure.tiles(threads, width)
        tiles_faster, trials["tiles"] = found.faster, found.ms
    found_now = {"torch_faster": torch_faster, "tiles_faster": tiles_faster, "trials": trials}
    return kept.model_copy(update=found_now)


def _read(key: str, inputs: dict[str, Any]) -> _Kept | None:
    """The kept choice of `key`, if its file reads back whole and is this key's; None else
    (logged, then measured again and written over)."""
    path = paths_dir() / f"{key}.json"
    try:
        kept = _Kept.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        logger.warning("kept decode paths unreadable; measuring again: %s: %s", path, exc)
        return None
    if kept.layout != _LAYOUT or kept.inputs != inputs:
        logger.warning("kept decode paths are another choice's; measuring again: %s", path)
        return None
    return kept


def _write(key: str, kept: _Kept) -> None:
    """Keep `kept` for later loads, whole or not at all; a folder that cannot be written costs
    the next load its trials, nothing else."""
    folder = paths_dir()
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp.write_text(kept.model_dump_json(indent=1))
        os.replace(tmp, folder / f"{key}.json")
    except OSError as exc:
        logger.info("decode paths not kept (%s): the next load measures again", exc)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
