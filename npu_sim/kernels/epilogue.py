"""Kernels' side of fused epilogues (format: :mod:`npu_sim.epilogue`).

An array kernel (Conv, ConvTranspose, Gemm, MatMul) computes its float32 result in a buffer of
its own, applies its fused activation, then :func:`apply_epilogue` runs the steps in place on
that buffer before the one rounding to the output dtype. Each step does what its standalone
kernel does, in float32 and in the same order, so the fused launch gives the unfused values:
an activation through :func:`~.activations.apply_activation`, a gate as the activation into a
temporary and one multiply, a binary step as one numpy ufunc with broadcasting. The gates of
float32 outputs run fused loops that round the gate to float32 before the multiply, as the two
kernels do: hard-sigmoid (hard-swish as torch exports it) and sigmoid (SiLU, :mod:`.mlas`)
each in one numba loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..epilogue import Step, decode
from ..errors import KernelError
from .activations import apply_activation, full_params, hard_sigmoid_gate
from .gemm import broadcasts_to
from .mlas import silu

UFUNCS = {"Add": np.add, "Mul": np.multiply}
"""The binary epilogue steps' ufuncs."""


def apply_epilogue(op: str, y: np.ndarray, attrs: Mapping[str, Any],
                   inputs: Sequence[np.ndarray | None],
                   steps: Sequence[Step] | None = None) -> np.ndarray:
    """``y`` (the kernel's own float32 buffer) after the epilogue in ``attrs`` (``steps``: it
    decoded already, by a launch prepared once); in place where the step allows. Operands must
    be float arrays broadcasting to ``y``'s shape."""
    for step in decode(op, attrs) if steps is None else steps:
        fast = y.dtype == np.float32 and y.flags.c_contiguous and y.flags.writeable
        if step.operand >= 0:
            other = inputs[step.operand] if step.operand < len(inputs) else None
            if other is None:
                raise KernelError(op, "", f"epilogue step {step.op} reads input {step.operand}, "
                                          f"which is missing ({len(inputs)} inputs)")
            if not broadcasts_to(other.shape, y.shape) or other.dtype.kind != "f":
                raise KernelError(op, "", f"epilogue operand {step.operand} of shape "
                                          f"{other.shape}, dtype {other.dtype} must be float and "
                                          f"broadcast to the output {y.shape}")
            with np.errstate(all="ignore"):
                UFUNCS[step.op](y, other.astype(y.dtype, copy=False), out=y)
        elif step.gate and step.op == "HardSigmoid" and fast:
            alpha, beta = full_params("HardSigmoid", step.params)
            hard_sigmoid_gate(y.reshape(-1), alpha, beta)
        elif step.gate and step.op == "Sigmoid" and y.dtype == np.float32:
            if not fast:  # a strided or read-only buffer: onto a copy of it
                y = y.copy()
            silu(y.reshape(-1))
        elif step.gate:
            gate = apply_activation(y, step.op, step.params)
            if step.op == "Sigmoid":  # a gate of at most 1 (float32 takes silu above)
                np.minimum(gate, 1, out=gate)
            with np.errstate(all="ignore"):
                np.multiply(y, gate, out=y)
        else:
            y = apply_activation(y, step.op, step.params, inplace=True)
    return y
