"""Reductions and arg-reductions. Kernels: :mod:`npu_sim.kernels.reduce`."""

from __future__ import annotations

from .catalogue import NUMERIC, Op, register
from .rules import const


@register("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", since=1)
class Reduce(Op):
    const_inputs = const("axes")


@register("ArgMax", "ArgMin", since=1)
class ArgReduce(Op):
    dtypes = NUMERIC
    output_dtypes = ("int64",)
