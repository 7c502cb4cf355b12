"""Activations: standalone ops, and (most of them) fused into the array op producing their
input. Kernels: :mod:`npu_sim.kernels.activations`."""

from __future__ import annotations

import numpy as np

from ep.framework.graph import GraphView

from .catalogue import FLOATS, Fusion, Op, register
from .rules import const


@register("Relu", since=6)
class Relu(Op):
    dtypes = FLOATS + ("int8", "int32", "int64")
    fusion = Fusion.ACTIVATION


@register("Sigmoid", "HardSigmoid", "Tanh", "LeakyRelu", since=6)
class FloatActivation(Op):
    fusion = Fusion.ACTIVATION


@register("HardSwish", since=14)
class HardSwish(Op):
    fusion = Fusion.ACTIVATION


@register("Gelu", since=20)
class Gelu(Op):
    fusion = Fusion.ACTIVATION


@register("Clip", since=6)
class Clip(Op):
    const_inputs = const("min", "max")
    fusion = Fusion.ACTIVATION

    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """No constant NaN bound (onnxruntime's result differs)."""
        for tensor in graph.nodes[i].input[1:3]:
            bound = graph.constant(tensor) if tensor else None
            if bound is not None and np.isnan(bound.astype(np.float64)).any():
                return "a NaN min/max bound is not supported (onnxruntime's result is kept)"
        return None


@register("PRelu", since=7)
class PRelu(Op):
    pass


@register("Erf", since=9)
class Erf(Op):
    """A plain math function (Gelu's building block), not an activation a producer fuses."""
