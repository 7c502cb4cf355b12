"""The logistic function (Sigmoid, and the gate of SiLU) as onnxruntime computes it, to the bit.

onnxruntime's CPU Sigmoid of float32 is MLAS's ``MlasComputeLogistic``: the input clamped to
[-18, 18], an odd rational function p(x) / q(x) (degrees 9 and 10, Eigen's coefficients) plus
1/2, clamped to [0, 1]. On x86-64 it runs MLAS's FMA3 kernel, each multiply-add one fused
operation. :func:`logistic32` does the same operations in the same order, each multiply-add as
LLVM's ``fma`` intrinsic (one rounding; vectorised as the loops are), so it gives onnxruntime's
bits (``tests/kernels/test_logistic.py`` compares with the installed onnxruntime).

The clamps make the result exactly 0 from about -17.6 down and exactly 1 from about 17 up,
where ``1 / (1 + exp(-x))`` gives a tiny positive number (1.3e-33 at -75.7) or 1 - 2^-24: a
Sign, a comparison or a Log downstream sees that difference however small it is.

float64 is computed as onnxruntime's Eigen expression: ``1 / (1 + exp(-|x|))`` for x >= 0, and
1 minus that for x < 0 (which is exactly 0 from about -37.4 down).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_LOWER, _UPPER = np.float32(-18.0), np.float32(18.0)
# MlasLogisticConstants.
_A9, _A7, _A5, _A3, _A1 = (np.float32(c) for c in (
    4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
    2.48287947061529e-01))
_B10, _B8, _B6, _B4, _B2, _B0 = (np.float32(c) for c in (
    6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
    1.16817656904453e-01, 9.93151921023180e-01))
_HALF, _ZERO, _ONE = np.float32(0.5), np.float32(0.0), np.float32(1.0)


@intrinsic
def _fma(typingctx, a, b, c):
    """float32 ``a * b + c`` rounded once (LLVM's ``llvm.fma.f32``)."""
    if (a, b, c) != (types.float32,) * 3:
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32] * 3))
        return builder.call(fma, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


@njit(inline="always")
def logistic32(v):  # pragma: no cover - numba
    """MLAS's logistic of one float32 value (see the module docstring); NaN gives NaN."""
    v = _LOWER if v < _LOWER else v  # comparisons with NaN are false: NaN goes through
    v = _UPPER if v > _UPPER else v
    v2 = v * v
    p = _fma(_fma(_fma(_fma(v2, _A9, _A7), v2, _A5), v2, _A3), v2, _A1) * v
    q = _fma(_fma(_fma(_fma(_fma(v2, _B10, _B8), v2, _B6), v2, _B4), v2, _B2), v2, _B0)
    r = p / q + _HALF
    r = _ZERO if r < _ZERO else r
    return _ONE if r > _ONE else r


@njit(cache=True, nogil=True, error_model="numpy")
def sigmoid32(x, out):  # pragma: no cover - numba
    """``out = sigmoid(x)`` for flat float32 arrays (``out`` may be ``x``)."""
    for i in range(x.size):
        out[i] = logistic32(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def silu32(y):  # pragma: no cover - numba
    """``y *= sigmoid(y)`` in place for a flat float32 array: the Sigmoid kernel's float32
    value, then the multiply, as the two nodes (or onnxruntime's QuickGelu) compute it."""
    for i in range(y.size):
        v = y[i]
        y[i] = v * logistic32(v)


@njit(cache=True, nogil=True, error_model="numpy")
def bias_silu32(y, b):  # pragma: no cover - numba
    """``y`` (N, M, P) float32 plus ``b[m]`` (float32, as numpy's add), then times its
    sigmoid, in place: :func:`silu32` with the bias add folded in."""
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row = y[n, m]
            bias = b[m]
            for p in range(row.size):
                v = row[p] + bias
                row[p] = v * logistic32(v)


@njit(cache=True, nogil=True, error_model="numpy")
def _sigmoid64_finish(x, e):  # pragma: no cover - numba
    # e = exp(-|x|) <= 1 on entry; onnxruntime's select of 1 / (1 + e) and 1 - 1 / (1 + e).
    for i in range(x.size):
        inv = 1 / (1 + e[i])
        e[i] = inv if x[i] >= 0 else 1 - inv


def sigmoid(x: np.ndarray, out: np.ndarray) -> None:
    """``out = sigmoid(x)`` for C-contiguous float32 or float64 arrays of one shape and dtype
    (``out`` may be ``x``): float32 by :func:`logistic32`, float64 by onnxruntime's formula."""
    flat, dest = x.reshape(-1), out.reshape(-1)
    if x.dtype == np.float32:
        sigmoid32(flat, dest)
        return
    e = np.empty_like(flat) if np.may_share_memory(x, out) else dest  # x's signs are read last
    np.negative(np.abs(flat, out=e), out=e)
    np.exp(e, out=e)
    _sigmoid64_finish(flat, e)
    if e is not dest:
        np.copyto(dest, e)
