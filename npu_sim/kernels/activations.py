"""Kernels: activation functions, standalone and fused into a producer (Conv, Gemm, MatMul).

An activation is one elementwise function of one tensor with a few float parameters. The same
code computes it whether it runs as its own node (``Relu``) or is fused into the op that
produced its input: :func:`apply_activation` is the single entry point, and the standalone
kernels registered here are thin wrappers that turn ONNX attributes into its ``params``
(:func:`activation_params`).

Parameters, in order, with ONNX defaults when omitted:

=============  ==========================  ===========================================
name           params                      function
=============  ==========================  ===========================================
Relu           ()                          max(x, 0)
LeakyRelu      (alpha=0.01,)               x if x >= 0 else alpha * x
Clip           (min=-inf, max=+inf)        min(max(x, min), max)
Sigmoid        ()                          1 / (1 + exp(-x)), as onnxruntime (.mlas)
HardSigmoid    (alpha=0.2, beta=0.5)       max(0, min(1, alpha * x + beta))
HardSwish      ()                          x * max(0, min(1, x * (1/6) + 0.5))
Tanh           ()                          tanh(x), as onnxruntime (.mlas)
Gelu           (approximate=0.0,)          0.0: exact, x/2 (1 + erf(x / sqrt 2));
                                           1.0: ONNX approximate="tanh"; both as onnxruntime
=============  ==========================  ===========================================

Half-precision inputs (float16, bfloat16) are computed in float32 and rounded once to the input
dtype. Relu and Clip also take integer tensors, as ONNX allows. ``Erf`` is registered here too
(it shares Gelu's code) but is not an activation a producer fuses. float32 Sigmoid, Tanh, Erf
and Gelu are onnxruntime's own approximations, to the bit (:mod:`.mlas`); float64, which
onnxruntime's CPU provider computes for Sigmoid and Tanh only, uses exp and a vectorisable erf
(absolute error below 2.5e-7, relative error below 1e-6 for |x| < 0.5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
from numba import carray, njit

from ..errors import KernelError
from .mlas import erf_loop32, gelu, gelu_tanh32, sigmoid32, tanh_loop32
from .native import EPILOGUE, compiled
from .registry import kernel

HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), *HALF_DTYPES)
INT_DTYPES = tuple(
    np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                          np.int64, np.uint64)
)


def require_dtype(op: str, x: np.ndarray, allowed: Sequence[np.dtype], what: str = "input") -> None:
    """Raise :class:`KernelError` unless ``x`` is a numpy array of one of the ``allowed`` dtypes."""
    if not isinstance(x, np.ndarray):
        raise KernelError(op, "", f"{what} must be a numpy array, got {type(x).__name__}")
    if x.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise KernelError(op, "", f"{what} dtype {x.dtype} is not supported; "
                                  f"expected one of {names}")


def to_compute(x: np.ndarray) -> np.ndarray:
    """``x`` in the dtype its arithmetic runs in: float32 for half types, itself otherwise."""
    return x.astype(np.float32) if x.dtype in HALF_DTYPES else x


def from_compute(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round a computed result once to the tensor's ``dtype`` (no copy if it already is)."""
    return y if y.dtype == dtype else y.astype(dtype)


def input_count(op: str, inputs: Sequence[np.ndarray | None], low: int, high: int) -> None:
    """Raise :class:`KernelError` unless ``low <= len(inputs) <= high``."""
    if not low <= len(inputs) <= high:
        want = str(low) if low == high else f"{low} to {high}"
        raise KernelError(op, "", f"takes {want} inputs, got {len(inputs)}")


def required(op: str, inputs: Sequence[np.ndarray | None], index: int, name: str) -> np.ndarray:
    """Input ``index`` (named ``name`` in the error), which must be present."""
    if index >= len(inputs) or inputs[index] is None:
        raise KernelError(op, "", f"required input {index} ({name}) is missing")
    x = inputs[index]
    if not isinstance(x, np.ndarray):
        raise KernelError(op, "", f"input {index} ({name}) must be a numpy array, "
                                  f"got {type(x).__name__}")
    return x


