"""Kernels: elementwise arithmetic, comparisons-by-value, Where, Cast and the identity ops.

These are the ops whose work is one independent computation per output element, with ONNX
multidirectional (numpy-style) broadcasting between inputs. numpy's ufuncs already run them in
one vectorised pass with broadcasting, so they are used directly; the only work here is the ONNX
semantics numpy does not share:

* inputs must share one dtype (ONNX has no implicit promotion);
* integer Div truncates toward zero (C semantics, as onnxruntime), numpy's ``//`` floors;
  division by an integer zero is an error, not a crash;
* integer Pow is ``pow`` in double precision truncated back to the integer type (onnxruntime);
* float16 and bfloat16 are computed in float32 and rounded once;
* a 0-d input gives a 0-d array (numpy's ufuncs would return a scalar).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import ConfigError, KernelError
from .activations import (
    FLOAT_DTYPES,
    INT_DTYPES,
    from_compute,
    input_count,
    require_dtype,
    required,
    to_compute,
)
from .registry import kernel

NUMERIC_DTYPES = FLOAT_DTYPES + INT_DTYPES
SIGNED_DTYPES = FLOAT_DTYPES + tuple(d for d in INT_DTYPES if d.kind == "i")
BOOL = np.dtype(np.bool_)
Inputs = Sequence["np.ndarray | None"]


def broadcast_shape(op: str, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
    """The ONNX multidirectional broadcast of the arrays' shapes, or :class:`KernelError`."""
    try:
        return np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise KernelError(op, "", f"input shapes {shapes} do not broadcast") from None


def same_dtype(op: str, arrays: Sequence[np.ndarray], allowed: Sequence[np.dtype]) -> np.dtype:
    """The one dtype all ``arrays`` share (and that is ``allowed``), or :class:`KernelError`."""
    for i, a in enumerate(arrays):
        require_dtype(op, a, allowed, f"input {i}")
    kinds = {a.dtype for a in arrays}
    if len(kinds) > 1:
        found = ", ".join(str(a.dtype) for a in arrays)
        raise KernelError(op, "", f"inputs must share one dtype, got {found}")
    return arrays[0].dtype


def _present(op: str, inputs: Inputs, low: int, high: int) -> list[np.ndarray]:
    input_count(op, inputs, low, high)
    return [required(op, inputs, i, f"input {i}") for i in range(len(inputs))]


def _compute(fn: Callable[..., np.ndarray], arrays: Sequence[np.ndarray], dtype: np.dtype
             ) -> np.ndarray:
    """``fn`` on the arrays in their compute dtype, rounded once to ``dtype``; never a scalar."""
    with np.errstate(all="ignore"):  # inf/nan/wrap-around are results here, not warnings
        result = fn(*(to_compute(a) for a in arrays))
    return from_compute(np.asarray(result), dtype)


# --- binary arithmetic --------------------------------------------------------------------------


