"""The kernel registry: how a KERNEL command finds the code that computes its values.

A kernel is registered under the ONNX op type it implements (``"Conv"``, ``"QLinearMatMul"``)
with a *values* function, and optionally a *cycles* function. The values function takes the
input arrays (``None`` for an omitted optional input) and the node's attributes, and returns the
output arrays; it never reads the clock. The cycles function takes the device config and the
tensor specs and returns an :class:`npu_sim.cost.Cost`; it never touches tensor data. When a
kernel has no cycles function of its own, :func:`npu_sim.cost.op_cost` prices it by op type.

Registering is explicit, one decorator per kernel::

    @kernel("Relu")
    def relu(inputs, attrs):
        (x,) = inputs
        return [np.maximum(x, 0)]

Tests and users may register their own kernels under new names the same way.

A kernel may also be *prepared* (``prepare=``): given the operand arrays of one launch, it does
its checks and planning once and returns a function of no arguments that computes from the
arrays' current contents. A program's schedule (:mod:`firmware_model.replay`) prepares each
launch once and calls the result on every run, since its operands stay at fixed HBM addresses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KernelError

ValuesFn = Callable[[Sequence["np.ndarray | None"], Mapping[str, Any]], list[np.ndarray]]
CyclesFn = Callable[..., Any]
PrepareFn = Callable[..., Callable[[], list[np.ndarray]]]


@dataclass(frozen=True)
class Kernel:
    """One registered kernel: its name, its values function and its optional cycles function."""

    name: str
    values: ValuesFn
    cycles: CyclesFn | None = None
    writes_into: bool = False
    """Whether ``values`` also takes ``out=``: one entry per output the launch has (so its
    length tells a kernel with optional outputs, MaxPool, which to compute), each a writable
    C-contiguous array of the output's shape and dtype (or None) that it may compute into and
    return, saving the copy; the caller passes only arrays that share no memory with any
    input."""
    prepare: PrepareFn | None = None
    """``prepare(inputs, attrs, out)`` (``out`` as for :attr:`writes_into`): a function of no
    arguments computing exactly what ``values(inputs, attrs, out=out)`` would from the arrays'
    contents at the time of the call (the same bits, and the same errors where values are at
    fault), with everything that depends only on shapes, dtypes and ``attrs`` done once. It may
    raise what ``values`` raises for bad shapes or attributes. Without it, each run calls
    ``values``."""


_KERNELS: dict[str, Kernel] = {}


def register_kernel(
    name: str, values: ValuesFn, *, cycles: CyclesFn | None = None, replace: bool = False,
    writes_into: bool = False, prepare: PrepareFn | None = None,
) -> Kernel:
    """Register ``values`` (and optionally ``cycles``) under ``name``.

    Registering a name twice is an error unless ``replace`` is true, so two modules cannot
    silently shadow each other.
    """
    if not isinstance(name, str) or not name:
        raise KernelError(str(name), "", "kernel name must be a non-empty string")
    if name in _KERNELS and not replace:
        raise KernelError(name, "", "a kernel is already registered under this name")
    entry = Kernel(name, values, cycles, writes_into, prepare)
    _KERNELS[name] = entry
    return entry


def kernel(name: str, *, cycles: CyclesFn | None = None, writes_into: bool = False,
           prepare: PrepareFn | None = None) -> Callable[[ValuesFn], ValuesFn]:
    """Decorator form of :func:`register_kernel`."""

    def wrap(fn: ValuesFn) -> ValuesFn:
        register_kernel(name, fn, cycles=cycles, writes_into=writes_into, prepare=prepare)
        return fn

    return wrap


def unregister_kernel(name: str) -> None:
    """Remove a kernel (for tests that register temporary ones)."""
    _KERNELS.pop(name, None)


def lookup(name: str, node: str = "") -> Kernel:
    """The kernel registered under ``name``; an unknown name lists the registered ones."""
    try:
        return _KERNELS[name]
    except KeyError:
        raise KernelError(
            name, node, f"no kernel registered under this name; registered: {', '.join(names())}"
        ) from None


def names() -> list[str]:
    """Names of all registered kernels, sorted."""
    return sorted(_KERNELS)