# --- fused loops ---------------------------------------------------------------------------
# Each works on flat contiguous arrays and writes ``out`` (which may alias ``x``): one pass over
# memory instead of numpy's chain of temporaries. numba cannot vectorise calls to exp, and numpy's
# exp is SIMD, so the exp-based functions take exp(...) from numpy in ``e`` and finish in a loop
# of plain arithmetic that LLVM vectorises. The finishing loops overwrite ``e`` in place: with a
# third array that aliases ``e`` LLVM's overlap check fails and the loop runs scalar (8x slower).
# error_model="numpy" drops numba's division-by-zero checks, which also block vectorisation.


@njit(cache=True, error_model="numpy")
def _relu(x, out):  # pragma: no cover - numba
    for i in range(x.size):
        v = x[i]
        out[i] = 0 if v < 0 else v  # NaN passes through, as onnxruntime


@njit(cache=True, error_model="numpy")
def _leaky_relu(x, out, alpha):  # pragma: no cover - numba
    for i in range(x.size):
        v = x[i]
        out[i] = v if v >= 0 else v * alpha


@njit(inline="always")
def clamp01(v):  # pragma: no cover - numba
    """``v`` clamped to [0, 1], NaN kept (as onnxruntime's HardSigmoid: a min and max would
    drop it, comparisons with NaN failing), ``+0.0`` for every ``v <= 0``: the values of
    ``v if v != v else min(1.0, max(0.0, v))``, which the loops used before, as three selects
    in ``v``'s float32 that LLVM vectorises (the builtins compared in float64, element by
    element: a hard-swish gate over 240x14x14 took 18.9 against 6.1 us). The same bits on 4.3
    million float32 inputs, a 997-strided sweep of every bit pattern and the specials.

    The loops that inline it live in this file (:func:`hard_sigmoid_gate`,
    :func:`bias_hard_sigmoid`): numba's cache knows a function's own file only, and would keep
    a loop that inlined it from another file after it changed."""
    h = v if v > 0 else np.float32(0)
    h = np.float32(1) if h >= 1 else h
    return v if v != v else h


@njit(cache=True, error_model="numpy")
def _hard_sigmoid(x, out, alpha, beta):  # pragma: no cover - numba
    # alpha and beta as the float attributes they are: a float32 multiply, then add, as
    # onnxruntime (in float64 they rounded once, and 10-15% of results differed by an ulp).
    a, b = np.float32(alpha), np.float32(beta)
    for i in range(x.size):
        out[i] = clamp01(a * x[i] + b)


@njit(cache=True, nogil=True, error_model="numpy")
def hard_sigmoid_gate(y, alpha, beta):  # pragma: no cover - numba
    """``y *= HardSigmoid(y)`` in place for a flat float32 array: a fused hard-swish gate."""
    a, b = np.float32(alpha), np.float32(beta)  # float32 arithmetic, as the HardSigmoid kernel
    for i in range(y.size):
        # NaN propagates as in the HardSigmoid kernel, in float32 as there (clamp01)
        y[i] = y[i] * clamp01(a * y[i] + b)


@njit(cache=True, nogil=True, error_model="numpy")
def bias_hard_sigmoid(y, b, alpha, beta, gate):  # pragma: no cover - numba
    # y += b (float32, as numpy's add), then its HardSigmoid, or with ``gate`` times it
    # (rounded to float32 first, as the gate's two kernels do); float32 arithmetic, as the
    # HardSigmoid kernel, and NaN propagates as there.
    a, c = np.float32(alpha), np.float32(beta)
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row = y[n, m]
            bias = b[m]
            for p in range(row.size):
                v = row[p] + bias
                h = clamp01(a * v + c)
                row[p] = v * h if gate else h


def _bias_hard_sigmoid_rows(y, b, r, params, rows, columns):  # pragma: no cover - numba
    p = carray(params, (3,), np.float64)
    bias_hard_sigmoid(carray(y, (1, rows, columns), np.float32), carray(b, (rows,), np.float32),
                      p[0], p[1], p[2] != 0)


def native_bias_hard_sigmoid(alpha: float, beta: float, gate: bool) -> tuple[int, np.ndarray]:
    """:func:`bias_hard_sigmoid` as a :data:`.native.EPILOGUE` loop: its address (compiled, or
    loaded from numba's cache, on first use) and the parameters it reads."""
    return compiled(EPILOGUE, _bias_hard_sigmoid_rows), np.array([alpha, beta, gate], np.float64)


_SIXTH, _HALF32 = np.float32(1 / 6), np.float32(0.5)


