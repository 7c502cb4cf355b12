"""BLAS thread control: GEMMs that share the cores without stalling on a busy machine.

numpy's OpenBLAS splits every GEMM above a tiny size statically over all its threads, and its
threads spin while they wait for each other. On a small GEMM (a mobile net's 1x1 convolution:
5-20 million MACs) the split gains little, and on a busy machine a descheduled partner thread
stalls the whole GEMM for a scheduler tick: measured up to 100x slower than one thread. So:

- a GEMM of fewer than :data:`SMALL_MACS` multiply-accumulates runs on one BLAS thread;
- a larger one (:func:`matmul`) is split by output rows (or, for a wide product, columns,
  where the kernel allows: below) into at most :data:`PARTS` pieces, one per core, run by
  the calling thread and :mod:`.cores`' helper threads, each piece a one-thread BLAS call
  (numpy releases the GIL): no BLAS thread spins waiting for another. Each piece keeps more
  than :data:`SMALL_GEMM` MACs (:func:`edges`): OpenBLAS sends smaller products to another
  kernel, which sums in another order, so a split with a smaller piece changed the bits (53
  of 196 random shapes); with every piece above it, none of 907 did.
- a split must not change the bits, so it follows the sgemm kernel OpenBLAS picked for this
  CPU (:func:`kernel_split`): rows are cut at multiples of the kernel's block of output rows
  (an edge block is summed in another order), and columns only where that kernel keeps a
  column piece's bits. Where the kernel is not one measured here (another BLAS, another core
  type), GEMMs run whole. (Row cuts were at any row before the Haswell kernels showed the
  block mattering; on SkylakeX they are now at multiples of 16, where a cut inside a 16-row
  block could change the bits.)

A caller running many kernels (the firmware, for a whole program run) holds :func:`one_thread`
around them all: raising the library's thread count again after every kernel woke OpenBLAS's
threads, which then spun beside the next kernels (mobile nets measured 1.5-2x slower). The
library's own thread setting is restored afterwards; the user's environment (e.g.
``OPENBLAS_NUM_THREADS``, ``OPENBLAS_CORETYPE``) is never changed. threadpoolctl finds the
BLAS numpy loaded, whatever its symbol prefix. Measured on a 2-core machine shared with other
jobs (load 6-9): light_resnet50 went from 1.9 s to 0.5-0.7 s per run, onnxruntime 0.5 s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import cache
from pathlib import Path

import numpy as np

from . import cores

SMALL_MACS = 1 << 22
"""GEMMs below this many MACs run whole on one BLAS thread (idle machine, medians of 15 runs:
2**22 was 5-15% faster than 2**25 or 2**20 on ResNet-50, MobileNet-V3 and EfficientNet)."""
THREADS = cores.THREADS
PARTS = THREADS
"""Pieces a large GEMM is split into: one per thread. Twice as many pieces (so a stalled
thread's share is smaller) measured slower on light_resnet50 both idle (87-100 ms against
121-125 ms a run) and with one core kept busy (138-165 ms against 151-182 ms)."""

SMALL_GEMM = 100 ** 3
"""OpenBLAS's SkylakeX kernels run products of at most this many MACs on their small-matrix
kernel; every piece of a split stays above it, whatever the kernel."""

#: OpenBLAS's sgemm kernels measured here (0.3.31), by core name (threadpoolctl's
#: ``architecture``, lowercased): the block of output rows of a row-major product they compute
#: together, and whether a product split by output columns keeps its bits. SkylakeX (AVX-512,
#: Zen 4): rows in blocks of 16, column pieces exact (907 random shapes). Haswell (AVX2, Zen 3):
#: cuts at multiples of 12 rows gave the whole product's bits on every shape tried, at 3, 4, 6,
#: 8, 9, 16, 18, 30 and 32 not; column pieces differed at every cut (16 to 6272 columns).
#: ``tests/kernels/test_blas.py`` checks the host's entry on every run. Kernels that build on
#: these (Cooperlake, Zen) are left out until measured: their GEMMs run whole.
KERNELS: dict[str, tuple[int, bool]] = {"skylakex": (16, True), "haswell": (12, False)}

_LOCK = threading.Lock()
_depth = 0  # nesting of one_thread() over all threads: the library's setting is restored at 0
_held = threading.local()  # .depth: this thread's nesting
_saved: list[int] = []


@cache
def _libraries() -> tuple:
    from threadpoolctl import ThreadpoolController

    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@cache
def kernel_split() -> tuple[int, bool] | None:
    """How a GEMM of numpy's BLAS may be split without changing its bits: (:data:`KERNELS`'s
    row block, whether by columns too), or None (run whole) for a kernel not measured here, or
    a BLAS that is not the OpenBLAS numpy's wheel bundles (``numpy.libs``, ``numpy/.dylibs``)."""
    package = Path(np.__file__).parent
    bundled = (package.parent / "numpy.libs", package / ".dylibs")
    libs = [lib for lib in _libraries()
            if lib.internal_api == "openblas" and Path(lib.filepath).parent in bundled]
    return KERNELS.get(str(libs[0].architecture).lower()) if len(libs) == 1 else None


