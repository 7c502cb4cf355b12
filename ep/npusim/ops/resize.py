"""Resize. Kernels: :mod:`npu_sim.kernels.resize`."""

from __future__ import annotations

import numpy as np

from ep.framework.graph import GraphView

from .catalogue import Op, register
from .rules import const, nonempty, require_constant


def _nonempty_nearest_or_linear(graph: GraphView, i: int) -> str | None:
    if why := nonempty(graph, i):
        return why
    mode = graph.attrs(i).get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        return f"mode={mode} not supported; supported: nearest, linear"
    return None


@register("Resize", since=10)
class Resize(Op):
    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Non-empty input; mode nearest or linear; constant scales and sizes."""
        if why := _nonempty_nearest_or_linear(graph, i):
            return why
        inputs = graph.nodes[i].input
        named = [(1, "scales")] if graph.opset() < 11 else [(2, "scales"), (3, "sizes")]
        return require_constant(graph, inputs, named)


@register("Upsample", since=7)
class Upsample(Op):
    """Deprecated in opset 10 for Resize; scales are an attribute in opset 7-8, an input in 9."""

    until = 9
    const_inputs = const("scales")

    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Non-empty input; mode nearest or linear; scales >= 1; linear only over inner axes."""
        if why := _nonempty_nearest_or_linear(graph, i):
            return why
        inputs = graph.nodes[i].input
        value = graph.constant(inputs[1]) if len(inputs) > 1 else graph.attrs(i).get("scales")
        if value is None:
            return "scales must be given (an attribute before opset 9, an input from 9)"
        scales = [float(s) for s in np.asarray(value, dtype=np.float64).reshape(-1)]
        if min(scales, default=1.0) < 1:
            return f"scales={scales} not supported; every scale must be >= 1"
        # onnxruntime interpolates linearly over the inner axes only: 2-3 axes, or the last
        # two or three of a 4-D or 5-D input whose first two scales are 1.
        linear = graph.attrs(i).get("mode", "nearest") == "linear"
        if linear and len(scales) > 3 and scales[:2] != [1.0, 1.0]:
            return (f"mode=linear with scales={scales} not supported; a {len(scales)}-D input "
                    "needs its first two scales to be 1")
        return None
