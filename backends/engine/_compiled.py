"""What every compiled kernel of the engine shares: numba's jit with the house flags and a cache
of its own, the bf16 bits, a vectorised exp, and numpy's view of a tensor's memory.

The kernels are loops numba compiles (part of the `engine` extra), split by concern:
`_products` (one or two rows by a matrix), `_layers` (a layer's work around attention),
`_lane_step` (a lone lane's whole step), `_shared_attention` (decode attention over a shared
prefix), `_tiles` and `_tiled_step` (AMX's tile unit). Without numba, or where it cannot compile
them, each module's `ready()` is False and the engine uses torch's kernels.

numba caches what it compiles on disk, so only a machine's first load pays for it (1.6 s for the
loops, some 12 s for everything on a Xeon with AMX): here in `${LANEFOLD_CACHE}/engine/numba/`
(a folder per installed copy of the package, as numba names its own), not beside the modules
(an installed package's folder is often read-only). numba stamps each cached function with its own
file, but a compiled call inlines the functions it calls from other modules, so every kernel
here is stamped with all the kernel modules' sources together (`sources_digest`): an edit of
any of them recompiles every one, as when they were one file. Where the folder cannot be
written, the kernels compile in memory, once a process.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lanefold.backends.engine._cache_folder import cache_dir

try:
    import numba
except ImportError:  # pragma: no cover - numba is in the engine extra
    numba = None  # type: ignore[assignment]

__all__ = (
    "KERNEL_MODULES",
    "compiled",
    "numba_cache_dir",
    "numba_version",
    "sources_digest",
)

logger = logging.getLogger(__name__)

# Every module of compiled kernels: their sources together stamp each one's cache
KERNEL_MODULES = (
    "_compiled",
    "_products",
    "_layers",
    "_lane_step",
    "_shared_attention",
    "_tiles",
    "_tiled_step",
)


@functools.cache
def sources_digest() -> str:
    """sha256 of the kernel modules' sources, in `KERNEL_MODULES`' order: the stamp of every
    cached kernel, and part of the key of a decode-path choice."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in KERNEL_MODULES:
        digest.update((here / f"{name}.py").read_bytes())
    return digest.hexdigest()


def numba_version() -> str | None:
    """The numba the kernels compile with (None: not installed, the kernels are torch's)."""
    return None if numba is None else str(numba.__version__)


def numba_cache_dir() -> Path:
    """Where numba keeps the compiled kernels: `${LANEFOLD_CACHE:-~/.cache/lanefold}/engine/numba`."""
    return cache_dir() / "numba"


if numba is not None:
    from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator

    class _Locator(_CacheLocator):
        """The engine's folder for a kernel, stamped with every kernel module's source."""

        def __init__(self, py_func: Any, py_file: str) -> None:
            self._lineno = py_func.__code__.co_firstlineno
            # a folder per installed copy of the kernels (numba's own naming: the package's
            # folder's name and a hash of its path), so two checkouts never overwrite each other
            self._path = str(numba_cache_dir() / self.get_suitable_cache_subpath(py_file))  # type: ignore[no-untyped-call]

        def get_cache_path(self) -> str:
            return self._path

        def get_source_stamp(self) -> str:
            return sources_digest()

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> _Locator | None:
            locator = cls(py_func, py_file)
            try:
                locator.ensure_cache_path()  # type: ignore[no-untyped-call]
            except OSError:  # the folder cannot be made or written
                return None
            return locator

    class _Impl(CompileResultCacheImpl):
        _locator_classes = [_Locator]  # noqa: RUF012  # (numba's own attribute, read at __init__)

    class _Cache(FunctionCache):
        _impl_class = _Impl


def _jit(fn: Callable[..., Any]) -> Any:
    """`fn` compiled by numba on first call, cached in `numba_cache_dir()` where it can be written."""
    if numba is None:  # pragma: no cover - numba is in the engine extra
        return fn
    # numpy's error model: a division by zero gives inf as in numpy, with no check in the loop
    # (Python's raises, and its check keeps LLVM from vectorising a loop that divides)
    flags: dict[str, Any] = {
        "fastmath": {"reassoc", "contract"},
        "nogil": True,
        "boundscheck": False,
        "error_model": "numpy",
    }
    dispatcher = numba.njit(**flags)(fn)
    try:
        dispatcher._cache = _Cache(fn)  # type: ignore[no-untyped-call]  # `cache=True`, in our folder
    except RuntimeError:  # nowhere to write the cache (a read-only folder): in memory only
        pass
    return dispatcher


def compiled(what: str, calls: Callable[[], None]) -> bool:
    """Whether `calls` (a module's kernels each called once on tiny arrays: compiled, or loaded
    from the cache) ran; False, logged once by the caller's cache, where numba is missing or
    failed. An LLVM or numba failure must not stop the engine: it only costs speed."""
    if numba is None:  # pragma: no cover - numba is in the engine extra
        logger.info("numba is not installed: the %s go through torch's kernels", what)
        return False
    try:
        calls()
    except Exception:
        logger.warning("numba could not compile the %s: using torch's kernels", what, exc_info=True)
        return False
    return True


