"""Elementwise arithmetic and math, Where, Cast and the identity views. Kernels:
:mod:`npu_sim.kernels.elementwise`."""

from __future__ import annotations

from ep.framework.graph import GraphView

from .catalogue import ALL, FLOATS, Lowering, Op, register


@register("Add", "Sub", "Mul", "Div", since=7)
class Arithmetic(Op):
    dtypes = FLOATS + ("int32", "int64")


@register("Pow", since=7)
class Pow(Op):
    pass


@register("Sqrt", "Exp", "Log", "Reciprocal", since=6)
class FloatMath(Op):
    pass


@register("Sin", "Cos", since=7)
class Trigonometry(Op):
    pass


@register("Floor", "Ceil", since=6)
class Rounding(Op):
    pass


@register("Round", since=11)
class Round(Op):
    pass


@register("Neg", "Abs", since=6)
class SignedUnary(Op):
    dtypes = FLOATS + ("int8", "int32", "int64")


@register("Min", "Max", since=8)
class MinMax(Op):
    dtypes = FLOATS + ("int32", "int64")


@register("Sum", "Mean", since=8)
class SumMean(Op):
    pass


@register("Where", since=9)
class Where(Op):
    dtypes = ALL
    typed_inputs = (1, 2)


@register("Cast", since=6)
class Cast(Op):
    dtypes = ALL


@register("Identity", since=1)
class Identity(Op):
    dtypes = ALL
    lowering = Lowering.VIEW


@register("Dropout", since=7)
class Dropout(Op):
    """Inference only: the output is the input, the mask (when read) all true."""

    lowering = Lowering.VIEW

    @staticmethod
    def check(graph: GraphView, i: int) -> str | None:
        """Inference only: training_mode absent or a constant false."""
        inputs = graph.nodes[i].input
        if len(inputs) > 2 and inputs[2]:
            mode = graph.constant(inputs[2])
            if mode is None or bool(mode):
                return "training_mode must be a constant false"
        return None
