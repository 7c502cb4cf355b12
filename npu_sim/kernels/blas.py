"""BLAS thread control: a GEMM too small to share runs on one BLAS thread.

numpy's OpenBLAS splits every GEMM above a tiny size over all its threads, and its threads spin
while they wait for each other. On a small GEMM (a mobile net's 1x1 convolution: 5-20 million
MACs) the split gains little, and on a busy machine a descheduled partner thread stalls the
whole GEMM for a scheduler tick: measured up to 100x slower than one thread. So kernels run
GEMMs of fewer than :data:`SMALL_MACS` multiply-accumulates on one thread, restoring the
library's own setting afterwards (the user's environment, e.g. ``OPENBLAS_NUM_THREADS``, is
never changed). threadpoolctl finds the BLAS numpy loaded, whatever its symbol prefix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

SMALL_MACS = 1 << 25
"""GEMMs below this many MACs run on one BLAS thread (measured on EfficientNet-B0's layout:
the whole net 2.1x onnxruntime with this bound, 5.3x with 2**23, 23x with none)."""


@cache
def _libraries() -> tuple:
    from threadpoolctl import ThreadpoolController

    return tuple(ThreadpoolController().select(user_api="blas").lib_controllers)


@contextmanager
def threads_for(macs: int) -> Iterator[None]:
    """Run the enclosed BLAS calls on one thread if ``macs`` is below :data:`SMALL_MACS`."""
    if macs >= SMALL_MACS:
        yield
        return
    libs = _libraries()
    saved = [lib.get_num_threads() for lib in libs]
    for lib in libs:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, n in zip(libs, saved, strict=True):
            lib.set_num_threads(n)
