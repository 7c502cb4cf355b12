"""Pools and LRN. Kernels: :mod:`npu_sim.kernels.pool`."""

from __future__ import annotations

from ep.framework.graph import GraphView

from .catalogue import FLOATS, Op, register
from .rules import live_outputs, spatial

CEIL_DISAGREES = "shape inference and onnxruntime disagree on the output shape"
"""The end of the reason a ceil_mode pool is declined for (the capability check follows it
downstream: a node fed by such a pool would be compiled for a shape it never receives)."""


def pool_check(graph: GraphView, i: int) -> str | None:
    """Input rank 3 to 5; no negative SAME padding; with ceil_mode=1, no last window starting
    in the end padding."""
    if why := spatial(graph, i):
        return why
    attrs = graph.attrs(i)
    _, shape = graph.tensor_type(graph.nodes[i].input[0])
    if why := _negative_same_pad(attrs, shape):
        return why
    if not attrs.get("ceil_mode", 0) or shape is None or attrs.get("auto_pad", "NOTSET") not in (
            "NOTSET", "VALID"):
        return None
    dims = list(shape[2:])
    kernel = list(attrs.get("kernel_shape", []))
    strides = list(attrs.get("strides", [1] * len(dims)))
    dilations = list(attrs.get("dilations", [1] * len(dims)))
    pads = list(attrs.get("pads", [0] * 2 * len(dims)))
    for k, size in enumerate(dims):
        if not isinstance(size, int) or k >= len(kernel):
            continue
        extent = (kernel[k] - 1) * dilations[k] + 1
        span = size + pads[k] + pads[k + len(dims)] - extent
        out = -(-span // strides[k]) + 1
        if span >= 0 and (out - 1) * strides[k] >= size + pads[k]:
            return f"ceil_mode=1 with a last window starting in the end padding: {CEIL_DISAGREES}"
    return None


def _negative_same_pad(attrs: dict, shape) -> str | None:
    """auto_pad SAME_* with a stride wider than the window can leave nothing to pad: the
    padding onnxruntime computes is negative and it refuses the node."""
    if attrs.get("auto_pad", "NOTSET") not in ("SAME_UPPER", "SAME_LOWER") or shape is None:
        return None
    kernel = list(attrs.get("kernel_shape", []))
    strides = list(attrs.get("strides", [1] * len(kernel)))
    for k, size in enumerate(shape[2:]):
        if isinstance(size, int) and k < len(kernel):
            needed = (-(-size // strides[k]) - 1) * strides[k] + kernel[k] - size
            if needed < 0:
                return (f"auto_pad={attrs['auto_pad']} with kernel {kernel[k]}, stride "
                        f"{strides[k]} on size {size} needs padding {needed}: onnxruntime "
                        "refuses negative padding")
    return None


@register("MaxPool", since=1)
class MaxPool(Op):
    dtypes = FLOATS + ("int8", "uint8")

    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Indices output unread; otherwise as AveragePool."""
        if len(live_outputs(graph, i)) > 1:
            return "the Indices output is not supported (only when nothing reads it)"
        return pool_check(graph, i)


@register("AveragePool", since=1)
class AveragePool(Op):
    check = pool_check


@register("GlobalAveragePool", "GlobalMaxPool", since=1)
class GlobalPool(Op):
    check = spatial


@register("LRN", since=1)
class LRN(Op):
    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Rank-4 input; an odd size of at most 2 * channels + 1."""
        size = graph.attrs(i).get("size")
        _, shape = graph.tensor_type(graph.nodes[i].input[0])
        if not isinstance(size, int) or size < 1 or size % 2 == 0:
            return f"size={size} not supported; size must be a positive odd integer"
        if shape is not None and len(shape) != 4:
            return f"input rank {len(shape)} not supported; LRN takes (N, C, H, W)"
        channels = shape[1] if shape is not None else None
        if isinstance(channels, int) and size > 2 * channels + 1:
            return (f"size={size} wider than the {channels} channels (at most "
                    f"{2 * channels + 1} is meaningful)")
        return None
