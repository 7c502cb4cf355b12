"""Kernels: shape and data-movement ops (Reshape, Transpose, Concat, Split, Slice, Gather, Pad...).

These ops compute no new values; they choose which input elements land where. Most are views in
numpy (Reshape, Transpose, Slice, Split, Squeeze), so the kernel costs no copy on the host; the
device prices the data movement separately in the cost model.

Shape-like operands arrive as inputs in current opsets and as attributes in older ones (Slice
before 10, Split and Squeeze/Unsqueeze before 13, Pad before 11): every kernel accepts both, the
input taking precedence. Axes may be negative (counted from the end) everywhere ONNX allows it.
Split without ``split`` or ``num_outputs`` cannot know how many outputs the node has, so the
compiler passes ``num_outputs`` (the node's output count) for that case in every opset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import KernelError
from .activations import input_count, required
from .limits import check_elements, check_output_count
from .registry import kernel

Inputs = Sequence["np.ndarray | None"]


def normalize_axis(op: str, axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[-rank, rank)`` as a non-negative index, or :class:`KernelError`."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise KernelError(op, "", f"{what}={axis} is out of range for rank {rank}; expected "
                                  f"{-rank} <= {what} < {rank}" if rank else
                          f"{what}={axis} is invalid for a rank-0 tensor")
    return axis + rank if axis < 0 else axis


def normalize_axes(op: str, axes: Sequence[int], rank: int, what: str = "axes") -> list[int]:
    """Every axis normalized; repeated axes are a :class:`KernelError`."""
    out = [normalize_axis(op, a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise KernelError(op, "", f"{what}={list(axes)} repeats an axis")
    return out


def int_list(op: str, value: Any, what: str) -> list[int]:
    """A shape-like operand (1-D integer tensor or int sequence) as a list of Python ints."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or array.ndim > 1:
        raise KernelError(op, "", f"{what} must be a 1-D integer tensor, got {array.dtype} of "
                                  f"shape {array.shape}")
    return [int(v) for v in array.reshape(-1)]


def operand(op: str, inputs: Inputs, index: int, attrs: Mapping[str, Any], name: str
            ) -> list[int] | None:
    """An int-list operand given as input ``index`` (current opsets) or attribute ``name``."""
    if index < len(inputs) and inputs[index] is not None:
        return int_list(op, inputs[index], name)
    if name in attrs:
        return int_list(op, attrs[name], name)
    return None


