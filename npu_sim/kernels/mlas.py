"""Elementwise functions computed as onnxruntime's MLAS computes them, to the bit.

onnxruntime's CPU kernels of float32 Sigmoid, Tanh, Erf and Gelu call MLAS, which approximates
them with rational functions and polynomials (Eigen's coefficients for the first two):

- the logistic, ``MlasComputeLogistic``: the input clamped to [-18, 18], p / q of degrees 9 and
  10, plus 1/2, clamped at 0 (its x86-64 kernel does not clamp at 1; QuickGelu's AVX-512F
  kernel does: :func:`silu32`);
- tanh, ``MlasComputeTanh``: the input clamped to [-9, 9], p / q of degrees 13 and 6, not
  clamped after;
- erf, ``MlasComputeErf``: a polynomial below |x| = 0.921875, else 1 - exp(-polynomial) with
  MLAS's own exp;
- Gelu: ``x / sqrt 2``, erf, then ``0.5 x (erf + 1)``; with ``approximate="tanh"``,
  ``x (C x x + B)``, tanh, then the same.

On x86-64 MLAS runs FMA3 kernels, each multiply-add one fused operation; where the host has
AVX-512F, exact Gelu and QuickGelu's SiLU run AVX-512F kernels that treat NaNs and the
logistic's top differently, and the loops here take the host's branch as an argument
(:data:`.host.MLAS_AVX512F`; an argument rather than a global the compiled code would freeze,
so a cache built with ``NUMBA_CPU_NAME=generic`` serves either host). :func:`gelu`,
:func:`silu` and :func:`bias_sigmoid` pass this host's. The functions here do the same
operations in the same order, each multiply-add as LLVM's ``fma`` intrinsic (one rounding;
vectorised as the loops are), and give onnxruntime's bits (``tests/kernels/test_mlas.py``
compares with the installed onnxruntime, and would see a release that changed them).

Where they saturate differs from the exact functions: the logistic is exactly 0 from -18 down
(``1 / (1 + exp(-x))`` is 1.3e-33 at -75.7) and exactly 1 from 18 up, below which it is
1 - 2^-24 or less but for 20 inputs in [17.48, 18), where it is 1.0000001; tanh is exactly +-1
from 9 on (numpy's from about 10) and on either side of it from 7.999 (up to 1.0000002); Gelu
is exactly -0 below about -5.54. A Sign, a comparison or a Log downstream sees such a
difference however small it is.

float64 is not here: onnxruntime computes it with Eigen (``.activations``).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from .host import MLAS_AVX512F
from .native import EPILOGUE, compiled

# MlasLogisticConstants.
_LOWER, _UPPER = np.float32(-18.0), np.float32(18.0)
_A9, _A7, _A5, _A3, _A1 = (np.float32(c) for c in (
    4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
    2.48287947061529e-01))
_B10, _B8, _B6, _B4, _B2, _B0 = (np.float32(c) for c in (
    6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
    1.16817656904453e-01, 9.93151921023180e-01))
# MlasTanhConstants.
_T_LOWER, _T_UPPER = np.float32(-9.0), np.float32(9.0)
_TA13, _TA11, _TA9, _TA7, _TA5, _TA3, _TA1 = (np.float32(c) for c in (
    -2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
    1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03))
_TB6, _TB4, _TB2, _TB0 = (np.float32(c) for c in (
    1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03))
# MlasErfConstants.
_E_SPLIT = np.float32(0.921875)
_ES0, _ES1, _ES2, _ES3, _ES4, _ES5M1 = (np.float32(c) for c in (
    -5.99104969e-4, 4.99339588e-3, -2.67667342e-2, 1.12818025e-1, -3.76124859e-1,
    1.28379151e-1))
_EB0, _EB1, _EB2, _EB3, _EB4, _EB5, _EB6M1 = (np.float32(c) for c in (
    1.72948930e-5, -3.83208680e-4, 3.88393435e-3, -2.42545605e-2, 1.06777847e-1,
    6.34846687e-1, 1.28717512e-1))
_EXP_LOWER, _LOG2E, _LN2_HI, _LN2_LO, _EXP_C = (np.float32(c) for c in (
    -88.3762626647949, 1.44269504088896341, -6.93145752e-1, -1.42860677e-6, 1.25829120e+7))
_EP0, _EP1, _EP2, _EP3, _EP4, _EP5, _EP6 = (np.float32(c) for c in (
    1.38319808e-3, 8.37550033e-3, 4.16689515e-2, 1.66664466e-1, 4.99999851e-1, 1.0, 1.0))
_SQRT1_2 = np.float32(0.7071067811865476)
# onnxruntime's Gelu (approximate="tanh"): sqrt(2 / pi) and 0.044715 sqrt(2 / pi), as float.
_GELU_B, _GELU_C = np.float32(0.7978845608028654), np.float32(0.035677408136300125)
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


@intrinsic
def _power_of_two(typingctx, k):
    """float32 ``2 ** k`` for an int32 ``k`` in [-126, 127], as MLAS builds it: ``k + 127`` in
    the exponent bits."""
    if k != types.int32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.shl(builder.add(args[0], ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(types.int32), codegen


@njit(inline="always")
def logistic32(v):  # pragma: no cover - numba
    """MLAS's logistic of one float32 value (see the module docstring); NaN gives NaN."""
    v = _LOWER if v < _LOWER else v  # comparisons with NaN are false: NaN goes through
    v = _UPPER if v > _UPPER else v
    v2 = v * v
    p = _fma(_fma(_fma(_fma(v2, _A9, _A7), v2, _A5), v2, _A3), v2, _A1) * v
    q = _fma(_fma(_fma(_fma(_fma(v2, _B10, _B8), v2, _B6), v2, _B4), v2, _B2), v2, _B0)
    r = p / q + _HALF
    return _ZERO if r < _ZERO else r  # not clamped at 1: MLAS's x86-64 kernel gives 1.0000001