@njit(cache=True, error_model="numpy")
def _hard_swish(x, out):  # pragma: no cover - numba
    for i in range(x.size):
        v = x[i]
        # times 1/6 as a float32, then plus 1/2, as onnxruntime (not divided by 6)
        out[i] = v * min(1.0, max(0.0, v * _SIXTH + _HALF32))


@njit(cache=True, error_model="numpy")
def _erf_finish(x, e, scale, gelu):  # pragma: no cover - numba
    # With a = |scale * x| and e = exp(-a^2): below 0.5 erf(a) is its Taylor series (relative
    # error < 1e-6, so tiny inputs keep their precision); above, Abramowitz & Stegun 7.1.26 gives
    # erfc(a) = t poly(t) e with t = 1 / (1 + p a), |error| < 1.5e-7. Gelu is
    # 0.5 x (1 + erf(x / sqrt 2)); for x < 0 that is 0.5 x erfc(a), taken directly instead of
    # as 1 - (1 - erfc), which would cancel.
    for i in range(x.size):
        v = x[i]
        a = abs(v * scale)
        a2 = a * a
        series = 1.1283791670955126 * a * (
            1 - a2 * (1 / 3 - a2 * (1 / 10 - a2 * (1 / 42 - a2 * (1 / 216 - a2 / 1320)))))
        t = 1 / (1 + 0.3275911 * a)
        poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
                + 0.254829592)
        erfc = 1 - series if a < 0.5 else t * poly * e[i]
        erf = series if a < 0.5 else 1 - erfc
        if gelu:
            e[i] = 0.5 * v * (2 - erfc) if v >= 0 else 0.5 * v * erfc
        else:
            e[i] = erf if v >= 0 else -erf


def _with_exp(fill: Callable[[np.ndarray, np.ndarray], None],
              finish: Callable[..., None], *params: float) -> Callable[..., None]:
    """``fill`` writes the exponent into a buffer, numpy takes exp, ``finish`` completes it."""

    def run(x: np.ndarray, out: np.ndarray) -> None:
        e = np.empty_like(x) if out is x else out
        fill(x, e)
        np.exp(e, out=e)
        finish(x.reshape(-1), e.reshape(-1), *params)
        if e is not out:
            np.copyto(out, e)

    return run


@njit(cache=True, error_model="numpy")
def _sigmoid64_finish(x, e):  # pragma: no cover - numba
    # e = exp(-|x|) <= 1; onnxruntime's (Eigen's) select of 1 / (1 + e) and 1 - 1 / (1 + e),
    # which is exactly 0 from about -36.74 down.
    for i in range(x.size):
        inv = 1 / (1 + e[i])
        e[i] = inv if x[i] >= 0 else 1 - inv


def _minus_abs(x: np.ndarray, e: np.ndarray) -> None:
    np.negative(np.abs(x, out=e), out=e)


def _minus_scaled_square(scale: float) -> Callable[[np.ndarray, np.ndarray], None]:
    def fill(x: np.ndarray, e: np.ndarray) -> None:
        np.multiply(x, x, out=e)
        np.multiply(e, -scale * scale, out=e)

    return fill


@njit(cache=True, error_model="numpy")
def _gelu_tanh_arg(x, e):  # pragma: no cover - numba
    for i in range(x.size):
        v = x[i]
        e[i] = 2 * 0.7978845608028654 * (v + 0.044715 * v * v * v)


@njit(cache=True, error_model="numpy")
def _gelu_tanh_finish(x, e):  # pragma: no cover - numba
    # e = exp(2z); tanh(z) = 1 - 2 / (e + 1), which is +-1 when e is inf or 0.
    for i in range(x.size):
        e[i] = 0.5 * x[i] * (2 - 2 / (e[i] + 1))


def _flat_loop(loop: Callable[..., None], *params: float) -> Callable[..., None]:
    def run(x: np.ndarray, out: np.ndarray) -> None:
        loop(x.reshape(-1), out.reshape(-1), *params)

    return run


def _float32_as_onnxruntime(mlas_loop: Callable[[np.ndarray, np.ndarray], None],
                            other: Callable[[np.ndarray, np.ndarray], None],
                            ) -> Callable[[np.ndarray, np.ndarray], None]:
    """float32 by ``mlas_loop`` (onnxruntime's MLAS kernel, .mlas); float64 by ``other``
    (onnxruntime's Eigen code for Sigmoid and Tanh; it has no float64 Erf or Gelu kernel)."""
    def run(x: np.ndarray, out: np.ndarray) -> None:
        if x.dtype == np.float32:
            mlas_loop(x.reshape(-1), out.reshape(-1))
        else:
            other(x, out)

    return run


