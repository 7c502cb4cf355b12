"""Kernels: the code that computes the values of every op the compute cores run.

Kernels are JIT-compiled with numba (``cache=True``, compiled lazily on first use, so a model
only pays for the kernels it uses), or call BLAS through numpy where the work is a plain GEMM.
They follow the ONNX operator definitions (broadcasting, attributes and their defaults) and are
checked against onnxruntime's CPU provider. See :mod:`npu_sim.kernels.registry` for how a KERNEL
command finds them. Importing a kernel module registers its kernels. Kernels whose output shape
comes from input values (Expand, Pad, Resize, ConvTranspose, ...) check it against one size
limit before allocating: see :mod:`npu_sim.kernels.limits`.
"""

from . import (  # noqa: F401
    activations,
    conv,
    conv_transpose,
    elementwise,
    gemm,
    logic,
    norm,
    pool,
    quant,
    reduce,
    resize,
    shape,
)
from .registry import Kernel, kernel, lookup, names, register_kernel, unregister_kernel

__all__ = ["Kernel", "kernel", "lookup", "names", "register_kernel", "unregister_kernel"]
