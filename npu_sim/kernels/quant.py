"""Kernels: int8/uint8 quantization and the quantized matmul and conv ops.

Linear quantization maps a real value ``r`` to an integer ``q`` through a scale and a zero point:
``q = saturate(round_half_to_even(r / scale) + zero_point)`` and back ``r = (q - zero_point) *
scale`` (ONNX opset 13 semantics), per tensor or per axis (one scale per slice along ``axis``).

The integer ops accumulate ``(a - a_zero) * (b - b_zero)`` exactly, as an NPU's int8 MAC array
does into int32. The accumulation runs through float64 BLAS (and the float64 path of the
im2col conv in :mod:`npu_sim.kernels.conv`): every product of two 9-bit differences is below 2**17
and every partial sum below 2**53, so float64 holds each one exactly. The QLinear ops then
requantize like onnxruntime does: the multiplier ``in_scale * w_scale / y_scale`` and the product
``float32(acc) * multiplier`` in float32, rounded half to even, plus the output zero point,
saturated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import KernelError
from .conv import check_conv, conv_nd, window
from .gemm import FLOAT_DTYPES, matmul_shape
from .registry import kernel

_INT8 = (np.dtype(np.int8), np.dtype(np.uint8))


def _int8(op: str, name: str, array: np.ndarray) -> np.ndarray:
    if array.dtype not in _INT8:
        raise KernelError(op, "", f"{name} has dtype {array.dtype}; expected int8 or uint8")
    return array


def _scalar(op: str, name: str, value: np.ndarray | None, default: Any = 0) -> np.ndarray:
    """A per-tensor parameter: a scalar or a one-element tensor."""
    if value is None:
        return np.asarray(default)
    if value.size != 1:
        raise KernelError(op, "", f"{name} must be a scalar, got shape {value.shape}")
    return value.reshape(())


def _per_axis(
    op: str, name: str, value: np.ndarray, shape: tuple[int, ...], axis: int
) -> np.ndarray:
    """A per-tensor or per-axis parameter, reshaped to broadcast against ``shape``."""
    if value.ndim == 0 or (value.ndim == 1 and value.size == 1):
        return value.reshape(())
    if not -len(shape) <= axis < len(shape):
        raise KernelError(op, "", f"axis={axis} is out of range for the input shape {shape}")
    axis %= len(shape)
    if value.ndim != 1 or value.shape[0] != shape[axis]:
        raise KernelError(
            op,
            "",
            f"{name} of shape {value.shape} must be a scalar or 1-D of length {shape[axis]} "
            f"(dim {axis} of the input shape {shape})",
        )
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return value.reshape(view)


def _axis(op: str, attrs: Mapping[str, Any]) -> int:
    """The ``axis`` attribute (checked against the rank only where a per-axis scale uses it)."""
    if int(attrs.get("block_size", 0)):
        raise KernelError(
            op,
            "",
            f"block_size={attrs['block_size']}: blocked quantization is not supported; use "
            "per-tensor or per-axis scales",
        )
    return int(attrs.get("axis", 1))


def saturate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round half to even, clip to ``dtype``'s range and convert; NaN becomes the range's
    minimum, as onnxruntime's quantizer gives it (int8 -128, uint8 0)."""
    info = np.iinfo(dtype)
    rounded = np.rint(values)
    return np.clip(np.where(np.isnan(rounded), info.min, rounded), info.min,
                   info.max).astype(dtype)


