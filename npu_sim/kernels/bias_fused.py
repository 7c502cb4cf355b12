"""Kernels: a convolution's bias, fused activation and hard-swish gate in one pass over memory.

A mobile net's convolution writes a small output (50-900 KB) that the bias, then the fused
activation (Relu) or the fused hard-sigmoid gate (hard-swish), each walked again: on a
MobileNet-V3 1x1 convolution of 16x56x56 to 72 channels those two passes took 36 + 67 us beside
the GEMM's 90 us. :func:`fused_bias_loop` does both in one numba loop per channel row. Each
element gets the same float32 operations in the same order as the separate passes (the float32
bias add, then the Relu select, or the gate computed as in
:func:`npu_sim.kernels.epilogue.apply_epilogue`'s loop and rounded to float32 before the
multiply), so the values are the same bits. A SiLU gate (EfficientNet) takes the bias in its
one loop too (:func:`npu_sim.kernels.mlas.bias_sigmoid`), and so does a squeeze-excite's second
1x1 convolution with its Sigmoid or HardSigmoid activation, whose 144-576 outputs took 15-40 us
of Python around a 5 us GEMM.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import carray, cfunc, float32, njit

from ..epilogue import decode
from .activations import full_params
from .host import MLAS_AVX512F
from .mlas import bias_sigmoid, sigmoid_part
from .native import SIGNATURE, address, float_bits, from_bits, pointer

FusedLoop = Callable[[np.ndarray, np.ndarray], bool]
#: The loops of :func:`fused_part`, by the code its context holds.
FUSED_BIAS, FUSED_RELU, FUSED_HARD_SIGMOID = 0, 1, 2


@njit(cache=True, nogil=True, error_model="numpy")
def _bias_relu(y, b):  # pragma: no cover - numba
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row = y[n, m]
            bias = b[m]
            for p in range(row.size):
                v = row[p] + bias
                row[p] = 0 if v < 0 else v  # NaN passes through, as the Relu kernel's loop


@njit(cache=True, nogil=True, error_model="numpy")
def _bias_hard_sigmoid(y, b, alpha, beta, gate):  # pragma: no cover - numba
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
                s = a * v + c
                h = np.float32(s if s != s else min(1.0, max(0.0, s)))
                row[p] = v * h if gate else h


def fused_bias_loop(op: str, attrs: Mapping[str, Any]) -> Fused | None:
    """The one-pass loop adding a bias and applying the launch's fused activation or epilogue,
    when that is a Relu, Sigmoid or HardSigmoid activation (a squeeze-excite's second 1x1
    convolution) alone or a hard-sigmoid or sigmoid (SiLU) gate alone; else
    None. ``loop(y, bias)`` adds ``bias`` (M,) to ``y`` (N, M, ...) and applies it in place when
    both are contiguous float32, and returns True; False (``y`` untouched) when the caller must
    add the bias and finish as usual."""
    activation = attrs.get("activation")
    if "epilogue" not in attrs:
        params = attrs.get("activation_params", ())
        if activation == "Relu" and not params:
            return Fused(_bias_relu, Native(fused_part, FUSED_RELU))
        if activation == "Sigmoid" and not params:
            return Fused(lambda rows, bias: bias_sigmoid(rows, bias, False), Native(sigmoid_part))
        if activation == "HardSigmoid":  # a squeeze-excite's gate
            alpha, beta = full_params("HardSigmoid", params)
            return Fused(lambda rows, bias: _bias_hard_sigmoid(rows, bias, alpha, beta, False),
                         Native(fused_part, FUSED_HARD_SIGMOID, alpha, beta))
        return None
    if activation:
        return None
    steps = decode(op, attrs)
    if len(steps) != 1 or not steps[0].gate:
        return None
    if steps[0].op == "HardSigmoid":
        alpha, beta = full_params("HardSigmoid", steps[0].params)
        return Fused(lambda rows, bias: _bias_hard_sigmoid(rows, bias, alpha, beta, True),
                     Native(fused_part, FUSED_HARD_SIGMOID, alpha, beta, gate=True))
    if steps[0].op == "Sigmoid":
        return Fused(lambda rows, bias: bias_sigmoid(rows, bias, True),
                     Native(sigmoid_part, gate=True))
    return None


@dataclass(frozen=True)
class Native:
    """A fused loop as a native part (:mod:`.native`): the getter of its address, and what its
    context holds (:func:`context`)."""

    part: Callable[[], int]
    loop: int = FUSED_BIAS
    alpha: float = 0.0
    beta: float = 0.0
    gate: bool = False

    def context(self, y: np.ndarray, bias: np.ndarray, bounds: Sequence[int]) -> np.ndarray:
        """The part's context for output ``y`` (N, M, ...) float32 and C-contiguous, ``bias``
        (M,) float32 and parts of channels ``bounds``; it points into both arrays."""
        n, m = y.shape[:2]
        return np.array([address(y), n, m, y.size // max(1, n * m), address(bias),
                         float_bits(self.alpha), float_bits(self.beta), self.gate,
                         MLAS_AVX512F, self.loop, *bounds], np.int64)


class Fused:
    """A fused bias loop: ``fused(y, bias)`` runs it (:data:`FusedLoop`), ``native`` is the same
    loop as a native part."""

    def __init__(self, loop: Callable[[np.ndarray, np.ndarray], object], native: Native) -> None:
        self.loop, self.native = loop, native

    def __call__(self, y: np.ndarray, bias: np.ndarray) -> bool:
        if y.dtype != np.float32 or bias.dtype != np.float32 or not y.flags.c_contiguous or \
                not y.flags.writeable or y.ndim < 2:
            return False
        self.loop(y.reshape(y.shape[0], y.shape[1], -1), bias)
        return True


# Native parts (:mod:`.native`): the bias and fused activation of a split launch's channels,
# run after its compute part on the same thread. Context: y, its (N, M, pixels); the bias;
# alpha and beta (:func:`.native.float_bits`); gate; a host flag (unused here); the loop
# (FUSED_BIAS, FUSED_RELU, FUSED_HARD_SIGMOID); then the part bounds (channels). Made by
# Native.context.


@njit(cache=True, nogil=True, error_model="numpy")
def _bias(y, b):  # pragma: no cover - numba
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row = y[n, m]
            bias = b[m]
            for p in range(row.size):
                row[p] += bias


def _fused_part(context, k):  # pragma: no cover - compiled
    c = carray(context, 12 + k)
    m, pixels, lo, hi = c[2], c[3], c[10 + k], c[11 + k]
    b = carray(pointer(c[4] + lo * 4, float32), hi - lo)
    for n in range(c[1]):
        rows = carray(pointer(c[0] + (n * m + lo) * pixels * 4, float32), (1, hi - lo, pixels))
        if c[9] == FUSED_RELU:
            _bias_relu(rows, b)
        elif c[9] == FUSED_HARD_SIGMOID:
            _bias_hard_sigmoid(rows, b, from_bits(c[5]), from_bits(c[6]), c[7] != 0)
        else:
            _bias(rows, b)


@functools.cache
def fused_part() -> int:
    """The address of the native part adding a bias and applying a fused Relu or
    HardSigmoid (gate or not) to a split launch's channels (compiled on first use)."""
    return cfunc(SIGNATURE, nogil=True, cache=True, error_model="numpy")(_fused_part).address


