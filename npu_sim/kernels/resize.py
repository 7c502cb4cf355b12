"""Kernels: Resize (and its predecessor Upsample), nearest and N-linear.

Resizing is separable: every output coordinate along an axis maps back to a coordinate in the
input (the ``coordinate_transformation_mode``), independently of the other axes. Nearest mode
rounds that coordinate (``nearest_mode``) and gathers once with an outer-product index; linear
mode blends the two neighbours along each axis in turn, which composes to bilinear, trilinear or
N-linear interpolation. Coordinates are computed in float32 in the same order onnxruntime
computes them, so ties in nearest mode round the same way.

Inputs are accepted in every opset's form: ``(X, roi, scales, sizes)`` (opset 11+),
``(X, scales)`` (Resize-10 and Upsample-9, asymmetric coordinates with onnxruntime's legacy
nearest rounding), or a ``scales`` attribute (Upsample-7).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import KernelError
from .gemm import FLOAT_DTYPES
from .limits import check_elements
from .registry import kernel

_Transform = Callable[[np.ndarray, np.float32, int, int, np.ndarray], np.ndarray]

# Each maps output coordinates x (float32) back to the input: (x, scale, in_len, out_len, roi).
_TRANSFORMS: dict[str, _Transform] = {
    "half_pixel": lambda x, s, i, o, r: (x + np.float32(0.5)) / s - np.float32(0.5),
    # onnxruntime adds the float32 offset to a float64 tail (its 0.5 literals are doubles)
    "half_pixel_symmetric": lambda x, s, i, o, r: (
        np.float32(i / 2) * (np.float32(1) - np.float32(o) / (s * np.float32(i)))
        + ((x.astype(np.float64) + 0.5) / np.float64(s) - 0.5)
    ).astype(np.float32),
    "pytorch_half_pixel": lambda x, s, i, o, r: (
        (x + np.float32(0.5)) / s - np.float32(0.5) if o > 1 else np.zeros_like(x)
    ),
    "align_corners": lambda x, s, i, o, r: (
        x * np.float32(i - 1) / np.float32(o - 1) if o > 1 else np.zeros_like(x)
    ),
    "asymmetric": lambda x, s, i, o, r: x / s,
    "tf_half_pixel_for_nn": lambda x, s, i, o, r: (x + np.float32(0.5)) / s,
    "tf_crop_and_resize": lambda x, s, i, o, r: (
        r[0] * np.float32(i - 1) + x * (r[1] - r[0]) * np.float32(i - 1) / np.float32(o - 1)
        if o > 1
        else np.full_like(x, np.float32(0.5) * (r[0] + r[1]) * np.float32(i - 1))
    ),
}

#: onnxruntime rounds a float32 coordinate within this of a half as the half itself (3.4999998,
#: 7 / (2/7) in float32, is 3.5 to ``round_prefer_ceil``; 11.500001 is 11.5 to
#: ``round_prefer_floor``). Measured on onnxruntime 1.31.1 and 1.32.0, both nearest rounding
#: modes, every input length and output size of 1 to 48 and every coordinate transformation
#: but the deprecated ``tf_half_pixel_for_nn``: 1e-6 gives its indices in every case, 5e-7 and
#: 2e-6 do not (its public source's exact comparison missed 168 of those 23,040 cases).
HALF_TOLERANCE = 1e-6


def _halves(x: np.ndarray, prefer_ceil: bool) -> np.ndarray:
    """``x`` rounded to the nearest integer, a value within :data:`HALF_TOLERANCE` of a half
    going up (``prefer_ceil``) or down (float64: ``x + 0.5`` cannot round across an integer)."""
    x = x.astype(np.float64)
    low = np.floor(x)
    half = np.abs(x - low - 0.5) <= HALF_TOLERANCE
    nearest = np.floor(x + 0.5) if prefer_ceil else np.ceil(x - 0.5)
    return np.where(half, low + 1 if prefer_ceil else low, nearest)


_NEAREST: dict[str, Callable[[np.ndarray, bool], np.ndarray]] = {
    "round_prefer_floor": lambda x, down: _halves(x, prefer_ceil=False),
    "round_prefer_ceil": lambda x, down: _halves(x, prefer_ceil=True),
    "floor": lambda x, down: np.floor(x),
    "ceil": lambda x, down: np.ceil(x),
    # onnxruntime's rule before opset 11: ceil when downsampling, else truncate
    "simple": lambda x, down: np.ceil(x) if down else np.trunc(x),
}


def _present(value: np.ndarray | None) -> bool:
    return value is not None and value.size > 0


def _parse_inputs(
    op: str, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, bool]:
    """``(x, roi, scales, sizes, legacy)`` from any opset's input form."""
    if not inputs or inputs[0] is None:
        raise KernelError(op, "", "needs input X")
    x = inputs[0]
    if "scales" in attrs:
        return x, None, np.asarray(attrs["scales"], np.float32), None, True
    if len(inputs) == 2:
        return x, None, inputs[1], None, True
    roi = inputs[1] if len(inputs) > 1 else None
    scales = inputs[2] if len(inputs) > 2 else None
    sizes = inputs[3] if len(inputs) > 3 else None
    return x, roi, scales, sizes, False


