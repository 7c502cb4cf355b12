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
of Python around a 5 us GEMM. A ResNet block's last 1x1 convolution adds its bias, the
residual and a Relu in one loop too (:func:`bias_residual`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numba import carray, njit

from ..epilogue import decode
from . import activations, mlas
from .activations import bias_hard_sigmoid, full_params
from .mlas import bias_sigmoid
from .native import EPILOGUE, compiled

FusedLoop = Callable[[np.ndarray, np.ndarray], bool]


@njit(cache=True, nogil=True, error_model="numpy")
def _bias_relu(y, b, relu):  # pragma: no cover - numba
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row = y[n, m]
            bias = b[m]
            if relu:
                for p in range(row.size):
                    v = row[p] + bias
                    row[p] = 0 if v < 0 else v  # NaN passes through, as the Relu kernel's loop
            else:
                for p in range(row.size):
                    row[p] = row[p] + bias  # float32, as numpy's add


@njit(cache=True, nogil=True, error_model="numpy")
def _bias_residual(y, b, r, relu):  # pragma: no cover - numba
    for n in range(y.shape[0]):
        for m in range(y.shape[1]):
            row, other = y[n, m], r[n, m]
            bias = b[m]
            if relu:
                for p in range(row.size):
                    v = (row[p] + bias) + other[p]
                    row[p] = 0 if v < 0 else v
            else:
                for p in range(row.size):
                    row[p] = (row[p] + bias) + other[p]


def _bias_rows(y, b, r, params, rows, columns):  # pragma: no cover - numba
    _bias_relu(carray(y, (1, rows, columns), np.float32), carray(b, (rows,), np.float32), False)


def _bias_relu_rows(y, b, r, params, rows, columns):  # pragma: no cover - numba
    _bias_relu(carray(y, (1, rows, columns), np.float32), carray(b, (rows,), np.float32), True)


def _bias_residual_rows(y, b, r, params, rows, columns):  # pragma: no cover - numba
    _bias_residual(carray(y, (1, rows, columns), np.float32), carray(b, (rows,), np.float32),
                   carray(r, (1, rows, columns), np.float32), False)


def _bias_residual_relu_rows(y, b, r, params, rows, columns):  # pragma: no cover - numba
    _bias_residual(carray(y, (1, rows, columns), np.float32), carray(b, (rows,), np.float32),
                   carray(r, (1, rows, columns), np.float32), True)


_NATIVE_LOOPS = {"bias": _bias_rows, "bias_relu": _bias_relu_rows,
                 "bias_residual": _bias_residual_rows,
                 "bias_residual_relu": _bias_residual_relu_rows}


def native_loops() -> dict[str, int]:
    """The addresses of this module's loops as :data:`.native.EPILOGUE` functions
    (:func:`.native.compiled`): ``bias``, ``bias_relu``, ``bias_residual``,
    ``bias_residual_relu``."""
    return {name: compiled(EPILOGUE, loop) for name, loop in _NATIVE_LOOPS.items()}


def bias_residual(y: np.ndarray, bias: np.ndarray, residual: np.ndarray, relu: bool) -> bool:
    """A ResNet block's last convolution in one pass: ``y`` (N, M, pixels) plus ``bias`` (M,),
    plus ``residual`` (``y``'s shape), then a Relu if ``relu``, in place, each a float32
    operation in that order, as :func:`.conv.add_bias`, the epilogue's ``Add`` and the Relu
    kernel's loop do them one pass each (so the same bits). True when it applied (all float32,
    ``y`` and ``residual`` contiguous); False, ``y`` untouched, otherwise."""
    if y.dtype != np.float32 or bias.dtype != np.float32 or residual.dtype != np.float32 or \
            not y.flags.c_contiguous or not residual.flags.c_contiguous or \
            residual.shape != y.shape or y.ndim != 3:
        return False
    _bias_residual(y, bias, residual, relu)
    return True


def fused_bias_loop(op: str, attrs: Mapping[str, Any]) -> FusedLoop | None:
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
            return _checked(lambda rows, bias: _bias_relu(rows, bias, True),
                            lambda: (native_loops()["bias_relu"], None))
        if activation == "Sigmoid" and not params:
            return _checked(lambda rows, bias: bias_sigmoid(rows, bias, False),
                            lambda: mlas.native_bias_sigmoid(False))
        if activation == "HardSigmoid":  # a squeeze-excite's gate
            alpha, beta = full_params("HardSigmoid", params)
            return _checked(lambda rows, bias: bias_hard_sigmoid(rows, bias, alpha, beta, False),
                            lambda: activations.native_bias_hard_sigmoid(alpha, beta, False))
        return None
    if activation:
        return None
    steps = decode(op, attrs)
    if len(steps) != 1 or not steps[0].gate:
        return None
    if steps[0].op == "HardSigmoid":
        alpha, beta = full_params("HardSigmoid", steps[0].params)
        return _checked(lambda rows, bias: bias_hard_sigmoid(rows, bias, alpha, beta, True),
                        lambda: activations.native_bias_hard_sigmoid(alpha, beta, True))
    if steps[0].op == "Sigmoid":
        return _checked(lambda rows, bias: bias_sigmoid(rows, bias, True),
                        lambda: mlas.native_bias_sigmoid(True))
    return None


Native = tuple[int, "np.ndarray | None"]
"""A loop as native code: its :data:`.native.EPILOGUE` address and its parameters (a float64
array it reads, kept alive with the loop, or None)."""


def native_form(loop: FusedLoop) -> Native | None:
    """The native form of a loop :func:`fused_bias_loop` made (None for any other callable)."""
    make = getattr(loop, "native", None)
    return make() if make is not None else None


def _checked(loop: Callable[[np.ndarray, np.ndarray], object],
             native: Callable[[], Native]) -> FusedLoop:
    def run(y: np.ndarray, bias: np.ndarray) -> bool:
        if y.dtype != np.float32 or bias.dtype != np.float32 or not y.flags.c_contiguous or \
                not y.flags.writeable or y.ndim < 2:
            return False
        loop(y.reshape(y.shape[0], y.shape[1], -1), bias)
        return True
    run.native = native  # type: ignore[attr-defined]
    return run
