"""Array ops: convolutions and matrix products, priced as GEMMs on the systolic array.

Each op becomes ``items`` identical GEMMs of ``rows x cols`` outputs over ``red`` reduction
steps: the groups of a convolution, or the batch of a MatMul whose right operand is batched
(when it is not, the batch folds into the rows). Work is split over the cores along whichever
dimension is fastest (:func:`price`): output rows ``M`` (every core shares the broadcast
weights), output columns ``N`` (every core shares the broadcast inputs and fetches only its
columns of the weights), the reduction ``K`` (each core its slice of both; the partial sums go
through HBM and are added on the vector units) or whole GEMMs per core. The MACs may also run
on the vector units (one per lane per cycle), which wins for GEMMs too thin for the array
(depthwise convolutions, a single output channel).
Vector work fused onto the array's output (a fused ``activation`` and ``epilogue``,
ConvTranspose's col2im accumulation) runs on the vector unit in parallel with the array:
compute is the larger. An epilogue's operands (a residual) are read once beside the output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import epilogue
from ..config import DeviceConfig
from ..dtypes import TensorSpec, itemsize
from ..errors import KernelError
from .energy import array_sram_bytes
from .model import Cost, launch_cycles, make_cost, present, spec
from .systolic import (
    ACC_BYTES,
    conv_output_size,
    gemm_cycles,
    gemm_tile,
    mac_rate,
    tiled_traffic,
)
from .vector_ops import ELEMENTWISE


@dataclass(frozen=True)
class GemmWork:
    """Config-independent description of an array op (bytes are per item unless noted)."""

    op: str
    items: int
    rows: int
    cols: int
    red: int
    dtype: str
    a_bytes: int
    b_bytes: int
    fixed_bytes: int  # total over items: outputs, bias, quantisation parameters
    fixed_out: int  # of which outputs (bytes leaving for HBM)
    a_item: int  # element sizes of A, B and the output, for the first/last tile
    b_item: int
    out_item: int
    post_work: float  # vector lane-cycles overlapped with the array, total over items
    names: tuple[str, str]

    @property
    def macs(self) -> int:
        return self.items * self.rows * self.cols * self.red


@dataclass(frozen=True)
class Schedule:
    """One way to run a :class:`GemmWork` on ``used`` cores: the per-core GEMM and its traffic.

    ``split`` is ``"M"``, ``"N"``, ``"K"`` or ``"items"``; ``rows x cols x red`` is each core's
    GEMM, run ``items`` times; ``traffic`` covers the A and B bytes of the whole op; ``held`` is
    the operand (``"A"`` or ``"B"``) each core keeps resident in SRAM, in ``blocks`` blocks.
    ``partials`` are the bytes of 32-bit partial sums a K split writes to and reads back from HBM.
    """

    split: str
    used: int
    items: int
    rows: int
    cols: int
    red: int
    traffic: int
    note: str
    held: str
    blocks: int
    partials: int = 0


def _schedule(config: DeviceConfig, w: GemmWork, cores: int, split: str) -> Schedule:
    """Divide ``w`` over up to ``cores`` cores along ``split`` (see :class:`Schedule`)."""
    a, b = w.a_bytes, w.b_bytes
    if split == "M":  # rows split, B broadcast to every core
        used = max(1, min(cores, w.rows))
        t = tiled_traffic(config, a, b, used, w.names)
        held = "A" if t.held == "split" else "B"
        return Schedule(split, used, w.items, -(-w.rows // used), w.cols, w.red,
                        w.items * t.hbm_bytes, t.note, held, t.blocks)
    if split == "N":  # columns split, A broadcast: each core fetches only its columns of B
        used = max(1, min(cores, w.cols))
        t = tiled_traffic(config, b, a, used, w.names[::-1])
        held = "B" if t.held == "split" else "A"
        return Schedule(split, used, w.items, w.rows, -(-w.cols // used), w.red,
                        w.items * t.hbm_bytes, t.note, held, t.blocks)
    if split == "K":  # reduction split: each core its slice of A and B, partial sums added
        used = max(1, min(cores, w.red))
        t = tiled_traffic(config, -(-a // used), -(-b // used), 1, w.names)
        held = "A" if t.held == "split" else "B"
        partials = 2 * (used - 1) * w.rows * w.cols * ACC_BYTES * w.items
        return Schedule(split, used, w.items, w.rows, w.cols, -(-w.red // used),
                        w.items * used * t.hbm_bytes + partials, t.note, held, t.blocks,
                        partials)
    used = max(1, min(cores, w.items))  # "items": whole GEMMs per core
    t = tiled_traffic(config, a, b, 1, w.names)
    held = "A" if t.held == "split" else "B"
    return Schedule(split, used, -(-w.items // used), w.rows, w.cols, w.red,
                    w.items * t.hbm_bytes, t.note, held, t.blocks)


def _tiles(config: DeviceConfig, w: GemmWork, s: Schedule) -> tuple[int, int]:
    """Bytes of the first fold's operands (capped at one SRAM buffer) and its outputs."""
    if w.macs == 0:
        return 0, 0
    r, c = min(s.rows, config.array_rows), min(s.cols, config.array_cols)
    first = min(r * s.red * w.a_item + s.red * c * w.b_item, config.sram_bytes_per_core // 2)
    return first, r * c * w.out_item


def _post(config: DeviceConfig, w: GemmWork, share: float) -> int:
    return math.ceil(w.post_work * share / config.vector_lanes - 1e-9) if w.post_work else 0


def _refetch(w: GemmWork, hbm_bytes: int) -> float:
    """HBM bytes over the bytes of every operand moved once (1.0 when nothing was re-fetched)."""
    ideal = w.items * (w.a_bytes + w.b_bytes) + w.fixed_bytes
    return hbm_bytes / ideal if hbm_bytes > ideal else 1.0


def _reduce_ops(w: GemmWork, s: Schedule) -> tuple[int, int]:
    """(lane-operations on the busiest core, in total) to add a K split's partial sums."""
    if s.split != "K" or s.used == 1:
        return 0, 0
    share = -(-(w.rows * w.cols) // s.used)
    return w.items * (s.used - 1) * share, w.items * (s.used - 1) * w.rows * w.cols


def _compute(config: DeviceConfig, w: GemmWork, s: Schedule, vector: bool) -> int:
    """Busiest core's engine cycles of schedule ``s`` on the arrays or (``vector``) the vector
    units, with fused vector work and a K split's partial-sum adds."""
    share = (s.rows * s.cols * s.red * s.items) / w.macs if w.macs else 0.0
    reduce_core, _ = _reduce_ops(w, s)
    reduce = math.ceil(reduce_core / config.vector_lanes - 1e-9) if reduce_core else 0
    if vector:
        compute = math.ceil(w.macs * share / config.vector_lanes - 1e-9) + _post(config, w, share)
    else:
        array = s.items * gemm_cycles(config, s.rows, s.cols, s.red, w.dtype)
        compute = max(array, _post(config, w, share))
    return compute + reduce


def _total(config: DeviceConfig, w: GemmWork, s: Schedule, vector: bool) -> int:
    """Total cycles of schedule ``s``: what :func:`price` compares."""
    first, last = _tiles(config, w, s)
    return launch_cycles(config, _compute(config, w, s, vector), s.traffic + w.fixed_bytes,
                         first, last)[2]


def _cost(config: DeviceConfig, w: GemmWork, s: Schedule, vector: bool) -> Cost:
    """The full :class:`Cost` of schedule ``s``: cycles, tile, notes and energy."""
    first, last = _tiles(config, w, s)
    hbm = s.traffic + w.fixed_bytes
    tile, sram = gemm_tile(config, s.rows, s.cols, s.red, w.a_item, w.b_item, s.held, s.blocks)
    read, written = array_sram_bytes(config, s.rows, s.cols, s.red, w.a_item, w.b_item,
                                     ACC_BYTES if s.used > 1 and s.split == "K" else w.out_item)
    # The per-core GEMM runs items x cores times in all (an item split: once per item).
    runs = w.items if s.split == "items" else w.items * s.used
    notes = [s.note]
    if vector:
        notes.insert(0, f"{w.items} GEMM(s) of {w.rows}x{w.cols}x{w.red} run on the vector "
                        "units (faster than array folds)")
    if s.partials:
        notes.append(f"reduction split over {s.used} cores: partial sums added on the vector "
                     "unit")
    return make_cost(
        config, compute=_compute(config, w, s, vector), hbm_bytes=hbm, first_tile=first,
        last_tile=last, engine="vector" if vector else "array", cores=s.used, macs=w.macs,
        refetch=_refetch(w, hbm), notes="; ".join(n for n in notes if n), split=s.split,
        tile=tile, sram_bytes=sram, dtype=w.dtype,
        array_macs=0 if vector else w.macs,
        vector_ops=(w.macs if vector else 0) + w.post_work + _reduce_ops(w, s)[1],
        engine_read=runs * read, engine_written=runs * written,
        hbm_out=w.fixed_out + s.partials // 2,
    )


SPLITS = ("M", "N", "K")
"""Dimensions an array op can be split along, in the order ties are broken."""


def price(config: DeviceConfig, w: GemmWork, cores: int) -> Cost:
    """The fastest schedule of ``w`` on ``cores`` cores.

    Candidates: the array with output rows (M), output columns (N) or the reduction (K) split
    over the cores, or (``items > 1``) whole GEMMs per core; the vector units with rows or
    columns split. Ties go to the earlier candidate, so one core always prices the M split.
    """
    mac_rate(config, w.dtype, w.op)
    schedules = [_schedule(config, w, cores, split) for split in SPLITS]
    if w.items > 1:
        schedules.append(_schedule(config, w, cores, "items"))
    candidates = [(s, False) for s in schedules] + [(s, True) for s in schedules[:2]]
    best = min(candidates, key=lambda c: _total(config, w, *c))  # the first of equals
    return _cost(config, w, *best)


# -- attribute handling -----------------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _post_factor(op: str, attrs: Mapping[str, Any]) -> float:
    """Vector lane-cycles per output element of the fused activation and epilogue: each step
    costs what its standalone op does per element (a gate adds one multiply)."""
    act = attrs.get("activation")
    factor = 0.0
    if act is not None and _text(act) not in ("", "NONE"):
        factor = _factor(op, _text(act))
    for step in epilogue.decode(op, attrs):
        factor += _factor(op, step.op) + (ELEMENTWISE["Mul"] if step.gate else 0.0)
    return factor


def _factor(op: str, act: str) -> float:
    if act not in ELEMENTWISE:
        raise KernelError(op, "", f"fused activation={act!r} has no cost model; expected one of "
                                  f"{sorted(ELEMENTWISE)}")
    return ELEMENTWISE[act]


def _read(inputs, extra, op: str, attrs: Mapping[str, Any]) -> int:
    """Bytes of the operands read once besides the two GEMM operands: ``extra`` (a bias) and
    the epilogue's operands (a residual), each streamed in beside its output tile."""
    return present(inputs, [*extra, *epilogue.operands(op, attrs)])


def _ints(op: str, attrs: Mapping[str, Any], name: str, default: list[int], n: int) -> list[int]:
    value = attrs.get(name)
    if value is None or (not isinstance(value, int) and len(value) == 0):
        return default
    values = [int(v) for v in (value if not isinstance(value, int) else [value])]
    if len(values) != n:
        raise KernelError(op, "", f"{name}={values} has {len(values)} values; expected {n}")
    return values


def _conv_out(op: str, x: TensorSpec, kernel: list[int], attrs: Mapping[str, Any]) -> list[int]:
    d = len(kernel)
    strides = _ints(op, attrs, "strides", [1] * d, d)
    dil = _ints(op, attrs, "dilations", [1] * d, d)
    if min(strides + dil, default=1) < 1:
        raise KernelError(op, "", f"strides={strides}, dilations={dil}; expected values >= 1")
    auto = _text(attrs.get("auto_pad", "NOTSET"))
    spatial = x.shape[2:]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return [-(-s // st) for s, st in zip(spatial, strides, strict=True)]
    if auto not in ("NOTSET", "VALID"):
        raise KernelError(op, "", f"auto_pad={auto!r} is invalid; expected NOTSET, VALID, "
                                  "SAME_UPPER or SAME_LOWER")
    pads = [0] * (2 * d) if auto == "VALID" else _ints(op, attrs, "pads", [0] * (2 * d), 2 * d)
    out = [conv_output_size(s, k, st, pads[i] + pads[i + d], dl)
           for i, (s, k, st, dl) in enumerate(zip(spatial, kernel, strides, dil, strict=True))]
    if min(out, default=1) < 1 and min(spatial, default=1) > 0:
        raise KernelError(op, "", f"kernel {kernel} does not fit input {list(spatial)} with "
                                  f"pads {pads}, dilations {dil}")
    return out


def _conv(config, op, inputs, outputs, attrs, cores, x_i=0, w_i=1, extra=(2,)) -> Cost:
    x, w = spec(op, inputs, x_i, "input X"), spec(op, inputs, w_i, "weights W")
    out = spec(op, outputs, 0, "output")
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise KernelError(op, "", f"X {list(x.shape)} and W {list(w.shape)} must be N,C,spatial"
                                  " and M,C/group,kernel of the same rank (>= 3)")
    groups = int(attrs.get("group", 1))
    n, c, m = x.shape[0], x.shape[1], w.shape[0]
    if groups < 1 or c % groups or m % groups or w.shape[1] * groups != c:
        raise KernelError(op, "", f"group={groups} with C={c}, M={m}, W {list(w.shape)}; "
                                  "expected group dividing C and M, W[1] = C/group")
    kernel = list(w.shape[2:])
    spatial = _conv_out(op, x, kernel, attrs)
    if list(out.shape[2:]) != spatial or out.shape[:2] != (n, m):
        raise KernelError(op, "", f"output {list(out.shape)} disagrees with the attributes, "
                                  f"which give {[n, m, *spatial]}")
    work = GemmWork(
        op=op, items=groups, rows=n * math.prod(spatial), cols=m // groups,
        red=(c // groups) * math.prod(kernel), dtype=x.dtype,
        a_bytes=x.nbytes // groups, b_bytes=w.nbytes // groups,
        fixed_out=out.nbytes,
        fixed_bytes=out.nbytes + _read(inputs, extra, op, attrs), a_item=itemsize(x.dtype),
        b_item=itemsize(w.dtype), out_item=itemsize(out.dtype),
        post_work=out.size * _post_factor(op, attrs) + _prologue(op, x, attrs),
        names=("inputs", "weights"),
    )
    return price(config, work, cores)


def _prologue(op: str, x: TensorSpec, attrs: Mapping[str, Any]) -> float:
    """Lane-cycles of a fused input scale: one multiply per input element as it streams in."""
    return x.size * ELEMENTWISE["Mul"] if epilogue.input_scale(op, attrs) >= 0 else 0.0


def _conv_transpose(config, op, inputs, outputs, attrs, cores) -> Cost:
    x, w = spec(op, inputs, 0, "input X"), spec(op, inputs, 1, "weights W")
    out = spec(op, outputs, 0, "output")
    groups = int(attrs.get("group", 1))
    if len(x.shape) < 3 or len(w.shape) != len(x.shape) or groups < 1 or \
            w.shape[0] != x.shape[1] or x.shape[1] % groups:
        raise KernelError(op, "", f"X {list(x.shape)}, W {list(w.shape)}, group={groups}; "
                                  "expected W = C x M/group x kernel with group dividing C")
    kernel = math.prod(w.shape[2:])
    rows = x.shape[0] * math.prod(x.shape[2:])
    cols = w.shape[1] * kernel
    # Each input pixel times the weights gives a kernel-sized patch; col2im adds the patches
    # into the output on the vector unit (one lane-cycle per partial sum).
    col2im = rows * cols * groups
    work = GemmWork(
        op=op, items=groups, rows=rows, cols=cols, red=x.shape[1] // groups, dtype=x.dtype,
        a_bytes=x.nbytes // groups, b_bytes=w.nbytes // groups,
        fixed_out=out.nbytes,
        fixed_bytes=out.nbytes + _read(inputs, [2], op, attrs), a_item=itemsize(x.dtype),
        b_item=itemsize(w.dtype), out_item=itemsize(out.dtype),
        post_work=col2im + out.size * _post_factor(op, attrs), names=("inputs", "weights"),
    )
    return price(config, work, cores)


def _broadcast_batch(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> int:
    a, b = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    for da, db in zip(a, b, strict=True):
        if da != db and 1 not in (da, db):
            raise KernelError(op, "", f"batch dimensions {list(a)} and {list(b)} do not broadcast")
    return math.prod(da if db == 1 else db for da, db in zip(a, b, strict=True))


def _matmul(config, op, inputs, outputs, attrs, cores, a_i=0, b_i=1, extra=()) -> Cost:
    a, b = spec(op, inputs, a_i, "input A"), spec(op, inputs, b_i, "input B")
    out = spec(op, outputs, 0, "output")
    if not a.shape or not b.shape:
        raise KernelError(op, "", "MatMul operands must have rank >= 1")
    if int(attrs.get("transB", 0)) and len(b.shape) == 2:  # B stored transposed: same work
        b = TensorSpec(b.shape[::-1], b.dtype)
    m, k = (a.shape[-2] if len(a.shape) > 1 else 1), a.shape[-1]
    kb, n = (b.shape[-2], b.shape[-1]) if len(b.shape) > 1 else (b.shape[0], 1)
    if k != kb:
        raise KernelError(op, "", f"A {list(a.shape)} and B {list(b.shape)}: K={k} != {kb}")
    batch = _broadcast_batch(op, a.shape[:-2], b.shape[:-2])
    b_batched = math.prod(b.shape[:-2]) > 1
    items, rows = (batch, m) if b_batched else (1, batch * m)
    ea, eb = itemsize(a.dtype), itemsize(b.dtype)
    work = GemmWork(
        op=op, items=items, rows=rows, cols=n, red=k, dtype=a.dtype,
        a_bytes=rows * k * ea, b_bytes=k * n * eb,
        fixed_out=out.nbytes,
        fixed_bytes=out.nbytes + _read(inputs, extra, op, attrs), a_item=ea, b_item=eb,
        out_item=itemsize(out.dtype), post_work=out.size * _post_factor(op, attrs),
        names=("A", "B"),
    )
    return price(config, work, cores)


def _gemm(config, op, inputs, outputs, attrs, cores) -> Cost:
    a, b = spec(op, inputs, 0, "input A"), spec(op, inputs, 1, "input B")
    out = spec(op, outputs, 0, "output")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise KernelError(op, "", f"A {list(a.shape)} and B {list(b.shape)} must be 2-D")
    m, k = a.shape[::-1] if int(attrs.get("transA", 0)) else a.shape
    kb, n = b.shape[::-1] if int(attrs.get("transB", 0)) else b.shape
    if k != kb:
        raise KernelError(op, "", f"A {list(a.shape)} and B {list(b.shape)} (transA/transB "
                                  f"applied): K={k} != {kb}")
    work = GemmWork(
        op=op, items=1, rows=m, cols=n, red=k, dtype=a.dtype, a_bytes=a.nbytes, b_bytes=b.nbytes,
        fixed_out=out.nbytes,
        fixed_bytes=out.nbytes + _read(inputs, [2], op, attrs), a_item=itemsize(a.dtype),
        b_item=itemsize(b.dtype), out_item=itemsize(out.dtype),
        post_work=out.size * _post_factor(op, attrs), names=("inputs", "weights"),
    )
    return price(config, work, cores)


def _qlinear_conv(config, op, inputs, outputs, attrs, cores) -> Cost:
    return _conv(config, op, inputs, outputs, attrs, cores, 0, 3, (1, 2, 4, 5, 6, 7, 8))


def _conv_integer(config, op, inputs, outputs, attrs, cores) -> Cost:
    return _conv(config, op, inputs, outputs, attrs, cores, 0, 1, (2, 3))


def _qlinear_matmul(config, op, inputs, outputs, attrs, cores) -> Cost:
    return _matmul(config, op, inputs, outputs, attrs, cores, 0, 3, (1, 2, 4, 5, 6, 7))


def _matmul_integer(config, op, inputs, outputs, attrs, cores) -> Cost:
    return _matmul(config, op, inputs, outputs, attrs, cores, 0, 1, (2, 3))


ARRAY_OPS = {
    "Conv": _conv, "ConvTranspose": _conv_transpose, "MatMul": _matmul, "Gemm": _gemm,
    "QLinearConv": _qlinear_conv, "QLinearMatMul": _qlinear_matmul,
    "MatMulInteger": _matmul_integer, "ConvInteger": _conv_integer,
}