#: Context of :func:`steps_part`: y, its (N, M, pixels); the bias (0: none); the step count;
#: up to STEPS (code, operand) pairs (STEP_ADD or STEP_MUL, an operand of y's shape); then the
#: part bounds (channels) from slot STEPS_BOUNDS.
STEP_ADD, STEP_MUL = 0, 1
STEPS = 4
STEPS_BOUNDS = 6 + 2 * STEPS


def _steps_part(context, k):  # pragma: no cover - compiled
    c = carray(context, STEPS_BOUNDS + k + 2)
    m, pixels, lo, hi = c[2], c[3], c[STEPS_BOUNDS + k], c[STEPS_BOUNDS + k + 1]
    for n in range(c[1]):
        at = (n * m + lo) * pixels
        rows = carray(pointer(c[0] + at * 4, float32), (1, hi - lo, pixels))
        if c[4]:
            _bias(rows, carray(pointer(c[4] + lo * 4, float32), hi - lo))
        flat = rows.reshape(-1)
        for s in range(c[5]):
            other = carray(pointer(c[7 + 2 * s] + at * 4, float32), flat.size)
            if c[6 + 2 * s] == STEP_MUL:
                for e in range(flat.size):
                    flat[e] *= other[e]
            else:
                for e in range(flat.size):
                    flat[e] += other[e]


@functools.cache
def steps_part() -> int:
    """The address of the native part adding a bias (if any), then elementwise ``Add`` or
    ``Mul`` operands of the output's shape (a residual), to a split launch's channels, as numpy
    adds and multiplies float32 (compiled on first use)."""
    return cfunc(SIGNATURE, nogil=True, cache=True, error_model="numpy")(_steps_part).address


def steps_context(y: np.ndarray, bias: np.ndarray | None,
                  steps: Sequence[tuple[int, np.ndarray]], bounds: Sequence[int]) -> np.ndarray:
    """:func:`steps_part`'s context for output ``y`` (N, M, ...) float32 and C-contiguous,
    ``bias`` (M,) float32 or None, ``steps`` of (STEP_ADD or STEP_MUL, a C-contiguous float32
    operand of ``y``'s shape), at most :data:`STEPS`, and parts of channels ``bounds``."""
    n, m = y.shape[:2]
    pairs = [v for code, operand in steps for v in (code, address(operand))]
    pairs += [0] * (2 * STEPS - len(pairs))
    return np.array([address(y), n, m, y.size // max(1, n * m),
                     0 if bias is None else address(bias), len(steps), *pairs, *bounds],
                    np.int64)
