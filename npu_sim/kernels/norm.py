"""Kernels: normalizations along an axis — Softmax, LogSoftmax, LayerNormalization, BatchNorm.

Each is a statistic over some elements (a max and a sum, a mean and a variance) followed by an
elementwise rescale. LayerNormalization and BatchNormalization are numba loops that make one pass
for the statistics and one to write the output, accumulating in float64. Softmax stays in numpy:
its cost is exp, which numpy runs in SIMD and numba cannot vectorise.

Softmax views the tensor as ``(outer, n, inner)`` with the normalized axis in the middle, so the
last axis (``inner == 1``) and a middle axis (NCHW channel softmax) need no transpose.

Half-precision inputs are computed in float32 and rounded once; statistics outputs
(LayerNormalization's Mean and InvStdDev) use the ``stash_type`` dtype (float32 by default).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from ..errors import KernelError
from .activations import (
    FLOAT_DTYPES,
    HALF_DTYPES,
    from_compute,
    input_count,
    require_dtype,
    required,
    to_compute,
)
from .registry import kernel
from .shape import normalize_axis

Inputs = Sequence["np.ndarray | None"]


def _contiguous(x: np.ndarray) -> np.ndarray:
    """``x`` in C order in its compute dtype (a copy only when it is not already)."""
    x = to_compute(x)
    return x if x.flags.c_contiguous else x.copy()


# --- Softmax / LogSoftmax -----------------------------------------------------------------------


def _softmax(x: np.ndarray, log: bool) -> np.ndarray:
    """Softmax (or log-softmax) of ``x`` viewed as ``(outer, n, inner)`` over axis 1."""
    peak = x.max(axis=1, keepdims=True) if x.shape[1] else np.zeros_like(x[:, :1])
    shifted = np.subtract(x, peak)  # exp of a non-positive number never overflows
    exps = np.exp(shifted)
    total = exps.sum(axis=1, keepdims=True)
    if log:
        shifted -= np.log(total)
        return shifted
    exps /= total
    return exps


def _softmax_kernel(op: str, log: bool) -> None:
    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        input_count(op, inputs, 1, 1)
        x = required(op, inputs, 0, "input")
        require_dtype(op, x, FLOAT_DTYPES)
        rank = max(x.ndim, 1)
        old = int(attrs.get("_opset", 13)) < 13
        axis = normalize_axis(op, attrs.get("axis", 1 if old else -1), rank)
        shape = x.shape or (1,)
        if old:  # opset < 13: the input is coerced to 2-D at axis, softmax over the second dim
            view = (math.prod(shape[:axis]), math.prod(shape[axis:]), 1)
        else:
            view = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:]))
        with np.errstate(all="ignore"):  # a row of -inf gives NaN, as in onnxruntime
            out = _softmax(to_compute(x).reshape(view), log)
        return [from_compute(out.reshape(x.shape), x.dtype)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = (f"ONNX {op} along ``axis`` (opset 13 semantics; with ``_opset`` < 13 in "
                      f"attrs, the older coerce-to-2-D semantics with default axis 1).")
    kernel(op)(values)


_softmax_kernel("Softmax", log=False)
_softmax_kernel("LogSoftmax", log=True)


# --- LayerNormalization -------------------------------------------------------------------------


# reassoc lets LLVM vectorise the sums (pairwise-like order); NaN/inf semantics are kept.
@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract"})
def _layer_norm(x, scale, bias, epsilon, y, mean, inv_std):  # pragma: no cover - numba
    rows, n = x.shape
    for r in range(rows):
        total = 0.0
        for j in range(n):
            total += x[r, j]
        mu = total / n
        sq = 0.0
        for j in range(n):  # two passes: no cancellation in E[x^2] - E[x]^2
            d = x[r, j] - mu
            sq += d * d
        inv = 1.0 / math.sqrt(sq / n + epsilon)
        mean[r] = mu
        inv_std[r] = inv
        for j in range(n):
            y[r, j] = (x[r, j] - mu) * inv * scale[j] + bias[j]


_STASH = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def _normalized_param(name: str, p: np.ndarray, norm_shape: tuple[int, ...], dtype: np.dtype
                      ) -> np.ndarray:
    try:
        full = np.broadcast_to(p, norm_shape)
    except ValueError:
        message = f"{name} shape {p.shape} does not broadcast to the normalized shape {norm_shape}"
        raise KernelError("LayerNormalization", "", message) from None
    return np.ascontiguousarray(full.reshape(-1), dtype=dtype)


@kernel("LayerNormalization")
def layer_normalization(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX LayerNormalization over the axes from ``axis`` on: ``[Y, Mean, InvStdDev]``.

    Mean and InvStdDev have the input's leading dims and size-1 normalized dims, in the
    ``stash_type`` dtype (1 = float32, 11 = float64).
    """
    op = "LayerNormalization"
    input_count(op, inputs, 2, 3)
    x = required(op, inputs, 0, "X")
    scale = required(op, inputs, 1, "Scale")
    bias = inputs[2] if len(inputs) > 2 else None
    require_dtype(op, x, FLOAT_DTYPES, "X")
    for name, p in (("Scale", scale), ("B", bias)):
        if p is not None and p.dtype != x.dtype:
            raise KernelError(op, "", f"{name} dtype {p.dtype} differs from X dtype {x.dtype}")
    stash = int(attrs.get("stash_type", 1))
    if stash not in _STASH:
        raise KernelError(op, "", f"stash_type={stash} is not supported; expected 1 (float32) "
                                  f"or 11 (float64)")
    axis = normalize_axis(op, attrs.get("axis", -1), x.ndim)
    epsilon = float(attrs.get("epsilon", 1e-5))
    norm_shape = x.shape[axis:]
    rows, n = math.prod(x.shape[:axis]), math.prod(norm_shape)
    compute = np.result_type(np.float32 if x.dtype in HALF_DTYPES else x.dtype, _STASH[stash])
    xc = np.ascontiguousarray(x.reshape(rows, n), dtype=compute)
    scale_c = _normalized_param("Scale", scale, norm_shape, compute)
    bias_c = (np.zeros(n, compute) if bias is None else
              _normalized_param("B", bias, norm_shape, compute))
    y = np.empty((rows, n), compute)
    mean = np.empty(rows, _STASH[stash])
    inv_std = np.empty(rows, _STASH[stash])
    _layer_norm(xc, scale_c, bias_c, epsilon, y, mean, inv_std)
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    return [from_compute(y.reshape(x.shape), x.dtype), mean.reshape(stat_shape),
            inv_std.reshape(stat_shape)]


