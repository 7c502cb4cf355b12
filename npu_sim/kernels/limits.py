"""The size limit on tensors whose shape a kernel computes from values.

Most kernels produce outputs as large as their inputs, so a tensor that exists bounds them. A few
take their output shape from the *values* of an input or attribute: Expand's ``shape``, Pad's
``pads``, Resize's ``sizes`` and ``scales`` (and Upsample's), ConvTranspose's ``strides``,
``dilations`` and ``output_shape``, and the ``pads``, ``strides``, ``dilations`` and
``kernel_shape`` of Conv and the pools (which also size Conv's padded input and im2col
scratch). A corrupt or hostile graph can ask those for terabytes. Before allocating, they call
:func:`check_elements`, which raises :class:`npu_sim.errors.KernelError` naming the op, the shape
and the limit, so bad input fails as a typed error instead of numpy's ``MemoryError`` (or an
allocation that takes the host down).

The limit is :data:`MAX_ELEMENTS` elements per tensor (and per dimension), whatever the dtype:
``2**31 - 1``, the largest count a signed 32-bit element index covers (8 GiB of float32, half
the HBM of the ``npu-m`` preset). It is read at call time, so a test may lower it.

Split takes its *number* of outputs from an attribute (``num_outputs``); even empty outputs cost
memory when there are billions of them, so :func:`check_output_count` bounds that count by
:data:`MAX_OUTPUTS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import KernelError

#: Most elements one tensor built from input values may hold (also the largest dimension).
MAX_ELEMENTS = 2**31 - 1

#: Most outputs a kernel may be asked for by an attribute (far above any real graph's fan-out).
MAX_OUTPUTS = 2**16


def check_elements(op: str, what: str, shape: Sequence[int]) -> tuple[int, ...]:
    """``shape`` as a tuple of ints, checked before a tensor of that shape is allocated.

    Raises :class:`KernelError` if a dimension is negative, or a dimension or the element count
    exceeds :data:`MAX_ELEMENTS`. ``what`` names the tensor in the message (``"output"``,
    ``"padded input"``). Zero-sized dimensions are valid: ONNX allows empty tensors.
    """
    dims = tuple(int(d) for d in shape)
    for d in dims:
        if d < 0:
            raise KernelError(op, "", f"{what} shape {list(dims)} has negative dimension {d}; "
                                      f"dimensions must be >= 0")
    count = math.prod(dims)
    if max(dims, default=0) > MAX_ELEMENTS or count > MAX_ELEMENTS:
        raise KernelError(op, "", f"{what} shape {list(dims)} would hold {count} elements "
                                  f"(largest dimension {max(dims)}); at most {MAX_ELEMENTS} "
                                  f"elements and dimension size (npu_sim.kernels.limits)")
    return dims


def check_output_count(op: str, what: str, count: int) -> int:
    """``count`` outputs requested through ``what``, checked against :data:`MAX_OUTPUTS`."""
    if not 1 <= count <= MAX_OUTPUTS:
        raise KernelError(op, "", f"{what}={count} is out of range; expected 1 to {MAX_OUTPUTS} "
                                  f"outputs (npu_sim.kernels.limits)")
    return count