def _axes(op: str, attrs: Mapping[str, Any], rank: int) -> list[int]:
    axes = [int(a) for a in attrs.get("axes", range(rank))]
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        raise KernelError(op, "", f"axes={axes} must be distinct axes of a rank-{rank} input")
    return [a % rank for a in axes]


def _out_geometry(
    op: str,
    x: np.ndarray,
    scales: np.ndarray | None,
    sizes: np.ndarray | None,
    axes: list[int],
    attrs: Mapping[str, Any],
) -> tuple[list[int], list[np.float32]]:
    """Output length and scale for every axis of ``x``."""
    rank = x.ndim
    out = list(x.shape)
    scale = [np.float32(1.0)] * rank
    if _present(sizes):
        sz = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(sz) != len(axes) or any(v < 1 for v in sz):
            raise KernelError(op, "", f"sizes={sz} must hold {len(axes)} positive lengths")
        empty = [a for a in axes if x.shape[a] == 0]
        if empty:
            raise KernelError(op, "", f"sizes={sz} cannot resize axis {empty[0]} of input shape "
                                      f"{x.shape}: it is empty; resized axes need length >= 1")
        policy = str(attrs.get("keep_aspect_ratio_policy", "stretch"))
        ratios = [np.float32(v) / np.float32(x.shape[a]) for v, a in zip(sz, axes, strict=True)]
        if policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                out[a] = int(np.floor(np.float64(common) * x.shape[a] + 0.5))
                scale[a] = np.float32(common)
            return out, scale
        if policy != "stretch":
            raise KernelError(
                op,
                "",
                f"keep_aspect_ratio_policy={policy!r}; expected stretch, not_larger or not_smaller",
            )
        for a, v, r in zip(axes, sz, ratios, strict=True):
            out[a], scale[a] = v, r
        return out, scale
    if not _present(scales):
        raise KernelError(op, "", "needs either scales or sizes")
    sc = np.asarray(scales, np.float32).reshape(-1)
    if sc.size != len(axes) or not np.all(sc > 0):
        raise KernelError(op, "", f"scales={sc.tolist()} must hold {len(axes)} positive values")
    # The output length ignores roi, as onnxruntime and the ONNX reference do.
    for a, s in zip(axes, sc, strict=True):
        with np.errstate(over="ignore"):  # an overflow to inf is reported just below
            length = np.floor(np.float32(x.shape[a]) * s)
        if not np.isfinite(length):
            raise KernelError(op, "", f"scale {float(s)} on axis {a} of length {x.shape[a]} "
                                      f"gives no finite output length; scales must be finite")
        out[a], scale[a] = int(length), np.float32(s)
        if out[a] < 1:
            raise KernelError(
                op, "", f"scale {float(s)} leaves axis {a} of length {x.shape[a]} empty"
            )
    return out, scale


