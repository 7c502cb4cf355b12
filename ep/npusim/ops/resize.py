"""Resize. Kernels: :mod:`npu_sim.kernels.resize`."""

from __future__ import annotations

from ep.framework.graph import GraphView

from .catalogue import Op, register
from .rules import nonempty, require_constant


@register("Resize", since=10)
class Resize(Op):
    def check(graph: GraphView, i: int) -> str | None:
        if why := nonempty(graph, i):
            return why
        mode = graph.attrs(i).get("mode", "nearest")
        if mode not in ("nearest", "linear"):
            return f"mode={mode} not supported; supported: nearest, linear"
        inputs = graph.nodes[i].input
        named = [(1, "scales")] if graph.opset() < 11 else [(2, "scales"), (3, "sizes")]
        return require_constant(graph, inputs, named)

