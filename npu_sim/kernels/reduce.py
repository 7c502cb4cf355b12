"""Kernels: reductions over axes — ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceL2.

``axes`` is an input since opset 13 (ReduceSum) or 18 (the others) and an attribute before; the
kernels take either. Without axes the whole tensor is reduced, unless ``noop_with_empty_axes``
is set, in which case nothing is reduced (ReduceL2 still yields ``|x|``). ``keepdims``
(default 1) keeps reduced axes as size 1. numpy's reductions already run over any set of axes
in one strided pass, so they are used directly.

Reducing an empty set gives the reduction's identity, as onnxruntime does: 0 for Sum, Mean and
L2, -inf (or the integer minimum) for Max, +inf (or the integer maximum) for Min. Integer Sum
wraps around in the input dtype; integer Mean and L2 truncate toward zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import KernelError
from .activations import (
    FLOAT_DTYPES,
    INT_DTYPES,
    from_compute,
    input_count,
    require_dtype,
    required,
    to_compute,
)
from .elementwise import NUMERIC_DTYPES
from .registry import kernel
from .shape import normalize_axes, normalize_axis, operand

Inputs = Sequence["np.ndarray | None"]
Axes = tuple[int, ...]


def _extreme(x: np.ndarray, axes: Axes, keepdims: bool, fn: Callable[..., np.ndarray],
             low: bool) -> np.ndarray:
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        start = info.min if low else info.max
    else:
        start = -np.inf if low else np.inf
    return fn(x, axis=axes, keepdims=keepdims, initial=start)


def _count(x: np.ndarray, axes: Axes) -> int:
    return int(np.prod([x.shape[a] for a in axes], dtype=np.int64))


def _trunc_div(total: np.ndarray, count: int) -> np.ndarray:
    if count == 0:
        return np.zeros_like(total)
    q = np.abs(total.astype(np.int64)) // count  # truncation toward zero, as C
    return (np.sign(total) * q).astype(total.dtype)


def _sum(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _mean(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    total = _sum(x, axes, keepdims)
    count = _count(x, axes)
    if x.dtype.kind in "iu":
        return _trunc_div(total, count)
    return total / total.dtype.type(count) if count else total


def _l2(x: np.ndarray, axes: Axes, keepdims: bool) -> np.ndarray:
    if x.dtype.kind in "iu":
        squares = np.sum(x.astype(np.int64) ** 2, axis=axes, keepdims=keepdims)
        return np.trunc(np.sqrt(squares)).astype(x.dtype)
    return np.sqrt(np.sum(x * x, axis=axes, keepdims=keepdims, dtype=x.dtype))


_REDUCTIONS: dict[str, Callable[[np.ndarray, Axes, bool], np.ndarray]] = {
    "ReduceSum": _sum,
    "ReduceMean": _mean,
    "ReduceMax": lambda x, a, k: _extreme(x, a, k, np.max, low=True),
    "ReduceMin": lambda x, a, k: _extreme(x, a, k, np.min, low=False),
    "ReduceL2": _l2,
}


def _register_reduction(op: str) -> None:
    fn = _REDUCTIONS[op]

    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        input_count(op, inputs, 1, 2)
        x = required(op, inputs, 0, "data")
        require_dtype(op, x, FLOAT_DTYPES + INT_DTYPES, "data")
        axes = operand(op, inputs, 1, attrs, "axes")
        keepdims = bool(int(attrs.get("keepdims", 1)))
        if not axes:
            # noop reduces over no axes: the identity, except that ReduceL2 still takes
            # sqrt(x * x) = |x| per element, as onnxruntime computes it.
            noop = int(attrs.get("noop_with_empty_axes", 0))
            axes = [] if noop else list(range(x.ndim))
        axes = tuple(normalize_axes(op, axes, x.ndim))
        with np.errstate(all="ignore"):  # integer wrap-around is the defined result
            result = fn(to_compute(x), axes, keepdims)
        return [from_compute(np.asarray(result), x.dtype)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op} over ``axes`` (input or attribute), with ``keepdims``."
    kernel(op)(values)


for _op in _REDUCTIONS:
    _register_reduction(_op)



def _register_arg(op: str, fn: Callable[..., np.ndarray]) -> None:
    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        input_count(op, inputs, 1, 1)
        x = required(op, inputs, 0, "data")
        require_dtype(op, x, NUMERIC_DTYPES, "data")
        if x.ndim == 0:
            raise KernelError(op, "", "data must have rank >= 1, got a 0-d tensor")
        axis = normalize_axis(op, int(attrs.get("axis", 0)), x.ndim)
        if x.shape[axis] == 0:
            raise KernelError(op, "", f"axis {axis} of shape {x.shape} is empty: no index to "
                                      "return")
        keepdims = bool(int(attrs.get("keepdims", 1)))
        xc = to_compute(x)
        nan_first = None
        if xc.dtype.kind == "f" and np.isnan(xc).any():
            # onnxruntime scans from the first element and takes a later one only if it
            # compares better: a NaN never wins, unless it is first (nothing beats it).
            nan_first = np.isnan(np.take(xc, 0, axis=axis))
            xc = np.where(np.isnan(xc), -np.inf if op == "ArgMax" else np.inf, xc)
        if int(attrs.get("select_last_index", 0)):  # the last of equal extremes
            flipped = np.flip(xc, axis=axis)
            index = x.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            index = fn(xc, axis=axis)
        index = np.asarray(index, np.int64)
        if nan_first is not None:
            index = np.where(nan_first, 0, index).astype(np.int64)
        return [np.expand_dims(index, axis) if keepdims else index]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op}: int64 indices along ``axis`` (``keepdims``, " \
                     "``select_last_index``)."
    kernel(op)(values)


_register_arg("ArgMax", np.argmax)
_register_arg("ArgMin", np.argmin)
