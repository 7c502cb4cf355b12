"""Stall-free systolic-array cycles and the SRAM tiling that decides HBM traffic.

The array is ``R x C`` processing elements (PEs). A GEMM of ``Sr x Sc`` outputs over ``T``
reduction steps (``Sr = M``, ``Sc = N``, ``T = K``) is cut into *folds*: pieces that fit the
array. One dimension stays in the PEs, two are laid across rows and columns, and one streams
through in time; a fold takes ``stream + R + C - 2`` cycles (the stream plus the skew of
filling and draining the pipeline). Per dataflow (SCALE-Sim's analytical model):

====  ===============  ==========================  ================
flow  stays in the PEs folds                       streamed length
====  ===============  ==========================  ================
os    outputs          ceil(M/R) * ceil(N/C)       K
ws    weights (K x N)  ceil(K/R) * ceil(N/C)       M
is    inputs (K x M)   ceil(K/R) * ceil(M/C)       N
====  ===============  ==========================  ================

With ``stationary_load = "exposed"`` (the ``os32`` preset) the counts are SCALE-Sim's exactly:
a weight- or input-stationary fold also takes ``R`` cycles to shift its stationary operand in
(``stream + 2R + C - 2``), and the total is one less (SCALE-Sim counts to the last busy cycle):

* OS ``ceil(Sr/R) * ceil(Sc/C) * (T + R + C - 2) - 1``
* WS ``ceil(T/R) * ceil(Sc/C) * (Sr + 2R + C - 2) - 1``
* IS ``ceil(T/R) * ceil(Sr/C) * (Sc + 2R + C - 2) - 1``

With ``"hidden"`` (shadow registers, every other preset) the next fold's operand loads while
the current one computes and no ``R`` is paid.

The per-dtype MAC rate ``r = config.macs_per_pe(dtype)`` scales the streamed length: a PE that
does ``r`` MACs per cycle consumes ``r`` stream steps per cycle (``ceil(L / r)`` cycles), one that
does a quarter MAC per cycle takes four cycles per step. The skew is register-to-register and
does not depend on the dtype. See ``docs/cost_model.md`` for the derivation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import DeviceConfig
from ..errors import ConfigError, KernelError, format_bytes


def _check_dims(op: str, **dims: int) -> None:
    for name, value in dims.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise KernelError(op, "", f"{name}={value!r} is invalid; expected an integer >= 0")


def mac_rate(config: DeviceConfig, dtype: str, op: str = "gemm") -> float:
    """MACs per PE per cycle for ``dtype``; a dtype the array cannot multiply is a KernelError."""
    try:
        return config.macs_per_pe(dtype)
    except ConfigError as exc:
        raise KernelError(op, "", f"the systolic array has no MAC rate for {exc.valid}; "
                                  f"got dtype {dtype!r}") from None


def gemm_cycles(config: DeviceConfig, m: int, n: int, k: int, dtype: str = "float16") -> int:
    """Stall-free compute cycles of an ``(m x k) @ (k x n)`` GEMM on ONE core.

    Uses the configured dataflow (see the module docstring) and the MAC rate of ``dtype``
    (float16 runs at one MAC per PE per cycle on every preset). An empty GEMM takes 0 cycles.
    """
    _check_dims("gemm", m=m, n=n, k=k)
    if m == 0 or n == 0 or k == 0:
        return 0
    rate = mac_rate(config, dtype)
    rows, cols = config.array_rows, config.array_cols
    skew = rows + cols - 2
    flow = config.dataflow
    if flow == "os":
        folds = -(-m // rows) * -(-n // cols)
        stream = k
    elif flow == "ws":
        folds = -(-k // rows) * -(-n // cols)
        stream = m
    else:  # "is"
        folds = -(-k // rows) * -(-m // cols)
        stream = n
    if config.stationary_load == "hidden":
        return folds * (math.ceil(stream / rate) + skew)
    # Exposed, as SCALE-Sim counts it: a weight- or input-stationary fold first shifts its R
    # rows of stationary operand in; the count ends on the last busy cycle (hence - 1).
    load = rows if flow != "os" else 0
    return folds * (math.ceil(stream / rate) + skew + load) - 1


def conv_output_size(size: int, kernel: int, stride: int, pad_total: int, dilation: int) -> int:
    """Output length of one axis: ``(size + pads - dilation*(kernel-1) - 1)//stride + 1``."""
    return (size + pad_total - dilation * (kernel - 1) - 1) // stride + 1