def resize(op: str, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """Resize ``X`` as ONNX Resize (any opset's form) or Upsample does."""
    x, roi, scales, sizes, legacy = _parse_inputs(op, inputs, attrs)
    mode = str(attrs.get("mode", "nearest"))
    if mode == "cubic":
        raise KernelError(op, "", "mode=cubic not supported; supported modes: nearest, linear")
    if mode not in ("nearest", "linear", "bilinear"):
        raise KernelError(op, "", f"mode={mode!r}; expected nearest or linear")
    if int(attrs.get("antialias", 0)):
        raise KernelError(op, "", "antialias=1 not supported")
    if x.ndim < 1:
        raise KernelError(op, "", "X must have rank >= 1")
    axes = _axes(op, attrs, x.ndim)
    ctm = "asymmetric" if legacy else str(attrs.get("coordinate_transformation_mode", "half_pixel"))
    if ctm not in _TRANSFORMS:
        raise KernelError(
            op, "", f"coordinate_transformation_mode={ctm!r}; expected one of {list(_TRANSFORMS)}"
        )
    nearest_mode = "simple" if legacy else str(attrs.get("nearest_mode", "round_prefer_floor"))
    if nearest_mode not in _NEAREST:
        raise KernelError(
            op,
            "",
            f"nearest_mode={nearest_mode!r}; expected one of "
            f"{[m for m in _NEAREST if m != 'simple']}",
        )
    crop = ctm == "tf_crop_and_resize"
    rois = np.zeros((2, len(axes)), np.float32)
    rois[1] = 1
    if crop:
        if not _present(roi) or roi.size != 2 * len(axes):
            raise KernelError(op, "", f"tf_crop_and_resize needs roi with {2 * len(axes)} values")
        rois = np.asarray(roi, np.float32).reshape(2, len(axes))
    out, scale = _out_geometry(op, x, scales, sizes, axes, attrs)
    check_elements(op, "output", out)
    roi_of = {a: rois[:, k] for k, a in enumerate(axes)}
    coords, outside = [], []
    for a in range(x.ndim):
        xs = np.arange(out[a], dtype=np.float32)
        untouched = scale[a] == 1 and out[a] == x.shape[a]
        if untouched and (not crop or (a in roi_of and tuple(roi_of[a]) == (0, 1))):
            roi_of.pop(a, None)
        if a not in roi_of:  # an axis resize leaves alone keeps its coordinates
            coords.append(xs)
            outside.append(None)
            continue
        c = np.asarray(_TRANSFORMS[ctm](xs, scale[a], x.shape[a], out[a], roi_of[a]), np.float32)
        coords.append(c)
        outside.append((c < 0) | (c > x.shape[a] - 1) if crop else None)
    if mode == "nearest":
        idx = [
            np.clip(_NEAREST[nearest_mode](c, bool(s < 1)), 0, n - 1).astype(np.intp)
            for c, s, n in zip(coords, scale, x.shape, strict=True)
        ]
        y = x[np.ix_(*idx)]
    else:
        if x.dtype not in FLOAT_DTYPES:
            raise KernelError(op, "", f"linear mode needs a float input, got {x.dtype}")
        y = x.astype(np.float32)
        for a, (c, n) in enumerate(zip(coords, x.shape, strict=True)):
            y = _lerp_axis(y, a, c, n)
    if crop:
        extrapolation = np.float32(attrs.get("extrapolation_value", 0.0))
        mask = np.zeros(y.shape, bool)
        for a, o in enumerate(outside):
            if o is not None:
                mask |= o.reshape([-1 if k == a else 1 for k in range(y.ndim)])
        y = np.where(mask, extrapolation, y)
    return np.ascontiguousarray(y.astype(x.dtype, copy=False))


def _lerp_axis(y: np.ndarray, axis: int, coords: np.ndarray, n: int) -> np.ndarray:
    """Blend the two input neighbours of each coordinate along ``axis`` (edge-clamped)."""
    c = np.clip(coords, np.float32(0), np.float32(n - 1))
    lo = np.minimum(c.astype(np.intp), n - 1)
    hi = np.minimum(lo + 1, n - 1)
    w_hi = c - lo.astype(np.float32)
    if len(c) == n and np.array_equal(lo, np.arange(n)) and not np.any(w_hi[hi != lo]):
        return y  # identity along this axis
    shape = [-1 if k == axis else 1 for k in range(y.ndim)]
    w_hi = np.where(lo == hi, np.float32(0), w_hi).reshape(shape)
    w_lo = (np.float32(1) - w_hi).reshape(shape)
    return np.take(y, lo, axis=axis) * w_lo + np.take(y, hi, axis=axis) * w_hi


@kernel("Resize")
def resize_kernel(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX Resize: nearest (every nearest_mode) or linear, from scales or sizes."""
    return [resize("Resize", inputs, attrs)]


@kernel("Upsample")
def upsample_kernel(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX Upsample (deprecated): Resize with asymmetric coordinates, scales as input or
    attribute."""
    if "scales" not in attrs and len(inputs) != 2:
        raise KernelError("Upsample", "", "needs X and scales (input or attribute)")
    return [resize("Upsample", inputs, attrs)]