_SQRT_HALF = 0.7071067811865476

# name -> (number of params allowed, defaults, builder(params) -> run(x, out)). A builder is
# handed the params padded with the defaults.
_Builder = Callable[[tuple[float, ...]], Callable[[np.ndarray, np.ndarray], None]]
_ACTIVATIONS: dict[str, tuple[tuple[float, ...], _Builder]] = {
    "Relu": ((), lambda p: _flat_loop(_relu)),
    "LeakyRelu": ((0.01,), lambda p: _flat_loop(_leaky_relu, p[0])),
    "Clip": ((-math.inf, math.inf),
             lambda p: lambda x, out: np.clip(x, p[0], p[1], out=out)),
    "Sigmoid": ((), lambda p: _float32_as_onnxruntime(
        sigmoid32, _with_exp(_minus_abs, _sigmoid64_finish))),
    "HardSigmoid": ((0.2, 0.5), lambda p: _flat_loop(_hard_sigmoid, p[0], p[1])),
    "HardSwish": ((), lambda p: _flat_loop(_hard_swish)),
    "Tanh": ((), lambda p: _float32_as_onnxruntime(
        tanh_loop32, lambda x, out: np.tanh(x, out=out))),
    "Gelu": ((0.0,), lambda p: _float32_as_onnxruntime(
        gelu_tanh32, _with_exp(_flat_loop(_gelu_tanh_arg), _gelu_tanh_finish)) if p[0]
        else _float32_as_onnxruntime(gelu, _with_exp(_minus_scaled_square(_SQRT_HALF),
                                                       _erf_finish, _SQRT_HALF, True))),
    "Erf": ((), lambda p: _float32_as_onnxruntime(
        erf_loop32, _with_exp(_minus_scaled_square(1.0), _erf_finish, 1.0, False))),
}

# Activations a producer may fuse (Erf is a plain math function, not an activation).
ACTIVATIONS: tuple[str, ...] = tuple(n for n in _ACTIVATIONS if n != "Erf")


def apply_activation(
    x: np.ndarray, name: str, params: tuple[float, ...] = (), *, inplace: bool = False
) -> np.ndarray:
    """``name`` applied elementwise to ``x``; same shape and dtype as ``x``.

    ``params`` are the activation's float parameters in the order of the module table (missing
    trailing ones take the ONNX defaults). With ``inplace`` the result is written into ``x`` when
    ``x`` is a writable float32/float64 array (a fused producer owns its output buffer, so this
    saves a pass over memory); otherwise a new array is returned. Unknown names, too many params
    and unsupported dtypes raise :class:`KernelError`.
    """
    if name not in _ACTIVATIONS:
        raise KernelError(name, "", f"unknown activation {name!r}; supported: "
                                    f"{', '.join(ACTIVATIONS)}")
    full, build = full_params(name, params), _ACTIVATIONS[name][1]
    if not isinstance(x, np.ndarray):
        raise KernelError(name, "", f"input must be a numpy array, got {type(x).__name__}")
    if x.dtype in INT_DTYPES and name in ("Relu", "Clip"):
        return _integer_activation(x, name, full)
    require_dtype(name, x, FLOAT_DTYPES)
    if name == "Gelu" and full[0] not in (0.0, 1.0):
        raise KernelError(name, "", f"approximate param must be 0.0 (none) or 1.0 (tanh), "
                                    f"got {full[0]}")
    xc = to_compute(x)
    if not xc.flags.c_contiguous:
        xc = xc.copy()  # (not ascontiguousarray: it turns a 0-d tensor into 1-d)
    if xc is not x or (inplace and x.flags.writeable):
        out = xc  # a fresh float32 copy (half input, strided input) or the caller's buffer
    else:
        out = np.empty(xc.shape, xc.dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        build(full)(xc, out)
    return from_compute(out, x.dtype)


def _integer_activation(x: np.ndarray, name: str, full: tuple[float, ...]) -> np.ndarray:
    if name == "Relu":
        return np.asarray(np.maximum(x, x.dtype.type(0)))  # (a ufunc turns 0-d into a scalar)
    info = np.iinfo(x.dtype)
    lo, hi = (int(max(min(b, info.max), info.min)) if math.isfinite(b) else
              (info.min if b < 0 else info.max) for b in full)
    return np.asarray(np.minimum(np.maximum(x, x.dtype.type(lo)), x.dtype.type(hi)))


def full_params(name: str, params: Sequence[float]) -> tuple[float, ...]:
    """``params`` of activation ``name`` (a known one) as floats, the missing trailing ones
    filled with the ONNX defaults of the module table (HardSigmoid: alpha 0.2, beta 0.5); too
    many raise :class:`KernelError`."""
    defaults = _ACTIVATIONS[name][0]
    params = tuple(float(p) for p in params)
    if len(params) > len(defaults):
        raise KernelError(name, "", f"takes at most {len(defaults)} params, got {params}")
    return params + defaults[len(params):]


def activation_params(
    op: str, attrs: Mapping[str, Any], inputs: Sequence[np.ndarray | None] = ()
) -> tuple[float, ...]:
    """The ``params`` of :func:`apply_activation` for an ONNX node of type ``op``.

    ``attrs`` are the node's attributes (ONNX defaults apply when absent); ``inputs`` are its
    inputs, which matter only for Clip (min and max are inputs 1 and 2 since opset 11, and
    attributes in opset 6).
    """
    if op == "LeakyRelu":
        return (float(attrs.get("alpha", 0.01)),)
    if op == "HardSigmoid":
        return (float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5)))
    if op == "Gelu":
        approx = attrs.get("approximate", "none")
        if approx not in ("none", "tanh"):
            raise KernelError(op, "", f"approximate={approx!r} is invalid; expected 'none' or "
                                      f"'tanh'")
        return (1.0 if approx == "tanh" else 0.0,)
    if op == "Clip":
        return _clip_params(attrs, inputs)
    return ()


