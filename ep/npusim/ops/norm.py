"""Normalizations and softmax. Kernels: :mod:`npu_sim.kernels.norm` (LRN is a pool-family
kernel: see :mod:`.pool`)."""

from __future__ import annotations

from ep.framework.graph import GraphView

from .catalogue import Op, register
from .rules import live_outputs


@register("BatchNormalization", since=7)
class BatchNormalization(Op):
    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Inference only: training_mode=0, spatial=1, no running mean/var outputs."""
        attrs = graph.attrs(i)
        if attrs.get("training_mode", 0):
            return "training_mode=1 not supported; only inference"
        if attrs.get("spatial", 1) != 1:
            return "spatial=0 not supported"
        # Before opset 14 the extra outputs select training mode (Y from batch statistics), so
        # they are declined even when nothing reads them.
        if len([o for o in graph.nodes[i].output if o]) > 1:
            return "running mean/var outputs not supported; only inference"
        return None


@register("LayerNormalization", since=17)
class LayerNormalization(Op):
    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Mean and InvStdDev outputs unread."""
        if len(live_outputs(graph, i)) > 1:
            return "Mean/InvStdDev outputs not supported (only when nothing reads them)"
        return None


@register("Softmax", "LogSoftmax", since=1)
class Softmax(Op):
    """Before opset 13 the op flattens to 2-D at ``axis``; from 13 it normalizes one axis."""

    opset_dependent = True
