"""Vector-unit, copy and view ops: everything that is not a GEMM.

The vector unit of a core processes ``vector_lanes`` elements per cycle for every dtype. An op
costs ``elements * factor / (vector_lanes * cores)`` cycles, where the factor (a table below)
is how many lane-cycles one element takes: 1 for add or relu, about 4 for a transcendental
(exp, tanh, erf), several passes for softmax and layer normalisation, the window size for a
pool. Copies (Transpose, Concat, Gather, Pad...) move each element through the unit once and
are memory-bound. Views (Reshape, Squeeze, Identity...) move nothing: the compiler rewrites the
tensor's descriptor, so they cost only the launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..config import DeviceConfig
from ..dtypes import TensorSpec, itemsize
from ..errors import KernelError
from .model import Cost, make_cost, present, spec

# Lane-cycles per output element of an elementwise op. Transcendentals are a range reduction
# plus a short polynomial (~4); Pow is exp(y*log(x)); BatchNormalization (inference) is one
# fused multiply-add after folding; Cast and (de)quantisation scale, round and clamp.
ELEMENTWISE: dict[str, float] = {
    "Relu": 1, "LeakyRelu": 1, "PRelu": 1, "Clip": 1, "Neg": 1, "Abs": 1,
    "Add": 1, "Sub": 1, "Mul": 1, "Where": 1,
    "Min": 1, "Max": 1, "Sum": 1, "Mean": 1,
    "HardSigmoid": 2, "HardSwish": 3, "BatchNormalization": 2,
    "Div": 4, "Reciprocal": 4, "Sqrt": 4,
    "Exp": 4, "Log": 4, "Sigmoid": 4, "Tanh": 4, "Erf": 4, "Gelu": 6, "Pow": 8,
    "Cast": 2, "QuantizeLinear": 2, "DequantizeLinear": 2,
    # Predicates: one compare or logic operation per lane.
    "Equal": 1, "Greater": 1, "Less": 1, "GreaterOrEqual": 1, "LessOrEqual": 1,
    "And": 1, "Or": 1, "Xor": 1, "Not": 1, "IsNaN": 1, "IsInf": 1,
    "Floor": 1, "Ceil": 1, "Round": 1, "Sin": 4, "Cos": 4,
    # Shape writes rank-many int64s; folded at compile time whenever shapes are static.
    "Shape": 1,
}
VARIADIC = frozenset({"Sum", "Mean", "Min", "Max"})
"""Ops taking any number of inputs: one pass per extra input (Mean adds a final scale)."""

# Lane-cycles per element along the normalised axis: Softmax = max, subtract, exp (4), sum,
# scale; LogSoftmax the same with a final subtract; LayerNormalization = mean, subtract,
# square-and-sum (2), normalise, affine.
ROW_PASSES: dict[str, float] = {"Softmax": 8, "LogSoftmax": 8, "LayerNormalization": 6}

REDUCE_PASSES: dict[str, float] = {
    "ReduceSum": 1, "ReduceMean": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceL2": 2,
    "ArgMax": 2, "ArgMin": 2,  # compare and keep the index
}
"""Lane-cycles per *input* element of a reduction (ReduceL2 squares then adds)."""

COPIES = frozenset({"Transpose", "Concat", "Split", "Slice", "Gather", "Expand", "Pad"})
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def _lanes_cycles(config: DeviceConfig, work: float, elements: int, cores: int) -> tuple[int, int]:
    """(cycles on the busiest core, cores used) for ``work`` lane-cycles over ``elements``."""
    if elements == 0 or work == 0:
        return 0, 1
    used = min(cores, elements)
    # Elements split evenly; the busiest core gets the rounded-up share of the work.
    per_core = work * (-(-elements // used)) / elements
    return math.ceil(per_core / config.vector_lanes - 1e-9), used


def _tile(specs: Sequence[TensorSpec | None], lanes: int) -> int:
    """Bytes of the first (or last) lane-wide vector of each operand."""
    return sum(min(s.nbytes, lanes * itemsize(s.dtype)) for s in specs if s is not None)


def _price(
    config: DeviceConfig,
    work: float,
    elements: int,
    hbm_bytes: int,
    inputs: Sequence[TensorSpec | None],
    outputs: Sequence[TensorSpec],
    cores: int,
    notes: str = "",
) -> Cost:
    compute, used = _lanes_cycles(config, work, elements, cores)
    lanes = config.vector_lanes
    tile, sram = _sram_tile(config, inputs, outputs, used)
    read = sum(s.nbytes for s in inputs if s is not None)
    written = sum(s.nbytes for s in outputs)
    dtype = outputs[0].dtype if outputs else "float32"
    return make_cost(
        config, compute=compute, hbm_bytes=hbm_bytes, first_tile=_tile(inputs, lanes),
        last_tile=_tile(outputs, lanes), engine="vector", cores=used, notes=notes,
        tile=tile, sram_bytes=sram, dtype=dtype, vector_ops=work, engine_read=read,
        engine_written=written, hbm_out=written,
    )


def _sram_tile(
    config: DeviceConfig,
    inputs: Sequence[TensorSpec | None],
    outputs: Sequence[TensorSpec],
    cores: int,
) -> tuple[tuple[tuple[str, int], ...], int]:
    """Per-core tile of a vector op: a run of elements of every operand, double-buffered.

    The run is a core's share of the largest operand, cut to what fits ``sram_bytes_per_core``
    with two buffers per operand.
    """
    operands = [s for s in (*inputs, *outputs) if s is not None]
    elements = max((s.size for s in operands), default=0)
    per_core = -(-elements // max(cores, 1))
    element_bytes = sum(itemsize(s.dtype) for s in operands) or 1
    tile = max(1, min(per_core, config.sram_bytes_per_core // (2 * element_bytes)))
    return (("elements", tile),), 2 * tile * element_bytes


def _all_bytes(inputs: Sequence[TensorSpec | None], outputs: Sequence[TensorSpec]) -> int:
    return present(inputs, range(len(inputs))) + sum(s.nbytes for s in outputs)


def _elementwise(config, op, inputs, outputs, attrs, cores) -> Cost:
    out = spec(op, outputs, 0, "output")
    passes = ELEMENTWISE[op]
    if op in VARIADIC:
        given = sum(1 for s in inputs if s is not None)
        passes *= max(1, given - 1) + (1 if op == "Mean" else 0)
    return _price(config, out.size * passes, out.size, _all_bytes(inputs, outputs[:1]),
                  inputs, outputs[:1], cores)


def _rows(config, op, inputs, outputs, attrs, cores) -> Cost:
    x = spec(op, inputs, 0, "input")
    return _price(config, x.size * ROW_PASSES[op], x.size, _all_bytes(inputs, outputs[:1]),
                  inputs, outputs[:1], cores)


def _lrn(config, op, inputs, outputs, attrs, cores) -> Cost:
    x = spec(op, inputs, 0, "input")
    size = int(attrs.get("size", 1))
    # Sum of squares over `size` channels, then pow (4) and a multiply.
    return _price(config, x.size * (size + 5), x.size, _all_bytes(inputs, outputs[:1]),
                  inputs, outputs[:1], cores)


def _reduce(config, op, inputs, outputs, attrs, cores) -> Cost:
    x = spec(op, inputs, 0, "input")
    out = spec(op, outputs, 0, "output")
    work = x.size * REDUCE_PASSES[op] + (out.size * ELEMENTWISE["Sqrt"] if op == "ReduceL2" else 0)
    return _price(config, work, x.size, _all_bytes(inputs, outputs[:1]), inputs, outputs[:1],
                  cores)


def _pool(config, op, inputs, outputs, attrs, cores) -> Cost:
    out = spec(op, outputs, 0, "output")
    kernel = attrs.get("kernel_shape")
    if not kernel:
        raise KernelError(op, "", "kernel_shape attribute is required")
    window = math.prod(int(k) for k in kernel)
    return _price(config, out.size * window, out.size, _all_bytes(inputs, outputs[:1]),
                  inputs, outputs[:1], cores)


def _global_pool(config, op, inputs, outputs, attrs, cores) -> Cost:
    x = spec(op, inputs, 0, "input")
    return _price(config, x.size, x.size, _all_bytes(inputs, outputs[:1]), inputs, outputs[:1],
                  cores)


RESIZE_TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
"""Input taps per resized axis; each tap is a weight multiply-add (2 lane-cycles)."""


def _resize(config, op, inputs, outputs, attrs, cores) -> Cost:
    x = spec(op, inputs, 0, "input")
    out = spec(op, outputs, 0, "output")
    mode = attrs.get("mode", "nearest")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in RESIZE_TAPS:
        raise KernelError(op, "", f"mode={mode!r} is invalid; expected one of {list(RESIZE_TAPS)}")
    axes = max(1, sum(1 for a, b in zip(x.shape, out.shape, strict=False) if a != b))
    per_elem = 1 if mode == "nearest" else 2 * RESIZE_TAPS[mode] ** axes
    return _price(config, out.size * per_elem, out.size, _all_bytes(inputs, outputs[:1]),
                  inputs, outputs[:1], cores)


def _copy(config, op, inputs, outputs, attrs, cores) -> Cost:
    moved = sum(s.size for s in outputs)
    if op == "Slice":  # only the slice is read
        nbytes = 2 * sum(s.nbytes for s in outputs) + present(inputs, range(1, len(inputs)))
    elif op == "Gather":  # indices plus the gathered rows
        nbytes = present(inputs, [1]) + 2 * sum(s.nbytes for s in outputs)
    else:
        nbytes = _all_bytes(inputs, outputs)
    return _price(config, moved, moved, nbytes, inputs, outputs, cores,
                  notes="memory-bound copy")


def _view(config, op, inputs, outputs, attrs, cores) -> Cost:
    return make_cost(config, compute=0, hbm_bytes=0, first_tile=0, last_tile=0, engine="none",
                     cores=1, notes="view: no data moved, launch overhead only")


Handler = Callable[[DeviceConfig, str, Sequence[Any], Sequence[TensorSpec], Mapping[str, Any],
                    int], Cost]

VECTOR_OPS: dict[str, Handler] = {
    **{op: _elementwise for op in ELEMENTWISE},
    **{op: _rows for op in ROW_PASSES},
    **{op: _reduce for op in REDUCE_PASSES},
    **{op: _copy for op in COPIES},
    **{op: _view for op in VIEWS},
    "LRN": _lrn,
    "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool,
    "Resize": _resize, "Upsample": _resize,
}