@kernel("QuantizeLinear")
def quantize_linear(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX QuantizeLinear: float to int8/uint8 (uint8 when the zero point is omitted)."""
    op = "QuantizeLinear"
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        raise KernelError(op, "", "needs inputs x and y_scale")
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    if x.dtype not in FLOAT_DTYPES:
        raise KernelError(op, "", f"x has dtype {x.dtype}; expected float32, float16, bfloat16")
    out_dtype = np.dtype(np.uint8) if zp is None else _int8(op, "y_zero_point", zp).dtype
    axis = _axis(op, attrs)
    s = _per_axis(op, "y_scale", scale.astype(np.float32), x.shape, axis)
    z = np.zeros((), np.float32) if zp is None else _per_axis(op, "y_zero_point", zp, x.shape, axis)
    if zp is not None and z.shape != s.shape:
        raise KernelError(
            op, "", f"y_zero_point shape {zp.shape} must match y_scale shape {scale.shape}"
        )
    q = np.rint(x.astype(np.float32) / s) + z.astype(np.float32)
    return [saturate(q, out_dtype)]


@kernel("DequantizeLinear")
def dequantize_linear(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX DequantizeLinear: int8/uint8/int32 to the scale's float dtype."""
    op = "DequantizeLinear"
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        raise KernelError(op, "", "needs inputs x and x_scale")
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    if x.dtype not in _INT8 + (np.dtype(np.int32),):
        raise KernelError(op, "", f"x has dtype {x.dtype}; expected int8, uint8 or int32")
    if zp is not None and zp.dtype != x.dtype:
        raise KernelError(op, "", f"x_zero_point dtype {zp.dtype} must match x dtype {x.dtype}")
    if scale.dtype not in FLOAT_DTYPES:
        raise KernelError(op, "", f"x_scale has dtype {scale.dtype}; expected a float dtype")
    axis = _axis(op, attrs)
    s = _per_axis(op, "x_scale", scale.astype(np.float32), x.shape, axis)
    z = np.zeros((), np.int64) if zp is None else _per_axis(op, "x_zero_point", zp, x.shape, axis)
    if zp is not None and z.shape != s.shape:
        raise KernelError(
            op, "", f"x_zero_point shape {zp.shape} must match x_scale shape {scale.shape}"
        )
    y = (x.astype(np.int64) - z.astype(np.int64)).astype(np.float32) * s
    return [y.astype(scale.dtype)]


def _int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer ``a @ b`` of zero-point-shifted int8 values (float64 BLAS), as int64."""
    return np.rint(np.matmul(a.astype(np.float64), b.astype(np.float64))).astype(np.int64)


def _row_zero(op: str, name: str, zp: np.ndarray | None, a: np.ndarray) -> np.ndarray:
    """A's zero point: scalar, per row (M,) or shaped like A with a size-1 last dim."""
    if zp is None:
        return np.zeros((), a.dtype)
    if zp.size == 1:
        return zp.reshape(())
    if a.ndim >= 2 and zp.shape == (a.shape[-2],):
        return zp.reshape(-1, 1)
    if zp.ndim == a.ndim and zp.shape[-1] == 1:
        return zp
    raise KernelError(op, "", f"{name} of shape {zp.shape} does not fit A of shape {a.shape}")


def _col_zero(op: str, name: str, zp: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    """B's zero point: scalar, per column (N,) or shaped like B with a size-1 row dim."""
    if zp is None:
        return np.zeros((), b.dtype)
    if zp.size == 1:
        return zp.reshape(())
    if b.ndim >= 2 and zp.shape == (b.shape[-1],):
        return zp
    if zp.ndim == b.ndim and b.ndim >= 2 and zp.shape[-2] == 1:
        return zp
    raise KernelError(op, "", f"{name} of shape {zp.shape} does not fit B of shape {b.shape}")


def _shifted(x: np.ndarray, zp: np.ndarray, op: str, name: str) -> np.ndarray:
    if zp.dtype != x.dtype:
        raise KernelError(op, "", f"{name} dtype {zp.dtype} must match its input's {x.dtype}")
    try:
        return x.astype(np.int32) - zp.astype(np.int32)
    except ValueError:
        raise KernelError(op, "", f"{name} shape {zp.shape} does not broadcast") from None


@kernel("MatMulInteger")
def matmul_integer(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX MatMulInteger: int32 ``(A - a_zero_point) @ (B - b_zero_point)``."""
    op = "MatMulInteger"
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        raise KernelError(op, "", "needs inputs A and B")
    a, b = _int8(op, "A", inputs[0]), _int8(op, "B", inputs[1])
    matmul_shape(op, a.shape, b.shape)
    a_zp = _row_zero(op, "a_zero_point", inputs[2] if len(inputs) > 2 else None, a)
    b_zp = _col_zero(op, "b_zero_point", inputs[3] if len(inputs) > 3 else None, b)
    acc = _int_matmul(_shifted(a, a_zp, op, "a_zero_point"), _shifted(b, b_zp, op, "b_zero_point"))
    return [acc.astype(np.int32)]


def requantize(
    acc: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray, dtype: np.dtype
) -> np.ndarray:
    """``saturate(rint(float32(acc) * multiplier) + zero_point)`` as onnxruntime computes it."""
    # acc passes through the int32 accumulator (wrapping like the hardware) before scaling
    scaled = np.rint(acc.astype(np.int32).astype(np.float32) * multiplier.astype(np.float32))
    return saturate(scaled + zero_point.astype(np.float32), dtype)


@kernel("QLinearMatMul")
def qlinear_matmul(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX QLinearMatMul: quantized matmul with int32 accumulation and requantization."""
    op = "QLinearMatMul"
    if len(inputs) < 8 or any(v is None for v in inputs[:8]):
        raise KernelError(op, "", f"needs 8 inputs, got {len(inputs)}")
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs[:8]
    a, b = _int8(op, "a", a), _int8(op, "b", b)
    y_dtype = _int8(op, "y_zero_point", y_zp).dtype
    matmul_shape(op, a.shape, b.shape)
    sa = _scalar(op, "a_scale", a_scale).astype(np.float32)
    sy = _scalar(op, "y_scale", y_scale).astype(np.float32)
    sb = _col_zero(op, "b_scale", b_scale, b).astype(np.float32)
    acc = _int_matmul(
        _shifted(a, _scalar(op, "a_zero_point", a_zp), op, "a_zero_point"),
        _shifted(b, _col_zero(op, "b_zero_point", b_zp, b), op, "b_zero_point"),
    )
    multiplier = sa * sb / sy
    return [requantize(acc, multiplier, _scalar(op, "y_zero_point", y_zp), y_dtype)]


def _int_conv(
    op: str,
    x: np.ndarray,
    x_zp: np.ndarray,
    w: np.ndarray,
    w_zp: np.ndarray | None,
    attrs: Mapping[str, Any],
) -> np.ndarray:
    """Exact int64 convolution of ``x - x_zp`` with ``w - w_zp`` (w_zp scalar or per M)."""
    group = check_conv(op, x.shape, w.shape, attrs)
    win = window(op, x.shape[2:], w.shape[2:], attrs)
    if w_zp is None:
        wz = np.zeros((), w.dtype)
    elif w_zp.size == 1:
        wz = w_zp.reshape(())
    elif w_zp.shape == (w.shape[0],):
        wz = w_zp.reshape((-1,) + (1,) * (w.ndim - 1))
    else:
        raise KernelError(
            op, "", f"w_zero_point of shape {w_zp.shape} must be a scalar or ({w.shape[0]},)"
        )
    xs = _shifted(x, x_zp, op, "x_zero_point").astype(np.float64)
    ws = _shifted(w, wz, op, "w_zero_point").astype(np.float64)
    return np.rint(conv_nd(xs, ws, group, win, op)).astype(np.int64)


@kernel("ConvInteger")
def conv_integer(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX ConvInteger: int32 convolution of zero-point-shifted int8/uint8 inputs."""
    op = "ConvInteger"
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        raise KernelError(op, "", "needs inputs x and w")
    x, w = _int8(op, "x", inputs[0]), _int8(op, "w", inputs[1])
    x_zp = _scalar(op, "x_zero_point", inputs[2] if len(inputs) > 2 else None)
    if len(inputs) <= 2 or inputs[2] is None:
        x_zp = x_zp.astype(x.dtype)
    w_zp = inputs[3] if len(inputs) > 3 else None
    return [_int_conv(op, x, x_zp, w, w_zp, attrs).astype(np.int32)]


@kernel("QLinearConv")
def qlinear_conv(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX QLinearConv: quantized conv, per-tensor or per-output-channel weight scales."""
    op = "QLinearConv"
    if len(inputs) < 8 or any(v is None for v in inputs[:8]):
        raise KernelError(op, "", f"needs at least 8 inputs, got {len(inputs)}")
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    x, w = _int8(op, "x", x), _int8(op, "w", w)
    y_dtype = _int8(op, "y_zero_point", y_zp).dtype
    acc = _int_conv(op, x, _scalar(op, "x_zero_point", x_zp), w, w_zp, attrs)
    m = w.shape[0]
    spatial = (1,) * (x.ndim - 2)
    if bias is not None:
        if bias.dtype != np.int32 or bias.shape != (m,):
            raise KernelError(
                op, "", f"B must be int32 of shape ({m},), got {bias.dtype} {bias.shape}"
            )
        acc += bias.astype(np.int64).reshape((1, m) + spatial)
    if w_scale.size == 1:
        ws = w_scale.reshape(()).astype(np.float32)
    elif w_scale.shape == (m,):
        ws = w_scale.astype(np.float32).reshape((1, m) + spatial)
    else:
        raise KernelError(op, "", f"w_scale of shape {w_scale.shape} must be a scalar or ({m},)")
    multiplier = (
        _scalar(op, "x_scale", x_scale).astype(np.float32)
        * ws
        / _scalar(op, "y_scale", y_scale).astype(np.float32)
    )
    return [requantize(acc, multiplier, _scalar(op, "y_zero_point", y_zp), y_dtype)]