@njit(inline="always")
def _silu(v, avx512):  # pragma: no cover - numba
    """``v`` times its logistic as onnxruntime's QuickGelu (what it fuses ``x * Sigmoid(x)``
    into at its default optimization level) computes it: MLAS's AVX-512F SiLU kernel keeps a
    NaN as it is and clamps the logistic at 1; the generic one (MLAS's logistic, then a
    multiply) does neither (:data:`.host.MLAS_AVX512F`)."""
    g = logistic32(v)
    r = v * (_ONE if avx512 and g > _ONE else g)
    return v if avx512 and v != v else r  # selects, not branches: the loops vectorise


@njit(inline="always")
def tanh32(v):  # pragma: no cover - numba
    """MLAS's tanh of one float32 value (see the module docstring); NaN gives NaN."""
    v = _T_LOWER if v < _T_LOWER else v
    v = _T_UPPER if v > _T_UPPER else v
    v2 = v * v
    p = _fma(_fma(_fma(_fma(_fma(_fma(v2, _TA13, _TA11), v2, _TA9), v2, _TA7), v2, _TA5), v2,
                  _TA3), v2, _TA1) * v
    q = _fma(_fma(_fma(v2, _TB6, _TB4), v2, _TB2), v2, _TB0)
    return p / q


@njit(inline="always")
def erf32(x):  # pragma: no cover - numba
    """MLAS's erf of one float32 value: a polynomial of |x| below 0.921875, else 1 - exp of
    minus a polynomial, with MLAS's own exp (2^k by an integer k, times a polynomial of the
    rest); then x's sign. MLAS's table has an upper range of 3.725 that the installed
    onnxruntime does not apply (its results above 3.725 vary with x), and neither does this."""
    a = abs(x)
    # Both branches are computed and one kept, as MLAS's vector kernel does: the loop vectorises.
    s = a * a
    small = _fma(_fma(_fma(_fma(_fma(_ES0, s, _ES1), s, _ES2), s, _ES3), s, _ES4), s, _ES5M1)
    small = _fma(small, a, a)
    r = _fma(_fma(_fma(_fma(_fma(_fma(_EB0, a, _EB1), a, _EB2), a, _EB3), a, _EB4), a, _EB5), a,
             _EB6M1)
    e = -_fma(r, a, a)
    e = _EXP_LOWER if e < _EXP_LOWER else e  # NaN goes through
    k = _fma(_LOG2E, e, _EXP_C) - _EXP_C  # e / ln 2 rounded to an integer, exactly
    f = _fma(k, _LN2_LO, _fma(_LN2_HI, k, e))
    y = _fma(_fma(_fma(_fma(_fma(_fma(_EP0, f, _EP1), f, _EP2), f, _EP3), f, _EP4), f, _EP5), f,
             _EP6)
    # k >= -128; below -126 2^k * y is under 1e-38, and 1 minus it is 1 either way (NaN: any k)
    k = k if k > -126.0 else np.float32(-126.0)
    big = _ONE - y * _power_of_two(np.int32(k))
    return math.copysign(small if a < _E_SPLIT else big, x)


