"""Quantization and the integer array ops. Kernels: :mod:`npu_sim.kernels.quant`."""

from __future__ import annotations

from .catalogue import FLOATS, Op, Tiling, register
from .rules import spatial


@register("QuantizeLinear", since=10)
class QuantizeLinear(Op):
    dtypes = FLOATS + ("int8", "uint8")


@register("DequantizeLinear", since=10)
class DequantizeLinear(Op):
    dtypes = FLOATS + ("int8", "uint8", "int32")


@register("QLinearConv", since=10)
class QLinearConv(Op):
    """Inputs x, x_scale, x_zero_point, w, ...: the weights are input 3."""

    dtypes = ("int8", "uint8")
    typed_inputs = (0, 3)
    tiling = Tiling.CONV
    weight_input = 3
    check = spatial


@register("QLinearMatMul", since=10)
class QLinearMatMul(Op):
    dtypes = ("int8", "uint8")
    typed_inputs = (0, 3)
    tiling = Tiling.GEMM


@register("MatMulInteger", since=10)
class MatMulInteger(Op):
    dtypes = ("int8", "uint8", "int32")
    typed_inputs = (0, 1)
    tiling = Tiling.GEMM


@register("ConvInteger", since=10)
class ConvInteger(Op):
    dtypes = ("int8", "uint8", "int32")
    typed_inputs = (0, 1)
    tiling = Tiling.CONV
    check = spatial
