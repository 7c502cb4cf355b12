"""Kernels a test registers for itself, and placing test arrays in HBM.

Device and firmware tests launch kernels of their own (a scale, a copy, one that raises) to
check dispatch without depending on the real ops. :func:`registered_kernels` registers them for
the duration of a ``with`` block and always unregisters them, so no test leaks a kernel into
another.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from npu_sim import Device, DeviceBuffer
from npu_sim.kernels.registry import CyclesFn, ValuesFn, register_kernel, unregister_kernel


@dataclass(frozen=True)
class FixedCost:
    """A cost carrying only what a launch reads: ``total_cycles`` and, optionally, ``macs``."""

    total_cycles: int
    macs: int = 0


def fixed_cycles(cycles: int) -> CyclesFn:
    """A cycles function pricing every launch at ``cycles``."""
    return lambda *args, **kwargs: FixedCost(cycles)


@contextmanager
def registered_kernels(kernels: Mapping[str, tuple[ValuesFn, CyclesFn]],
                       **options: Any) -> Iterator[None]:
    """Register ``{name: (values, cycles)}`` inside the block, with ``options`` of
    :func:`register_kernel` (``writes_into``, ``prepare``); unregister them on the way out."""
    for name, (values, cycles) in kernels.items():
        register_kernel(name, values, cycles=cycles, replace=True, **options)
    try:
        yield
    finally:
        for name in kernels:
            unregister_kernel(name)


def put(dev: Device, array: np.ndarray) -> DeviceBuffer:
    """A fresh HBM buffer holding ``array``'s bytes (written directly, no DMA, no cycles)."""
    buf = dev.malloc(array.nbytes)
    dev.hbm.write(buf.address, array)
    return buf