def conv_cycles(
    config: DeviceConfig,
    n: int,
    c: int,
    h: int,
    w: int,
    m: int,
    kh: int,
    kw: int,
    stride: int = 1,
    pad: int = 0,
    groups: int = 1,
    *,
    dtype: str = "float16",
    dilation: int = 1,
) -> int:
    """Compute cycles of a 2-D convolution on ONE core, as GEMMs (im2col).

    Per group the GEMM has ``Sr = N*OH*OW`` rows, ``Sc = M/groups`` columns and
    ``T = KH*KW*C/groups`` reduction steps; the groups run one after the other, so a depthwise
    convolution (``groups = C = M``) is ``C`` thin GEMMs. ``OH = (H + 2*pad - KH)//stride + 1``
    (with dilation ``d`` the kernel spans ``d*(KH-1)+1`` pixels).
    """
    _check_dims("Conv", n=n, c=c, h=h, w=w, m=m, kh=kh, kw=kw, pad=pad)
    for name, value in (("stride", stride), ("groups", groups), ("dilation", dilation)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KernelError("Conv", "", f"{name}={value!r} is invalid; expected an integer >= 1")
    if c % groups or m % groups:
        raise KernelError("Conv", "", f"groups={groups} must divide C={c} and M={m}")
    oh = conv_output_size(h, kh, stride, 2 * pad, dilation)
    ow = conv_output_size(w, kw, stride, 2 * pad, dilation)
    if oh < 0 or ow < 0 or (h and oh == 0) or (w and ow == 0):
        raise KernelError("Conv", "", f"kernel {kh}x{kw} (dilation {dilation}) does not fit the "
                                      f"padded {h}x{w} input (pad {pad})")
    return groups * gemm_cycles(config, n * oh * ow, m // groups, kh * kw * c // groups, dtype)


@dataclass(frozen=True)
class Traffic:
    """HBM bytes of one tiled GEMM (or a run of identical ones), which operand stays resident
    in SRAM (``"split"`` or ``"shared"``) in how many blocks, and why bytes were re-fetched."""

    hbm_bytes: int
    note: str
    held: str = "shared"
    blocks: int = 1


def tiled_traffic(
    config: DeviceConfig,
    a_bytes: int,
    b_bytes: int,
    cores: int,
    names: tuple[str, str] = ("inputs", "weights"),
) -> Traffic:
    """Bytes moved between HBM and SRAM for a GEMM whose operand ``a`` is split over ``cores``
    and whose operand ``b`` is shared by them.

    The shared operand is broadcast to every core, so it crosses HBM once per pass; outputs and
    other once-moved bytes are the caller's. A resident block of one operand may use half a
    core's SRAM (the other half double-buffers the streamed tiles). If neither operand fits, the
    cheaper of two tilings is taken: hold blocks of ``b`` and stream ``a`` once per block, or hold
    blocks of each core's ``a`` and stream ``b`` once per block.
    """
    ideal = a_bytes + b_bytes
    buf = config.sram_bytes_per_core // 2
    a_core = -(-a_bytes // max(cores, 1))
    b_blocks = -(-b_bytes // buf) or 1
    a_blocks = -(-a_core // buf) or 1
    hold_b = b_bytes + a_bytes * b_blocks
    hold_a = a_bytes + b_bytes * a_blocks
    if b_blocks == 1:
        return Traffic(ideal, "", "shared", 1)
    if a_blocks == 1:
        return Traffic(ideal, "", "split", 1)
    sram = format_bytes(config.sram_bytes_per_core)
    if hold_b <= hold_a:
        streamed, held, blocks, size = names[0], names[1], b_blocks, b_bytes
    else:
        streamed, held, blocks, size = names[1], f"{names[0]} per core", a_blocks, a_core
    note = (f"{streamed} re-fetched {blocks}x: {held} {format_bytes(size)} > SRAM buffer "
            f"{format_bytes(buf)} (half of {sram}, double-buffered)")
    return Traffic(min(hold_b, hold_a), note, "shared" if hold_b <= hold_a else "split", blocks)


ACC_BYTES = 4
"""The array accumulates in 32 bits: an output tile takes 4 bytes per element in SRAM."""


def gemm_tile(
    config: DeviceConfig,
    m: int,
    n: int,
    k: int,
    a_item: int,
    b_item: int,
    held: str,
    blocks: int,
) -> tuple[tuple[tuple[str, int], ...], int]:
    """Per-core SRAM tile ``((m, tm), (n, tn), (k, tk))`` of an ``m x n x k`` GEMM, and its bytes.

    ``held`` (``"A"`` or ``"B"``) is the operand :func:`tiled_traffic` keeps resident, in
    ``blocks`` blocks: the resident block spans the whole reduction and ``1/blocks`` of its other
    dimension; the streamed operand's tiles are as large as the rest of the SRAM allows with two
    in flight, beside a 32-bit accumulator tile. If that still does not fit (a reduction too
    long for one streamed row), the largest tile dimension is halved until it does.
    """
    sram = config.sram_bytes_per_core
    m, n, k = max(1, m), max(1, n), max(1, k)
    if held == "B":
        tn = -(-n // blocks)
        tm = min(m, max(1, (sram - k * tn * b_item) // (2 * k * a_item + tn * ACC_BYTES)))
    else:
        tm = -(-m // blocks)
        tn = min(n, max(1, (sram - tm * k * a_item) // (2 * k * b_item + tm * ACC_BYTES)))
    dims = {"m": tm, "n": tn, "k": k}

    def footprint(d: dict[str, int]) -> int:
        resident, streamed = ((d["k"] * d["n"] * b_item, d["m"] * d["k"] * a_item) if held == "B"
                              else (d["m"] * d["k"] * a_item, d["k"] * d["n"] * b_item))
        return resident + 2 * streamed + d["m"] * d["n"] * ACC_BYTES

    while footprint(dims) > sram and max(dims.values()) > 1:
        key = max(dims, key=dims.__getitem__)
        dims[key] = -(-dims[key] // 2)
    return tuple(dims.items()), footprint(dims)
