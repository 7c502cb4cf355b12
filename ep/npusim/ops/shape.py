"""Data movement and shapes: views, copies, and the constant generators the compiler folds.
Kernels: :mod:`npu_sim.kernels.shape`."""

from __future__ import annotations

from ep.framework.graph import GraphView

from .catalogue import ALL, Lowering, Op, register
from .rules import const


@register("Reshape", since=5)
class Reshape(Op):
    dtypes = ALL
    const_inputs = const("shape")
    lowering = Lowering.VIEW

    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """allowzero=1 only without a 0 in shape for a non-empty input."""
        node = graph.nodes[i]
        if not graph.attrs(i).get("allowzero", 0) or len(node.input) < 2:
            return None
        target = graph.constant(node.input[1])
        _, shape = graph.tensor_type(node.input[0])
        if target is not None and 0 in target.tolist() and shape is not None and 0 not in shape:
            return ("allowzero=1 with a 0 in shape for a non-empty input: no element count "
                    "matches")
        return None


@register("Flatten", since=1)
class Flatten(Op):
    dtypes = ALL
    lowering = Lowering.VIEW


@register("Squeeze", "Unsqueeze", since=1)
class SqueezeUnsqueeze(Op):
    dtypes = ALL
    const_inputs = const("axes")
    lowering = Lowering.VIEW


@register("Transpose", "Concat", "Gather", since=1)
class Copy(Op):
    dtypes = ALL


@register("Split", since=2)
class Split(Op):
    """Without ``split``, parts may be uneven from opset 18 only: the kernel needs the opset."""

    dtypes = ALL
    const_inputs = const("split")
    opset_dependent = True


@register("Slice", since=10)
class Slice(Op):
    dtypes = ALL
    const_inputs = const("starts", "ends", "axes", "steps")


@register("Expand", since=8)
class Expand(Op):
    dtypes = ALL
    const_inputs = const("shape")


@register("Pad", since=11)
class Pad(Op):
    dtypes = ALL
    const_inputs = ((1, "pads"), (3, "axes"))


@register("Shape", since=1)
class Shape(Op):
    dtypes = ALL
    output_dtypes = ("int64",)


@register("Constant", since=1)
class Constant(Op):
    dtypes = ALL
    typed_inputs = ()
    lowering = Lowering.FOLD


@register("ConstantOfShape", since=9)
class ConstantOfShape(Op):
    dtypes = ALL
    typed_inputs = ()
    const_inputs = const("input", start=0)
    lowering = Lowering.FOLD
