"""Kernels: comparisons, logic and floating-point class tests, all with boolean results.

Exported transformers compute their attention masks with these: ``Equal``/``Less`` of position
indices, ``And`` of masks, ``Not``, and ``IsNaN`` guarding a softmax over fully masked rows
(torch's scaled-dot-product attention). A real NPU's vector unit evaluates a predicate per lane
like any elementwise op. ONNX semantics numpy does not share: inputs of one comparison must
share a dtype (no promotion); comparisons with NaN are false except ``!=``; float16 and
bfloat16 compare exactly in float32; results are ``bool`` with broadcasting; a 0-d input gives
a 0-d array.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .activations import FLOAT_DTYPES, require_dtype, to_compute
from .elementwise import BOOL, NUMERIC_DTYPES, Inputs, _present, broadcast_shape, same_dtype
from .registry import kernel

_COMPARE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Equal": np.equal,
    "Greater": np.greater,
    "Less": np.less,
    "GreaterOrEqual": np.greater_equal,
    "LessOrEqual": np.less_equal,
}

_LOGIC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "And": np.logical_and,
    "Or": np.logical_or,
    "Xor": np.logical_xor,
}


def _register_compare(op: str) -> None:
    ufunc = _COMPARE[op]
    allowed = NUMERIC_DTYPES + ((BOOL,) if op == "Equal" else ())

    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        a, b = _present(op, inputs, 2, 2)
        same_dtype(op, [a, b], allowed)
        broadcast_shape(op, [a, b])
        return [np.asarray(ufunc(to_compute(a), to_compute(b)), dtype=BOOL)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op}: elementwise comparison with broadcasting, bool result."
    kernel(op)(values)


def _register_logic(op: str) -> None:
    ufunc = _LOGIC[op]

    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        a, b = _present(op, inputs, 2, 2)
        same_dtype(op, [a, b], (BOOL,))
        broadcast_shape(op, [a, b])
        return [np.asarray(ufunc(a, b), dtype=BOOL)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op} of two bool tensors with broadcasting."
    kernel(op)(values)


for _op in _COMPARE:
    _register_compare(_op)
for _op in _LOGIC:
    _register_logic(_op)


@kernel("Not")
def logical_not(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Not of a bool tensor."""
    (x,) = _present("Not", inputs, 1, 1)
    require_dtype("Not", x, (BOOL,), "X")
    return [np.asarray(np.logical_not(x), dtype=BOOL)]


@kernel("IsNaN")
def is_nan(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX IsNaN: which elements of a float tensor are NaN."""
    (x,) = _present("IsNaN", inputs, 1, 1)
    require_dtype("IsNaN", x, FLOAT_DTYPES, "X")
    return [np.asarray(np.isnan(to_compute(x)), dtype=BOOL)]


@kernel("IsInf")
def is_inf(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX IsInf: infinities of a float tensor, positive and/or negative
    (``detect_positive``, ``detect_negative``, both 1 by default)."""
    (x,) = _present("IsInf", inputs, 1, 1)
    require_dtype("IsInf", x, FLOAT_DTYPES, "X")
    xc = to_compute(x)
    positive = bool(int(attrs.get("detect_positive", 1)))
    negative = bool(int(attrs.get("detect_negative", 1)))
    found = np.isinf(xc) & ((positive & (xc > 0)) | (negative & (xc < 0)))
    return [np.asarray(found, dtype=BOOL)]