@kernel("Reshape")
def reshape(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Reshape: 0 copies the input dim (unless ``allowzero``), one -1 is inferred."""
    input_count("Reshape", inputs, 1, 2)
    x = required("Reshape", inputs, 0, "data")
    shape = operand("Reshape", inputs, 1, attrs, "shape")  # attribute before opset 5
    if shape is None:
        raise KernelError("Reshape", "", "shape is required (input 1)")
    allowzero = int(attrs.get("allowzero", 0))
    if allowzero and 0 in shape and -1 in shape:
        raise KernelError("Reshape", "", f"shape={shape} has both 0 and -1 with allowzero=1")
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= x.ndim:
                raise KernelError("Reshape", "", f"shape={shape}: 0 at index {i} copies a "
                                                 f"dimension the rank-{x.ndim} input lacks")
            d = x.shape[i]
        elif d < -1:
            raise KernelError("Reshape", "", f"shape={shape} has invalid dimension {d}")
        out.append(d)
    if out.count(-1) > 1:
        raise KernelError("Reshape", "", f"shape={shape} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or x.size % known:
            raise KernelError("Reshape", "", f"cannot infer -1 in shape={shape} for input "
                                             f"shape {x.shape} ({x.size} elements)")
        out[out.index(-1)] = x.size // known
    check_elements("Reshape", "output", out)  # 0-sized shapes may name absurd dimensions
    if math.prod(out) != x.size:
        raise KernelError("Reshape", "", f"shape={shape} (-> {tuple(out)}) does not hold the "
                                         f"{x.size} elements of input shape {x.shape}")
    return [x.reshape(out)]


@kernel("Flatten")
def flatten(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Flatten: 2-D ``(prod(shape[:axis]), prod(shape[axis:]))``; ``axis`` in [-r, r]."""
    input_count("Flatten", inputs, 1, 1)
    x = required("Flatten", inputs, 0, "input")
    axis = int(attrs.get("axis", 1))
    if not -x.ndim <= axis <= x.ndim:
        raise KernelError("Flatten", "", f"axis={axis} is out of range; expected "
                                         f"{-x.ndim} <= axis <= {x.ndim}")
    axis = axis + x.ndim if axis < 0 else axis
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@kernel("Transpose")
def transpose(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Transpose by ``perm`` (default: reverse the axes)."""
    input_count("Transpose", inputs, 1, 1)
    x = required("Transpose", inputs, 0, "data")
    perm = [int(p) for p in attrs.get("perm", range(x.ndim - 1, -1, -1))]
    if sorted(perm) != list(range(x.ndim)):
        raise KernelError("Transpose", "", f"perm={perm} is not a permutation of "
                                           f"{list(range(x.ndim))}")
    return [x.transpose(perm)]


@kernel("Concat")
def concat(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Concat along ``axis`` (required); inputs agree in dtype and every other dim."""
    if not inputs:
        raise KernelError("Concat", "", "takes at least 1 input, got 0")
    arrays = [required("Concat", inputs, i, f"input {i}") for i in range(len(inputs))]
    if "axis" not in attrs:
        raise KernelError("Concat", "", "attribute 'axis' is required")
    first = arrays[0]
    axis = normalize_axis("Concat", attrs["axis"], first.ndim)
    for i, a in enumerate(arrays):
        if a.dtype != first.dtype:
            raise KernelError("Concat", "", f"input {i} dtype {a.dtype} differs from input 0 "
                                            f"dtype {first.dtype}")
        other = a.shape[:axis] + a.shape[axis + 1:]
        if a.ndim != first.ndim or other != first.shape[:axis] + first.shape[axis + 1:]:
            raise KernelError("Concat", "", f"input {i} shape {a.shape} does not match input 0 "
                                            f"shape {first.shape} outside axis {axis}")
    return [np.concatenate(arrays, axis=axis)]


@kernel("Split")
def split(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Split along ``axis`` by ``split`` sizes, or into ``num_outputs`` parts.

    ``num_outputs`` parts have size ``ceil(dim / n)``, the last one smaller (opset 18); before
    opset 18 (``_opset`` < 18) the parts must be equal.
    """
    input_count("Split", inputs, 1, 2)
    x = required("Split", inputs, 0, "input")
    axis = normalize_axis("Split", attrs.get("axis", 0), x.ndim)
    dim = x.shape[axis]
    sizes = operand("Split", inputs, 1, attrs, "split")
    if sizes is None:
        if "num_outputs" not in attrs:
            raise KernelError("Split", "", "needs split sizes (input 1 or attribute) or "
                                           "num_outputs (the number of node outputs)")
        n = check_output_count("Split", "num_outputs", int(attrs["num_outputs"]))
        if int(attrs.get("_opset", 18)) < 18 and dim % n:
            raise KernelError("Split", "", f"dimension {dim} of axis {axis} does not split "
                                           f"evenly into {n} outputs")
        # More parts than the axis has leaves the tail empty (ONNX: every part but the last has
        # ceil(dim / n); onnxruntime 1.32 runs it, older releases refused it).
        chunk = -(-dim // n)
        sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]
    if any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise KernelError("Split", "", f"split={sizes} must be non-negative and sum to dimension "
                                       f"{dim} of axis {axis}")
    return list(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _slice_bounds(dim: int, start: int, end: int, step: int) -> slice:
    """ONNX Slice clamping for one axis, as a Python slice."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return slice(start, end, step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, end if end >= 0 else None, step)


@kernel("Slice")
def slice_(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Slice: ``starts``/``ends``/``axes``/``steps`` (inputs, or attributes before opset 10).

    Negative starts/ends count from the end; out-of-range values clamp; negative steps walk
    backwards.
    """
    input_count("Slice", inputs, 1, 5)
    x = required("Slice", inputs, 0, "data")
    starts = operand("Slice", inputs, 1, attrs, "starts")
    ends = operand("Slice", inputs, 2, attrs, "ends")
    if starts is None or ends is None:
        raise KernelError("Slice", "", "starts and ends are required")
    axes = operand("Slice", inputs, 3, attrs, "axes")
    steps = operand("Slice", inputs, 4, attrs, "steps")
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise KernelError("Slice", "", f"starts={starts}, ends={ends}, axes={axes}, "
                                       f"steps={steps} must have equal lengths")
    if 0 in steps:
        raise KernelError("Slice", "", f"steps={steps} contains 0")
    index = [slice(None)] * x.ndim
    for axis, start, end, step in zip(normalize_axes("Slice", axes, x.ndim), starts, ends, steps,
                                      strict=True):
        index[axis] = _slice_bounds(x.shape[axis], start, end, step)
    return [x[tuple(index)]]


@kernel("Squeeze")
def squeeze(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Squeeze: drop the given size-1 ``axes`` (all size-1 axes when absent or empty)."""
    input_count("Squeeze", inputs, 1, 2)
    x = required("Squeeze", inputs, 0, "data")
    axes = operand("Squeeze", inputs, 1, attrs, "axes")
    if not axes:  # an empty axes tensor means "all", as onnxruntime reads it
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = normalize_axes("Squeeze", axes, x.ndim)
    for a in axes:
        if x.shape[a] != 1:
            raise KernelError("Squeeze", "", f"cannot squeeze axis {a} of size {x.shape[a]} in "
                                             f"shape {x.shape}; only size-1 axes")
    return [x.reshape([d for i, d in enumerate(x.shape) if i not in axes])]


@kernel("Unsqueeze")
def unsqueeze(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Unsqueeze: insert size-1 dims at ``axes`` (indices into the output shape)."""
    input_count("Unsqueeze", inputs, 1, 2)
    x = required("Unsqueeze", inputs, 0, "data")
    axes = operand("Unsqueeze", inputs, 1, attrs, "axes")
    if axes is None:
        raise KernelError("Unsqueeze", "", "axes are required (input 1, or attribute before "
                                           "opset 13)")
    rank = x.ndim + len(axes)
    axes = set(normalize_axes("Unsqueeze", axes, rank))
    dims = iter(x.shape)
    return [x.reshape([1 if i in axes else next(dims) for i in range(rank)])]


@kernel("Gather")
def gather(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Gather along ``axis``; negative indices count from the end, others out of range fail."""
    input_count("Gather", inputs, 2, 2)
    x = required("Gather", inputs, 0, "data")
    indices = required("Gather", inputs, 1, "indices")
    if indices.dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise KernelError("Gather", "", f"indices dtype {indices.dtype} is not supported; "
                                        f"expected int32 or int64")
    axis = normalize_axis("Gather", attrs.get("axis", 0), x.ndim)
    dim = x.shape[axis]
    bad = (indices < -dim) | (indices >= dim)
    if bad.any():
        value = int(indices[bad].reshape(-1)[0])
        raise KernelError("Gather", "", f"index {value} is out of range for axis {axis} of size "
                                        f"{dim}; expected {-dim} <= index < {dim}")
    return [np.asarray(np.take(x, indices.astype(np.int64) % dim if dim else indices, axis=axis))]


@kernel("Expand")
def expand(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Expand: broadcast ``input`` and ``shape`` together (either may be the larger)."""
    input_count("Expand", inputs, 2, 2)
    x = required("Expand", inputs, 0, "input")
    shape = int_list("Expand", required("Expand", inputs, 1, "shape"), "shape")
    check_elements("Expand", "target", shape)  # negative dims are invalid, not broadcastable
    try:
        out = np.broadcast_shapes(x.shape, tuple(shape))
    except ValueError:
        raise KernelError("Expand", "", f"input shape {x.shape} does not broadcast with "
                                        f"shape={shape}") from None
    check_elements("Expand", "output", out)
    return [np.broadcast_to(x, out).copy()]  # an owned, writable tensor, not a strided alias


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@kernel("Pad")
def pad(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Pad: ``pads`` = [begin per axis..., end per axis...]; negative pads crop.

    ``mode`` is constant (fill with ``constant_value``, default 0), reflect (mirror without the
    edge, so a pad must be smaller than the dim), edge (repeat the edge) or wrap. ``pads`` and
    the fill ``value`` are attributes before opset 11; ``axes`` (opset 18) limits the axes.
    """
    input_count("Pad", inputs, 1, 4)
    x = required("Pad", inputs, 0, "data")
    mode = attrs.get("mode", "constant")
    if mode not in _PAD_MODES:
        raise KernelError("Pad", "", f"mode={mode!r} is invalid; expected one of {_PAD_MODES}")
    pads = operand("Pad", inputs, 1, attrs, "pads")
    if pads is None:
        raise KernelError("Pad", "", "pads are required (input 1, or attribute before opset 11)")
    axes = operand("Pad", inputs, 3, {}, "axes")
    axes = list(range(x.ndim)) if axes is None else normalize_axes("Pad", axes, x.ndim)
    if len(pads) != 2 * len(axes):
        raise KernelError("Pad", "", f"pads={pads} must have {2 * len(axes)} values (begin and "
                                     f"end for each of {len(axes)} axes)")
    before, after = [0] * x.ndim, [0] * x.ndim
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + len(axes)]
    # Crop first (negative pads), then pad the remaining tensor.
    crop = tuple(slice(max(-b, 0), x.shape[a] - max(-e, 0))
                 for a, (b, e) in enumerate(zip(before, after, strict=True)))
    if any(c.start > c.stop for c in crop):
        raise KernelError("Pad", "", f"pads={pads} crop more than the input shape {x.shape}")
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(before, after, strict=True)]
    check_elements("Pad", f"output (pads={pads})",
                   [n + b + e for n, (b, e) in zip(x.shape, widths, strict=True)])
    if mode == "constant":
        return [np.pad(x, widths, constant_values=_pad_value(x, inputs, attrs))]
    for a, (b, e) in enumerate(widths):
        if (b or e) and x.shape[a] == 0:
            raise KernelError("Pad", "", f"mode={mode!r} cannot pad empty axis {a}")
        if mode == "reflect" and max(b, e) >= x.shape[a]:
            raise KernelError("Pad", "", f"mode='reflect' pads ({b}, {e}) on axis {a} must be "
                                         f"smaller than its size {x.shape[a]}")
    return [np.pad(x, widths, mode=mode)]


def _pad_value(x: np.ndarray, inputs: Inputs, attrs: Mapping[str, Any]) -> Any:
    value = inputs[2] if len(inputs) > 2 else None
    if value is None:
        return x.dtype.type(attrs.get("value", 0))
    value = np.asarray(value)
    if value.size > 1 or value.dtype != x.dtype:
        raise KernelError("Pad", "", f"constant_value must be one {x.dtype} element, got "
                                     f"{value.dtype} of shape {value.shape}")
    return value.reshape(-1)[0] if value.size else x.dtype.type(0)


@kernel("Shape")
def shape_of(inputs: Inputs, attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX Shape: the input's dimensions as int64, sliced by ``start``/``end`` (opset 15)."""
    input_count("Shape", inputs, 1, 1)
    x = required("Shape", inputs, 0, "data")
    rank = x.ndim
    start = int(attrs.get("start", 0))
    end = int(attrs.get("end", rank))
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [np.array(x.shape[start:end], dtype=np.int64)]