def clip_range(dtype: np.dtype) -> tuple[float, float]:
    """ONNX Clip's default bounds for ``dtype``: its lowest and highest finite values (so an
    infinite input clamps to them, as onnxruntime does), or +-inf for an integer type."""
    if np.dtype(dtype).kind not in "fV":
        return -math.inf, math.inf
    info = ml_dtypes.finfo(dtype)  # numpy's finfo for float16/32, ml_dtypes' for bfloat16
    return float(info.min), float(info.max)


def _clip_params(attrs: Mapping[str, Any], inputs: Sequence[np.ndarray | None]) -> tuple[
        float, float]:
    bounds = []
    x = inputs[0] if inputs else None
    low, high = clip_range(x.dtype) if x is not None else (-math.inf, math.inf)
    for index, key, default in ((1, "min", low), (2, "max", high)):
        value = inputs[index] if index < len(inputs) else None
        if value is not None:
            value = np.asarray(value)
            if value.size != 1:
                raise KernelError("Clip", "", f"{key} must be a scalar, got shape {value.shape}")
            bounds.append(float(value.reshape(())))
        else:
            bounds.append(float(attrs.get(key, default)))
    return bounds[0], bounds[1]


def _register_activation(op: str) -> None:
    low, high = (1, 3) if op == "Clip" else (1, 1)

    def values(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
        input_count(op, inputs, low, high)
        x = required(op, inputs, 0, "X")
        return [apply_activation(x, op, activation_params(op, attrs, inputs))]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op}: see :func:`apply_activation`."
    kernel(op)(values)


for _op in _ACTIVATIONS:
    _register_activation(_op)


@kernel("PRelu")
def prelu(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX PRelu: ``x if x >= 0 else slope * x``, ``slope`` broadcast to ``x``'s shape."""
    input_count("PRelu", inputs, 2, 2)
    x = required("PRelu", inputs, 0, "X")
    slope = required("PRelu", inputs, 1, "slope")
    require_dtype("PRelu", x, FLOAT_DTYPES + INT_DTYPES)
    if slope.dtype != x.dtype:
        raise KernelError("PRelu", "", f"slope dtype {slope.dtype} differs from X dtype {x.dtype}")
    try:
        shape = np.broadcast_shapes(x.shape, slope.shape)
    except ValueError:
        shape = None
    if shape != x.shape:
        raise KernelError("PRelu", "", f"slope shape {slope.shape} does not broadcast to X shape "
                                       f"{x.shape}")
    xc, sc = to_compute(x), to_compute(slope)
    return [from_compute(np.asarray(np.where(xc < 0, xc * sc, xc)), x.dtype)]