@njit(cache=True, nogil=True, error_model="numpy")
def erf_loop32(x, out):  # pragma: no cover - numba
    """``out = erf(x)`` for flat float32 arrays (``out`` may be ``x``)."""
    for i in range(x.size):
        out[i] = erf32(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def gelu32(x, out, avx512):  # pragma: no cover - numba
    """onnxruntime's Gelu (exact, with MLAS's erf) for flat float32 arrays: ``x * sqrt(1/2)``,
    MLAS's erf of it, then ``0.5 x (erf + 1)``, each in float32 and in that order. MLAS's
    AVX-512F kernel (``avx512``, :data:`.host.MLAS_AVX512F`) keeps a NaN as it is; the generic
    one quiets a signalling NaN in the arithmetic."""
    for i in range(x.size):
        v = x[i]
        out[i] = v if avx512 and v != v else _HALF * v * (erf32(v * _SQRT1_2) + _ONE)


@njit(cache=True, nogil=True, error_model="numpy")
def tanh_loop32(x, out):  # pragma: no cover - numba
    """``out = tanh(x)`` for flat float32 arrays (``out`` may be ``x``)."""
    for i in range(x.size):
        out[i] = tanh32(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_tanh32(x, out):  # pragma: no cover - numba
    """onnxruntime's Gelu with ``approximate="tanh"`` for flat float32 arrays: its three
    loops, fused: ``t = x (C x x + B)`` (a multiply and an add, as its plain C++ loop), MLAS's
    tanh of ``t``, then ``0.5 x (t + 1)``, each in float32 and in that order."""
    for i in range(x.size):
        v = x[i]
        out[i] = _HALF * v * (tanh32(v * (_GELU_C * v * v + _GELU_B)) + _ONE)


@njit(cache=True, nogil=True, error_model="numpy")
def sigmoid32(x, out):  # pragma: no cover - numba
    """``out = sigmoid(x)`` for flat float32 arrays (``out`` may be ``x``)."""
    for i in range(x.size):
        out[i] = logistic32(x[i])


@njit(cache=True, nogil=True, error_model="numpy")
def silu32(y, avx512):  # pragma: no cover - numba
    """``y *= sigmoid(y)`` in place for a flat float32 array, as onnxruntime's QuickGelu on
    MLAS's AVX-512F kernel (``avx512``) or its generic one (:func:`_silu`): what its default
    optimization level makes of ``x * Sigmoid(x)``. (Below that level, its unfused Sigmoid
    reaches 1.0000001 on 20 inputs in [17.48, 18) on every host, as the generic kernel.)"""
    for i in range(y.size):
        y[i] = _silu(y[i], avx512)


@njit(cache=True, nogil=True, error_model="numpy")
def bias_sigmoid32(y, b, gate, avx512):  # pragma: no cover - numba
    """``y`` (N, M, P) float32 plus ``b[m]`` (float32, as numpy's add), then its Sigmoid, or
    with ``gate`` times its sigmoid as :func:`silu32` with ``avx512``, in place. (Here, beside
    the logistic: numba's cache knows a function's own file only, and would keep a loop that
    inlined it from another file after it changed.)"""
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row = y[n, m]
            bias = b[m]
            for p in range(row.size):
                v = row[p] + bias
                row[p] = _silu(v, avx512) if gate else logistic32(v)


def _bias_sigmoid_rows(y, b, r, params, rows, columns):  # pragma: no cover - numba
    p = carray(params, (2,), np.float64)
    bias_sigmoid32(carray(y, (1, rows, columns), np.float32), carray(b, (rows,), np.float32),
                   p[0] != 0, p[1] != 0)


def native_bias_sigmoid(gate: bool) -> tuple[int, np.ndarray]:
    """:func:`bias_sigmoid` as a :data:`.native.EPILOGUE` loop: its address (compiled, or
    loaded from numba's cache, on first use) and the parameters it reads (the gate, and this
    host's MLAS branch)."""
    return compiled(EPILOGUE, _bias_sigmoid_rows), np.array([gate, MLAS_AVX512F], np.float64)


def gelu(x: np.ndarray, out: np.ndarray) -> None:
    """:func:`gelu32` with this host's MLAS branch."""
    gelu32(x, out, MLAS_AVX512F)


def silu(y: np.ndarray) -> None:
    """:func:`silu32` with this host's MLAS branch."""
    silu32(y, MLAS_AVX512F)


def bias_sigmoid(y: np.ndarray, b: np.ndarray, gate: bool) -> None:
    """:func:`bias_sigmoid32` with this host's MLAS branch."""
    bias_sigmoid32(y, b, gate, MLAS_AVX512F)