@contextmanager
def one_thread() -> Iterator[None]:
    """BLAS calls inside run on one thread (nests; the outermost exit restores the setting)."""
    global _depth
    libs = _libraries()
    with _LOCK:
        if _depth == 0:
            _saved[:] = [lib.get_num_threads() for lib in libs]
            for lib in libs:
                lib.set_num_threads(1)
        _depth += 1
    _held.depth = getattr(_held, "depth", 0) + 1
    try:
        yield
    finally:
        _held.depth -= 1
        with _LOCK:
            _depth -= 1
            if _depth == 0:
                for lib, n in zip(libs, _saved, strict=True):
                    lib.set_num_threads(n)


def held() -> bool:
    """Whether this thread's caller (the firmware, for a whole run) holds :func:`one_thread`
    already: entering it again per GEMM cost 5-10 us of Python, a fifth of a mobile net's small
    1x1 convolution. Per thread: another thread's hold ends when that thread's run does."""
    return getattr(_held, "depth", 0) > 0


def single_thread():
    """:func:`one_thread`, or nothing if this thread holds it already (:func:`held`)."""
    return nullcontext() if held() else one_thread()


@contextmanager
def threads_for(macs: int) -> Iterator[None]:
    """Run the enclosed BLAS calls on one thread if ``macs`` is below :data:`SMALL_MACS`."""
    if macs >= SMALL_MACS or held():
        yield
        return
    with one_thread():
        yield


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` for float operands with ``a`` of rank >= 2, a large product
    split by rows of ``a``, or by columns of ``b`` when it is wider, over the cores (see the
    module docstring)."""
    if out is None:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2],) + b.shape[-1:]
        out = np.empty(shape, np.result_type(a, b))
    rows = a.shape[-2]
    macs = out.size * a.shape[-1]
    split = kernel_split() if macs >= SMALL_MACS and rows >= 2 and THREADS >= 2 else None
    if split is None:
        if held():
            return np.matmul(a, b, out=out)
        with threads_for(macs):
            return np.matmul(a, b, out=out)
    block, by_columns = split
    columns = out.shape[-1]
    with single_thread():
        if by_columns and b.ndim >= 2 and columns > rows:
            # A convolution's wide GEMM (few output channels, many pixels): split by columns,
            # so each thread streams only its share of the unfolded matrix, not all of it.
            spread(columns, lambda lo, hi: np.matmul(a, b[..., lo:hi], out=out[..., lo:hi]),
                   macs // columns)
        else:
            spread(rows, lambda lo, hi: np.matmul(a[..., lo:hi, :], b, out=out[..., lo:hi, :]),
                   macs // rows, block)
    return out


def edges(count: int, unit_macs: int, align: int = 1) -> list[int]:
    """Boundaries cutting ``range(count)`` (each unit ``unit_macs`` MACs) into at most
    :data:`PARTS` ranges, inner boundaries at multiples of ``align``, every range above
    :data:`SMALL_GEMM` MACs (fewer ranges where that needs it; one: no split). ``unit_macs``
    0: the units are not GEMMs, and the ranges have no least size."""
    blocks = -(-count // align)
    for parts in range(max(1, min(PARTS, blocks)), 1, -1):
        cut = sorted({min(count, blocks * k // parts * align) for k in range(1, parts)}
                     - {0, count})
        bounds = [0, *cut, count]
        if not unit_macs or min(np.diff(bounds)) * unit_macs > SMALL_GEMM:
            return bounds
    return [0, count]


def spread(count: int, work: Callable[[int, int], object], unit_macs: int = 0,
           align: int = 1) -> None:
    """``work(lo, hi)`` over consecutive ranges covering ``range(count)``, taken by the calling
    thread and the helper threads as they come (:func:`.cores.split`); ``work`` releases the GIL
    (a BLAS call). The ranges are :func:`edges` of units of ``unit_macs`` MACs (0: not
    GEMMs, :data:`PARTS` even ranges), inner boundaries at multiples of ``align``."""
    bounds = edges(count, unit_macs, align)
    cores.split(len(bounds) - 1, lambda k: work(bounds[k], bounds[k + 1]))