# The loops take every weight as uint32 words (`_words`): an fp32 weight one word a value, a
# bf16 weight two values a word (`halves`), the even column in the low half.

_LINE = 16  # words in a 64-byte cache line


def _prefetch_hint(typingctx: Any, words: Any, index: Any) -> Any:
    """`_prefetch(words, index)`: a software prefetch (`prefetcht2` on x86) of the line holding
    `words`' `index`th word, counted flat from the first; a hint that never faults, so it may
    point past the array (into the arena's next tensor). The bf16 loop asks for the row pair
    after the one it reads: the hardware's prefetchers alone kept a core's stream of bf16 rows
    576 wide at 13.1-13.5 GB/s, asking a pair ahead into L2 at 14.5-16.2 (the Xeon with AMX, one
    thread, a step's matrices on huge pages; in the step, 31.3 against 29.2 ms). The fp32 loop,
    four rows at a time, was slower with it (49.5-50.2 against 47.1-47.5 ms)."""
    from llvmlite import ir  # type: ignore[import-untyped]
    from numba.core import cgutils, types

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        byte, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        kind = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, kind, "llvm.prefetch.p0i8")  # type: ignore[no-untyped-call]
        # a read, locality 1 (to L2, not L1: each row is read once), of data
        builder.call(fn, [builder.bitcast(builder.gep(data, [args[1]]), byte), i32(0), i32(1), i32(1)])
        return context.get_dummy_value()

    return types.void(words, index), codegen


if numba is not None:
    from numba.extending import intrinsic

    _prefetch: Any = intrinsic(_prefetch_hint)
else:  # pragma: no cover - numba is in the engine extra (and the loops are not run without it)
    _prefetch = None


def _narrowed(value: Any) -> Any:  # pragma: no cover - compiled
    """The bf16 bits of an fp32 value, rounded to nearest even as torch rounds (NaN stays NaN)."""
    bits = np.float32(value).view(np.uint32)
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16(0x7FC0)
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


_narrowed = _jit(_narrowed)


def _stored(like: Any, value: Any) -> Any:  # pragma: no cover - replaced by its overload
    """`value` (fp32) as an element of the array `like`: bf16 bits where it holds them (uint16)."""


def _wide(value: Any) -> Any:  # pragma: no cover - replaced by its overload
    """An element `_stored` wrote (bf16 bits or fp32) as fp32."""


def _exp(x: Any) -> Any:  # pragma: no cover - compiled
    """e ** x as 2 ** (x log2 e) with a degree-6 polynomial: within 2e-7 of `exp` relatively,
    and it vectorises, where `np.exp` calls libm a value at a time (a lone lane's attention
    takes some 4700 a layer, SwiGLU 1536 a row); held within 2 ** -126 and 2 ** 127."""
    t = min(max(x * np.float32(1.4426950408889634), np.float32(-126.0)), np.float32(127.0))
    k = np.floor(t + np.float32(0.5))
    f = (t - k) * np.float32(0.6931471805599453)
    p = np.float32(1.0 / 720.0)
    for c in (np.float32(1.0 / 120.0), np.float32(1.0 / 24.0), np.float32(1.0 / 6.0), np.float32(0.5)):
        p = p * f + c
    p = (p * f + np.float32(1.0)) * f + np.float32(1.0)
    return p * np.uint32(np.uint32(np.int32(k) + 127) << np.uint32(23)).view(np.float32)


_exp = _jit(_exp)


if numba is not None:
    from numba.extending import overload

    @overload(_stored)
    def _stored_as(like: Any, value: Any) -> Any:
        def bits(like: Any, value: Any) -> Any:  # (numba wants the signatures alike)
            return _narrowed(value)

        def single(like: Any, value: Any) -> Any:
            return np.float32(value)

        return bits if like.dtype == numba.types.uint16 else single

    @overload(_wide)
    def _wide_as(value: Any) -> Any:
        def bits(value: Any) -> Any:
            return np.uint32(np.uint32(value) << np.uint32(16)).view(np.float32)

        def single(value: Any) -> Any:
            return np.float32(value)

        return bits if value == numba.types.uint16 else single


def _words(weight: Tensor) -> Any:
    """A contiguous CPU weight's memory as uint32 words (see the loops)."""
    return weight.view(torch.int32).numpy().view(np.uint32)


def _array(tensor: Tensor) -> Any:
    """A contiguous CPU tensor's memory as numpy sees it: fp32 as float32, bf16 as its bits
    (uint16), as `_stored` writes them."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def _takes(weight: Tensor) -> bool:
    """Whether the loops read `weight`: a contiguous CPU matrix in fp32, or bf16 of even width."""
    return (
        weight.device.type == "cpu"
        and weight.is_contiguous()
        and (weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and weight.shape[-1] % 2 == 0))
    )


def _rows_of(x: Tensor) -> Any:
    return x.float().contiguous().numpy()
