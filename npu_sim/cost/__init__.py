"""The cycle cost model: how long a kernel launch takes, from shapes alone.

Values and timing are separate. A kernel computes numbers and never reads the clock; this model
prices a launch from its :class:`~npu_sim.dtypes.TensorSpec` operands (shape and dtype), its
ONNX attributes and the :class:`~npu_sim.config.DeviceConfig`, and never touches tensor data.

- Convolutions and matrix products run on the systolic array: stall-free folds of the
  configured dataflow (:func:`gemm_cycles`, :func:`conv_cycles`), split over cores.
- Everything else runs on the vector unit (elements / lanes times a per-op factor), is a
  memory-bound copy, or is a view that moves nothing.
- Memory: bytes between HBM and SRAM at the HBM bandwidth, double-buffered against compute;
  operands that do not fit SRAM are re-fetched, and the :class:`Cost` says so.

:func:`op_cost` is the entry point; ``docs/cost_model.md`` derives every formula.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import DeviceConfig
from ..dtypes import TensorSpec
from ..errors import KernelError
from .array_ops import ARRAY_OPS
from .model import Cost
from .systolic import conv_cycles, gemm_cycles
from .vector_ops import VECTOR_OPS

__all__ = ["Cost", "KNOWN_OPS", "conv_cycles", "gemm_cycles", "op_cost"]

_HANDLERS = {**ARRAY_OPS, **VECTOR_OPS}
KNOWN_OPS: tuple[str, ...] = tuple(sorted(_HANDLERS))
"""ONNX op types :func:`op_cost` can price."""


def op_cost(
    config: DeviceConfig,
    op_type: str,
    inputs: Sequence[TensorSpec | None],
    outputs: Sequence[TensorSpec],
    attrs: Mapping[str, Any],
    cores: int | None = None,
) -> Cost:
    """Price one launch of ``op_type`` on ``cores`` cores (default: all of ``config.cores``).

    ``inputs`` may hold ``None`` for omitted optional inputs; ``attrs`` are the node's ONNX
    attributes as plain Python values (ONNX defaults apply to missing ones). An op without a
    cost model, or operands the op cannot take, raise :class:`~npu_sim.errors.KernelError`.
    Results are cached per (config, op, specs, attrs, cores).
    """
    ncores = config.cores if cores is None else cores
    if isinstance(ncores, bool) or not isinstance(ncores, int) or not 1 <= ncores <= config.cores:
        raise KernelError(str(op_type), "", f"cores={cores!r} is invalid; expected an integer "
                                            f"in [1, {config.cores}]")
    if op_type not in _HANDLERS:
        raise KernelError(str(op_type), "", f"no cost model; known: {', '.join(KNOWN_OPS)}")
    key_attrs = _freeze(attrs)
    if key_attrs is None:  # an attribute value we cannot hash: price without the cache
        return _HANDLERS[op_type](config, op_type, tuple(inputs), tuple(outputs), attrs, ncores)
    return _cached(config, op_type, tuple(inputs), tuple(outputs), key_attrs, ncores)


@functools.lru_cache(maxsize=8192)
def _cached(config, op_type, inputs, outputs, attrs, cores) -> Cost:
    return _HANDLERS[op_type](config, op_type, inputs, outputs, dict(attrs), cores)


def _freeze(attrs: Mapping[str, Any]) -> tuple | None:
    """A hashable form of ``attrs`` (lists become tuples), or None if a value is not hashable."""
    items = []
    for name, value in attrs.items():
        if isinstance(value, list):
            value = tuple(value)
        elif hasattr(value, "tolist"):  # numpy scalars and arrays
            value = value.tolist()
            value = tuple(value) if isinstance(value, list) else value
        try:
            hash(value)
        except TypeError:
            return None
        items.append((name, value))
    return tuple(sorted(items))
