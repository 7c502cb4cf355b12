"""Convolutions on the systolic array (im2col GEMMs). Kernels: :mod:`npu_sim.kernels.conv`."""

from __future__ import annotations

from .catalogue import Fusion, Op, Tiling, register
from .rules import spatial


@register("Conv", "ConvTranspose", since=1)
class Conv(Op):
    tiling = Tiling.CONV
    fusion = Fusion.HOST
    check = spatial
