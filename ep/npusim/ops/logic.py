"""Comparisons, logic and predicates: bool results. Kernels: :mod:`npu_sim.kernels.logic`."""

from __future__ import annotations

from .catalogue import ALL, BOOL, NUMERIC, Op, register


@register("Greater", "Less", "GreaterOrEqual", "LessOrEqual", since=7)
class Comparison(Op):
    dtypes = NUMERIC
    output_dtypes = BOOL
    typed_inputs = (0, 1)


@register("Equal", since=11)
class Equal(Op):
    dtypes = ALL
    output_dtypes = BOOL
    typed_inputs = (0, 1)


@register("And", "Or", "Xor", since=7)
class BinaryLogic(Op):
    dtypes = BOOL
    typed_inputs = (0, 1)


@register("Not", since=1)
class Not(Op):
    dtypes = BOOL


@register("IsNaN", "IsInf", since=10)
class FloatPredicate(Op):
    output_dtypes = BOOL
