"""Matrix products on the systolic array. Kernels: :mod:`npu_sim.kernels.gemm`."""

from __future__ import annotations

from .catalogue import Fusion, Op, Tiling, register


@register("MatMul", since=1)
class MatMul(Op):
    tiling = Tiling.GEMM
    fusion = Fusion.HOST


@register("Gemm", since=7)
class Gemm(Op):
    tiling = Tiling.GEMM
    fusion = Fusion.HOST