# --- BatchNormalization --------------------------------------------------------------------------


@njit(cache=True, error_model="numpy")
def _affine_per_channel(x, a, b, out):  # pragma: no cover - numba
    batch, channels, inner = x.shape
    for nb in range(batch):
        for c in range(channels):
            ac, bc = a[c], b[c]
            for i in range(inner):
                out[nb, c, i] = x[nb, c, i] * ac + bc


@kernel("BatchNormalization")
def batch_normalization(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX BatchNormalization in inference mode: per channel (axis 1) of ``(N, C, ...)``.

    Folded into one multiply-add per element: ``y = x * a[c] + b[c]`` with
    ``a = scale / sqrt(var + epsilon)`` and ``b = B - mean * a`` computed in float64.
    ``training_mode=1`` is an error (the device runs inference only).
    """
    op = "BatchNormalization"
    input_count(op, inputs, 5, 5)
    x = required(op, inputs, 0, "X")
    params = [required(op, inputs, i, name) for i, name in
              enumerate(("scale", "B", "input_mean", "input_var"), start=1)]
    require_dtype(op, x, FLOAT_DTYPES, "X")
    if int(attrs.get("training_mode", 0)):
        raise KernelError(op, "", "training_mode=1 is not supported; the device runs inference "
                                  "only (training_mode must be 0)")
    if int(attrs.get("spatial", 1)) != 1:
        raise KernelError(op, "", f"spatial={attrs['spatial']} is not supported; expected 1")
    if x.ndim < 2:
        raise KernelError(op, "", f"X must have shape (N, C, ...), got shape {x.shape}")
    channels = x.shape[1]
    for (name, p) in zip(("scale", "B", "input_mean", "input_var"), params, strict=True):
        require_dtype(op, p, FLOAT_DTYPES, name)
        if p.shape != (channels,):
            raise KernelError(op, "", f"{name} shape {p.shape} must be ({channels},), the "
                                      f"channel count of X shape {x.shape}")
    scale, bias, mean, var = (p.astype(np.float64) for p in params)
    epsilon = float(attrs.get("epsilon", 1e-5))
    a = scale / np.sqrt(var + epsilon)
    b = bias - mean * a
    xc = _contiguous(x)
    view = (x.shape[0], channels, math.prod(x.shape[2:]))
    out = np.empty(view, xc.dtype)
    _affine_per_channel(xc.reshape(view), a.astype(xc.dtype), b.astype(xc.dtype), out)
    return [from_compute(out.reshape(x.shape), x.dtype)]