def _trunc_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "u":
        return np.floor_divide(a, b)
    q = np.floor_divide(a, b)
    # floor and truncation differ when the division is inexact and the signs differ.
    fix = (a - q * b != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _divide(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        if not np.all(b):
            raise KernelError(op, "", f"integer division by zero: divisor {b.dtype} tensor of "
                                      f"shape {b.shape} contains 0")
        return _compute(_trunc_divide, [a, b], a.dtype)
    return _compute(np.divide, [a, b], a.dtype)


_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
}


def _register_binary(op: str) -> None:
    ufunc = _BINARY.get(op)

    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        a, b = _present(op, inputs, 2, 2)
        dtype = same_dtype(op, [a, b], NUMERIC_DTYPES)
        broadcast_shape(op, [a, b])
        if ufunc is None:
            return [_divide(op, a, b)]
        return [_compute(ufunc, [a, b], dtype)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op} with broadcasting; integer inputs wrap around on overflow."
    kernel(op)(values)


for _op in ("Add", "Sub", "Mul", "Div"):
    _register_binary(_op)


@kernel("Pow")
def power(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Pow: ``X ** Y`` in X's dtype; Y may have another numeric dtype.

    Integer X is computed as ``pow`` in double precision and truncated back, like onnxruntime
    (``2 ** -1 == 0``).
    """
    x, y = _present("Pow", inputs, 2, 2)
    require_dtype("Pow", x, NUMERIC_DTYPES, "X")
    require_dtype("Pow", y, NUMERIC_DTYPES, "Y")
    broadcast_shape("Pow", [x, y])
    if x.dtype.kind in "iu":
        with np.errstate(all="ignore"):
            wide = np.power(x.astype(np.float64), y.astype(np.float64))
            return [np.asarray(np.trunc(wide)).astype(x.dtype)]
    xc = to_compute(x)
    return [_compute(np.power, [xc, y.astype(xc.dtype)], x.dtype)]


# --- unary ---------------------------------------------------------------------------------------

_UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[np.dtype, ...]]] = {
    "Sqrt": (np.sqrt, FLOAT_DTYPES),
    "Exp": (np.exp, FLOAT_DTYPES),
    "Log": (np.log, FLOAT_DTYPES),
    "Reciprocal": (np.reciprocal, FLOAT_DTYPES),
    "Neg": (np.negative, SIGNED_DTYPES),
    "Abs": (np.abs, NUMERIC_DTYPES),
    "Sin": (np.sin, FLOAT_DTYPES),
    "Cos": (np.cos, FLOAT_DTYPES),
    "Floor": (np.floor, FLOAT_DTYPES),
    "Ceil": (np.ceil, FLOAT_DTYPES),
    "Round": (np.round, FLOAT_DTYPES),  # half to even, as ONNX defines
}


def _register_unary(op: str) -> None:
    fn, allowed = _UNARY[op]

    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        (x,) = _present(op, inputs, 1, 1)
        require_dtype(op, x, allowed, "X")
        return [_compute(fn, [x], x.dtype)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op}, elementwise."
    kernel(op)(values)


for _op in _UNARY:
    _register_unary(_op)


# --- variadic ------------------------------------------------------------------------------------


def _register_variadic(op: str, fn: Callable[..., np.ndarray], allowed: Sequence[np.dtype],
                       average: bool = False) -> None:
    def values(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
        if not inputs:
            raise KernelError(op, "", "takes at least 1 input, got 0")
        arrays = [required(op, inputs, i, f"input {i}") for i in range(len(inputs))]
        dtype = same_dtype(op, arrays, allowed)
        shape = broadcast_shape(op, arrays)

        def reduce(*xs: np.ndarray) -> np.ndarray:
            acc = np.broadcast_to(xs[0], shape).copy()  # owned, so later steps run in place
            for x in xs[1:]:
                fn(acc, x, out=acc)
            if average:
                acc /= acc.dtype.type(len(xs))
            return acc

        return [_compute(reduce, arrays, dtype)]

    values.__name__ = values.__qualname__ = op.lower()
    values.__doc__ = f"ONNX {op} of one or more broadcast inputs."
    kernel(op)(values)


_register_variadic("Sum", np.add, FLOAT_DTYPES)  # ONNX Sum and Mean are float-only
_register_variadic("Mean", np.add, FLOAT_DTYPES, average=True)
_register_variadic("Min", np.minimum, NUMERIC_DTYPES)
_register_variadic("Max", np.maximum, NUMERIC_DTYPES)


# --- selection, conversion, identity --------------------------------------------------------------


@kernel("Where")
def where(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Where: ``X`` where ``condition`` else ``Y``, all three broadcast together."""
    cond, x, y = _present("Where", inputs, 3, 3)
    require_dtype("Where", cond, (BOOL,), "condition")
    same_dtype("Where", [x, y], NUMERIC_DTYPES + (BOOL,))
    broadcast_shape("Where", [cond, x, y])
    return [np.asarray(np.where(cond, x, y))]


@kernel("Cast")
def cast(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Cast to the ``to`` element type (an ONNX ``TensorProto`` enum).

    Float to integer truncates toward zero; out-of-range values and NaN convert as the host's C
    cast does (onnxruntime's ``static_cast``: e.g. 200.0 -> int8 -56, NaN -> int32 INT_MIN).
    Float to bool is ``x != 0``. Float to float16/bfloat16 rounds to nearest even.
    """
    (x,) = _present("Cast", inputs, 1, 1)
    require_dtype("Cast", x, NUMERIC_DTYPES + (BOOL,))
    if "to" not in attrs:
        raise KernelError("Cast", "", "attribute 'to' is required")
    try:
        target = dtypes.to_numpy(dtypes.from_onnx(int(attrs["to"])))
    except (ConfigError, TypeError, ValueError):
        raise KernelError("Cast", "", f"to={attrs['to']!r} is not a supported ONNX element "
                                      f"type; supported: {list(dtypes.DTYPES)}") from None
    with np.errstate(all="ignore"):
        if x.dtype in FLOAT_DTYPES[2:] and target.kind in "iub":
            x = x.astype(np.float32)  # ml_dtypes halves cast to ints through float32, as ORT
        return [np.asarray(x.astype(target))]


@kernel("Identity")
def identity(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Identity: the input itself (kernel outputs are never written in place)."""
    (x,) = _present("Identity", inputs, 1, 1)
    return [x]


@kernel("Dropout")
def dropout(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Dropout in inference mode: ``[data, mask]`` with an all-True mask.

    ``ratio`` (input 1, or an attribute before opset 12) does not matter at inference; a true
    ``training_mode`` (input 2) is an error, since training-mode dropout is random.
    """
    input_count("Dropout", inputs, 1, 3)
    x = required("Dropout", inputs, 0, "data")
    mode = inputs[2] if len(inputs) > 2 else None
    if mode is not None and bool(np.asarray(mode).any()):
        raise KernelError("Dropout", "", "training_mode=True is not supported; the device runs "
                                         "inference only (training_mode must be False or absent)")
    return [x, np.ones(x.shape, np.bool_)]
