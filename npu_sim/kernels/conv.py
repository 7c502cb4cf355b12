"""Kernel: Conv, and the sliding-window geometry ConvTranspose and the pools share.

A convolution runs the way an NPU lowers it onto its systolic array: the input is unfolded
(*im2col*, one strided copy into a reused scratch buffer) into a matrix whose columns are the
receptive fields of the output pixels, and each group is one GEMM of the weights against that
matrix (BLAS through numpy, float32 accumulation). A 1x1 convolution
without padding needs no unfolding: it is a plain GEMM over a (possibly strided) view of the
input. A depthwise convolution (one input channel per group) has too little reuse for a GEMM and
runs as a direct numba loop (:mod:`.depthwise`), and so does an image stem of 1 to 4 input
channels with a 3x3 or 5x5 kernel (:func:`direct_fits`, :func:`npu_sim.kernels.taps.direct`):
its GEMM's 27-long reduction is what OpenBLAS's AVX2 kernels do worst. MobileNet-V3's stem (3
channels of 224x224 to 16, 3x3 stride 2, with bias) took 229-232 against 321-374 us (unfold and
GEMM, one BLAS thread; best of 50, three rounds); onnxruntime's, one thread, 125 us.
ConvTranspose, the adjoint, is :mod:`.conv_transpose`. The numba loops are serial: they run
between BLAS calls whose threads keep spinning after each GEMM, and a parallel loop there
fights them for the cores (measured slower end to end on ResNet-50).

Two faster paths were measured on ResNet-50 and left out (both are in the history): Winograd
F(2x2, 3x3) for 3x3 stride-1 layers gained ~7% at best, inside run-to-run noise, and drifts
past the float32 tolerance against onnxruntime on unit-scale weights at 64-128 channels where
im2col does not; a numba AVX-512 sgemm beat OpenBLAS by 1.3x on the GEMMs alone but lost end to
end, its threads competing with OpenBLAS's spinning ones on two cores.

Everything works on 1-, 2- and 3-D spatial inputs: lower ranks are viewed as 3-D with leading
size-1 dims (kernel 1, stride 1, no padding), so one compiled loop serves all ranks.
:func:`window` resolves the ONNX padding rules (``pads``, ``auto_pad``, ``ceil_mode``) once for
Conv, ConvTranspose and the pools.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..epilogue import decode, input_scale
from ..errors import KernelError
from . import blas, taps, unfold
from .bias_fused import fused_bias_loop
from .depthwise import depthwise
from .gemm import computes_into, finish, landed, rounded, same_dtype, to_compute
from .limits import check_elements
from .registry import kernel

#: Highest spatial rank the window kernels take.
MAX_SPATIAL = 3
_AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")


@dataclass(frozen=True)
class Window:
    """Resolved geometry of a sliding window over the spatial dims of a tensor."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]

    @functools.cached_property
    def _as3(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        lead = MAX_SPATIAL - len(self.kernel)
        arrays = (
            np.array((1,) * lead + self.kernel, np.int64),
            np.array((1,) * lead + self.strides, np.int64),
            np.array((1,) * lead + self.dilations, np.int64),
            np.array((0,) * lead + self.pads_begin, np.int64),
        )
        for a in arrays:
            a.flags.writeable = False
        return arrays

    def as3(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Kernel, strides, dilations and leading pads padded to 3-D, as read-only int64
        arrays (made once per window)."""
        return self._as3


def int_tuple(
    op: str, attrs: Mapping[str, Any], name: str, default: tuple[int, ...], minimum: int
) -> tuple[int, ...]:
    """Integer tuple attribute ``name`` with ``len(default)`` entries, each ``>= minimum``."""
    value = tuple(int(v) for v in attrs.get(name, default))
    if len(value) != len(default):
        raise KernelError(op, "", f"{name}={list(value)} must have {len(default)} entries")
    if any(v < minimum for v in value):
        raise KernelError(op, "", f"{name}={list(value)} must have every entry >= {minimum}")
    return value


def spatial_rank(op: str, shape: tuple[int, ...]) -> int:
    """Spatial rank of an ``(N, C, *spatial)`` tensor, checked to be 1..3."""
    rank = len(shape) - 2
    if not 1 <= rank <= MAX_SPATIAL:
        raise KernelError(
            op,
            "",
            f"input of shape {shape} has rank {len(shape)}; expected (N, C, *spatial) "
            f"with 1 to {MAX_SPATIAL} spatial dims",
        )
    return rank


def window(
    op: str,
    in_shape: Sequence[int],
    kernel_shape: Sequence[int],
    attrs: Mapping[str, Any],
    *,
    ceil_mode: bool = False,
) -> Window:
    """Resolve ``strides``, ``dilations``, ``pads`` and ``auto_pad`` (ONNX defaults) for a window
    of ``kernel_shape`` sliding over spatial dims ``in_shape``."""
    rank = len(in_shape)
    kernel_shape = tuple(int(k) for k in kernel_shape)
    if any(k < 1 for k in kernel_shape):
        raise KernelError(op, "", f"kernel_shape={list(kernel_shape)} must be positive")
    strides = int_tuple(op, attrs, "strides", (1,) * rank, 1)
    dilations = int_tuple(op, attrs, "dilations", (1,) * rank, 1)
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    span = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations, strict=True)]
    if auto_pad not in _AUTO_PADS:
        raise KernelError(op, "", f"auto_pad={auto_pad!r}; expected one of {list(_AUTO_PADS)}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(in_shape, strides, strict=True)]
        # A window smaller than the stride can "need" negative padding; onnxruntime's Conv
        # clamps it to 0 (its pools crop or fail instead), and so do all kernels here.
        total = [
            max(0, (o - 1) * s + f - i)
            for o, s, f, i in zip(out, strides, span, in_shape, strict=True)
        ]
        begin, end = split_pads(total, upper=auto_pad == "SAME_UPPER")
    else:
        begin, end = explicit_pads(op, attrs, rank, auto_pad)
        out = []
        for i, s, f, b, e in zip(in_shape, strides, span, begin, end, strict=True):
            extent = i + b + e - f
            if ceil_mode:
                o = -(-extent // s) + 1
                if (o - 1) * s >= i + b:  # the last window would start in the end padding
                    o -= 1
            else:
                o = extent // s + 1 if extent >= 0 else 0
            out.append(o)
    if any(o < 1 for o in out):
        raise KernelError(
            op,
            "",
            f"window {list(kernel_shape)} (dilations {list(dilations)}, pads "
            f"{begin + end}) does not fit in spatial shape {list(in_shape)}",
        )
    return Window(kernel_shape, strides, dilations, tuple(begin), tuple(end), tuple(out))


def explicit_pads(op: str, attrs: Mapping[str, Any], rank: int,
                  auto_pad: str) -> tuple[list[int], list[int]]:
    """Begin and end pads from ``pads`` (zeros for ``VALID``), for ``auto_pad`` not SAME_*."""
    zeros = (0,) * 2 * rank
    pads = zeros if auto_pad == "VALID" else int_tuple(op, attrs, "pads", zeros, 0)
    return list(pads[:rank]), list(pads[rank:])


def split_pads(total: Sequence[int], *, upper: bool) -> tuple[list[int], list[int]]:
    """Split non-negative total padding per axis: the odd unit goes at the end (upper) or the
    start (lower)."""
    begin = [(t if upper else t + 1) // 2 for t in total]
    return begin, [t - b for t, b in zip(total, begin, strict=True)]


_SCRATCH = threading.local()


def scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A reusable per-thread work buffer of ``shape`` (contents undefined).

    The unfolded im2col matrix is the largest temporary of a network (MBs per layer); a fresh
    allocation each call costs a page fault per 4 KiB on first touch, which measured slower
    than the unfold itself.
    """
    size = math.prod(shape)
    key = np.dtype(dtype).str
    buffers = _SCRATCH.__dict__.setdefault("buffers", {})
    buf = buffers.get(key)
    if buf is None or buf.size < size:
        buf = buffers[key] = np.empty(max(size, 1), dtype)
    return buf[:size].reshape(shape)


def as5d(x: np.ndarray) -> np.ndarray:
    """View an ``(N, C, *spatial)`` array as 5-D ``(N, C, D, H, W)`` with leading size-1 dims."""
    lead = MAX_SPATIAL - (x.ndim - 2)
    return x.reshape(x.shape[:2] + (1,) * lead + x.shape[2:])


def _padded(x: np.ndarray, begin: Sequence[int], end: Sequence[int]) -> np.ndarray:
    """``x`` (C, D, H, W) zero-padded (or, for negative pads, cropped) on D, H, W; contiguous."""
    crop = tuple(
        slice(max(0, -b), n - max(0, -e)) for b, e, n in zip(begin, end, x.shape[1:], strict=True)
    )
    x = x[(slice(None),) + crop]
    if not any(b > 0 or e > 0 for b, e in zip(begin, end, strict=True)):
        return np.ascontiguousarray(x)
    shape = (x.shape[0],) + tuple(
        n + max(0, b) + max(0, e) for n, b, e in zip(x.shape[1:], begin, end, strict=True)
    )
    xp = np.zeros(shape, x.dtype)
    inner = tuple(slice(max(0, b), max(0, b) + n) for b, n in zip(begin, x.shape[1:], strict=True))
    xp[(slice(None),) + inner] = x
    return xp


def unfolder(x: np.ndarray, win: Window) -> Callable[[np.ndarray, int, int], None]:
    """The im2col unfold of one image ``x`` (C, D, H, W), band by band: ``fill(cols, r0, r1)``
    writes output rows ``r0..r1`` (the second-last output axis) of it into ``cols``
    (C*KD*KH*KW, OD*(r1-r0)*OW). What every band reads is made here, once.

    Row ``(c, i, j, l)`` holds, for every output pixel, the input element under kernel tap
    ``(i, j, l)``. After padding, that is a strided view of the input (offset by the tap times
    the dilation, stepping by the stride), so a band is one strided copy; numpy's copy loop
    measured about twice as fast as a numba loop over rows (no per-element bounds tests, and no
    thread contention with the BLAS threads that run right after). Long strided output rows
    (image stems) unfold in numba instead, from the image split into its phases, without the
    pad (:mod:`.unfold`).
    """
    k3, st3, di3, pb3 = win.as3()
    lead = MAX_SPATIAL - len(win.out)
    od, _, ow = (1,) * lead + win.out
    if unfold.fits(x.dtype, int(st3[2]), win.out[-1]):  # long strided rows: no pad, no gather
        split, width = unfold.phases(x, st3[2]), x.shape[-1]

        def fill_phases(cols: np.ndarray, r0: int, r1: int) -> None:
            pb = pb3.copy()
            pb[1] -= r0 * st3[1]  # output row r0 is row 0 of a pad r0 strides shorter
            unfold.fill(split, width, k3, st3, di3, pb, cols.reshape(len(cols), od, r1 - r0, ow))

        return fill_phases
    xp = _padded(x, pb3.tolist(), [0] * lead + list(win.pads_end))
    s = xp.strides
    # Every index stays inside xp: (k - 1) * dilation + (out - 1) * stride < padded length.
    view = np.ndarray(
        (x.shape[0], *k3.tolist(), *((1,) * lead + win.out)),
        xp.dtype,
        buffer=xp,
        strides=(
            s[0],
            *(s[a + 1] * int(di3[a]) for a in range(3)),
            *(s[a + 1] * int(st3[a]) for a in range(3)),
        ),
    )

    def fill_view(cols: np.ndarray, r0: int, r1: int) -> None:
        band = view[..., r0:r1, :]
        np.copyto(cols.reshape(band.shape), band)

    return fill_view


#: A convolution unfolds and multiplies its output rows in :data:`BANDS` bands when it has at
#: least :data:`BAND_MACS` multiply-adds and at least half as many output pixels as output
#: channels (:func:`bands`).
BANDS = 2
BAND_MACS = 1 << 23


def bands(m: int, rows: int, win: Window) -> list[int]:
    """Where a convolution of ``m`` output channels and ``rows`` im2col rows (input channels
    per group times kernel taps) cuts its output rows (the second-last output axis) into the
    bands it unfolds and multiplies one at a time: [0, OH] (one band), or :data:`BANDS` bands
    of about equal height for a 2-D (or 1-D) output of at least 2 rows with at least
    :data:`BAND_MACS` multiply-adds and at least ``m / 2`` pixels.

    OpenBLAS's Haswell sgemm sums a product cut by columns in another order than the whole
    (:data:`.blas.KERNELS`), so the bands are part of the arithmetic: they depend on the shape
    alone, never on the host's cores or on the path that runs the launch, and every path runs
    the same bands. Split over the cores (:mod:`.conv_bands`), each band unfolds, multiplies
    and finishes on its own thread, where a split by output channels would pack the whole
    unfolded matrix in each part; with a quarter as many pixels as channels (ResNet-50's 7x7
    layers) the weights are the larger operand, and rows split better."""
    out3 = (1,) * (MAX_SPATIAL - len(win.out)) + win.out
    pixels = math.prod(out3)
    if out3[0] != 1 or out3[1] < BANDS or 2 * pixels < m or m * rows * pixels < BAND_MACS:
        return [0, out3[1]]
    return [out3[1] * k // BANDS for k in range(BANDS + 1)]


def check_conv(
    op: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], attrs: Mapping[str, Any]
) -> int:
    """Validate Conv-style input/weight shapes and ``group``/``kernel_shape``; return group."""
    spatial_rank(op, x_shape)
    if len(w_shape) != len(x_shape):
        raise KernelError(
            op, "", f"weight shape {w_shape} must have the input's rank {len(x_shape)}"
        )
    group = int(attrs.get("group", 1))
    channels, out_channels = x_shape[1], w_shape[0]
    if group < 1 or channels % group or out_channels % group:
        raise KernelError(
            op,
            "",
            f"group={group} must be >= 1 and divide both the input channels "
            f"({channels}) and the output channels ({out_channels})",
        )
    if w_shape[1] * group != channels:
        raise KernelError(
            op,
            "",
            f"weight shape {w_shape} takes {w_shape[1]} channels per group, but the input "
            f"has {channels} channels in {group} group(s) ({channels // group} per group)",
        )
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != tuple(w_shape[2:]):
        raise KernelError(
            op,
            "",
            f"kernel_shape={list(attrs['kernel_shape'])} does not match the weight's "
            f"spatial dims {list(w_shape[2:])}",
        )
    return group


def geometry(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
             attrs: Mapping[str, Any]) -> tuple[int, Window]:
    """Conv's group and window for these shapes and attributes (:func:`check_conv`,
    :func:`window`), computed once per distinct (shapes, attributes): a program runs the same
    launch every time, and the checks cost more than a small convolution's arithmetic."""
    try:
        key = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
        hash(key)
    except TypeError:  # an unhashable attribute value: no cache
        return _geometry(x_shape, w_shape, tuple(attrs.items()))
    return _cached_geometry(x_shape, w_shape, key)


def _geometry(x_shape, w_shape, items) -> tuple[int, Window]:
    attrs = dict(items)
    group = check_conv("Conv", x_shape, w_shape, attrs)
    return group, window("Conv", x_shape[2:], w_shape[2:], attrs)


_cached_geometry = functools.lru_cache(maxsize=4096)(_geometry)


def pointwise(group: int, win: Window) -> bool:
    """Whether a convolution is 1x1 without padding: its receptive fields are the (strided)
    pixels themselves, and each image is one GEMM (:func:`pointwise_columns`)."""
    return group == 1 and all(k == 1 for k in win.kernel) and \
        not any(win.pads_begin + win.pads_end)


def pointwise_pixels(x5: np.ndarray, win: Window) -> np.ndarray:
    """The (N, C, OD, OH, OW) view of ``x5`` (N, C, D, H, W) holding the pixels a
    :func:`pointwise` convolution reads: every stride-th one."""
    _, st3, _, _ = win.as3()
    out3 = (1,) * (MAX_SPATIAL - len(win.out)) + win.out
    return x5[:, :, :: st3[0], :: st3[1], :: st3[2]][:, :, : out3[0], : out3[1], : out3[2]]


def pointwise_columns(x5: np.ndarray, win: Window) -> list[np.ndarray]:
    """Each image of ``x5`` (N, C, D, H, W) as the (C, pixels) matrix a :func:`pointwise`
    convolution multiplies: a view of ``x5`` when its strides allow, else a copy."""
    return [image.reshape(x5.shape[1], -1) for image in pointwise_pixels(x5, win)]


def pointwise_products(w2: np.ndarray, columns: Sequence[np.ndarray], y: np.ndarray) -> None:
    """``y[i] = w2 @ columns[i]`` for each image ``i`` of ``y`` (N, M, pixels)."""
    with np.errstate(all="ignore"):  # inf/NaN inputs give inf/NaN, not warnings
        for i, cols in enumerate(columns):  # 2-D products: BLAS without a batch loop
            blas.matmul(w2, cols, out=y[i])


def conv_nd(
    x: np.ndarray, w: np.ndarray, group: int, win: Window, op: str = "Conv",
    into: np.ndarray | None = None,
) -> np.ndarray:
    """Grouped N-d correlation of ``x`` (N, C, *S) with ``w`` (M, C/group, *K), no bias.

    Shapes must already be validated (:func:`check_conv`, :func:`window`); ``x`` and ``w`` share
    the compute dtype (float32, or float64 for exact integer convolution). ``op`` names the
    kernel in a :class:`KernelError` when the output or a temporary would exceed the size limit.
    The result is ``into`` when given (C-contiguous, the output's shape and ``x``'s dtype,
    sharing no memory with ``x`` or ``w``), else a new array.
    """
    n, c = x.shape[:2]
    m = w.shape[0]
    k3, st3, di3, pb3 = win.as3()
    out3 = (1,) * (MAX_SPATIAL - len(win.out)) + win.out
    pixels = math.prod(out3)
    check_elements(op, "output", (n, m) + win.out)
    x5 = np.ascontiguousarray(as5d(x))
    if pointwise(group, win):
        y = np.empty((n, m, pixels), x.dtype) if into is None else into.reshape(n, m, pixels)
        pointwise_products(w.reshape(m, c), pointwise_columns(x5, win), y)
        return y.reshape((n, m) + win.out)
    if group == 1 and direct_fits(c, w.shape, win, x.dtype):
        y = np.empty((n, m, *win.out), x.dtype) if into is None else into.reshape(n, m, *win.out)
        _direct(x5[:, :, 0], w, win, y)
        return y
    if group > 1 and w.shape[1] == 1:
        y5 = depthwise(x5, np.ascontiguousarray(as5d(w)), st3, di3, pb3, out3, into)
        return y5.reshape((n, m) + win.out)
    rows = c * int(np.prod(k3))
    # pads, strides and dilations size the temporaries too, not only the output
    padded = [d + b + e for d, b, e in zip(x.shape[2:], win.pads_begin, win.pads_end, strict=True)]
    check_elements(op, "padded input image", [c, *padded])
    check_elements(op, "im2col matrix", (rows, pixels))
    wg = w.reshape(group, m // group, rows // group)
    y = np.empty((n, group, m // group, pixels), x.dtype) if into is None else \
        into.reshape(n, group, m // group, pixels)
    step, cuts, width = rows // group, bands(m, rows // group, win), pixels // out3[1]
    for i in range(n):
        fill = unfolder(x5[i], win)
        for r0, r1 in itertools.pairwise(cuts):
            cols = scratch((rows, (r1 - r0) * width), x.dtype)
            fill(cols, r0, r1)
            for g in range(group):
                blas.matmul(wg[g], cols[g * step : (g + 1) * step],
                            out=y[i, g, :, r0 * width : r1 * width])
    return y.reshape((n, m) + win.out)


#: A convolution of at most this many input channels (an image stem: 1 to 4) with a square 3x3
#: or 5x5 kernel runs directly (:func:`npu_sim.kernels.taps.direct`) rather than as an unfold
#: and a GEMM whose 27-long reduction (3 channels of 3x3) OpenBLAS's AVX2 kernels run badly.
DIRECT_CHANNELS = 4


def direct_fits(c: int, w_shape: tuple[int, ...], win: Window, dtype: np.dtype) -> bool:
    """Whether a group-1 convolution of ``c`` input channels and weights ``w_shape`` over
    ``win`` runs directly: 2-D, a square kernel of :data:`.taps.SIZES`, equal strides, no
    dilation, float32 or float64 (numba has no float16 arrays)."""
    k = w_shape[-1]
    return (c <= DIRECT_CHANNELS and len(win.kernel) == 2 and win.kernel == (k, k)
            and k in taps.SIZES and win.strides[0] == win.strides[1] and win.dilations == (1, 1)
            and dtype in (np.float32, np.float64))


def _direct(x: np.ndarray, w: np.ndarray, win: Window, y: np.ndarray) -> None:
    """:func:`direct_fits` convolution of ``x`` (N, C, H, W) into ``y`` (N, M, OH, OW): each
    image split into its phases once, then its output channels, on one thread (a prepared
    launch with an output buffer splits by channels with its epilogue, :mod:`.conv_parts`)."""
    phases, channels = direct_steps(x, w, win)
    for i in range(x.shape[0]):
        channels(phases(i), 0, y.shape[1], y[i])


def direct_steps(x: np.ndarray, w: np.ndarray, win: Window
                 ) -> tuple[Callable[[int], np.ndarray],
                            Callable[[np.ndarray, int, int, np.ndarray], None]]:
    """The two steps of a :func:`direct_fits` convolution: ``phases(i)`` splits image ``i`` of
    ``x`` into its phases (:func:`.taps.phases`), ``channels(flat, lo, hi, out)`` computes
    output channels ``lo..hi`` of that image from them into ``out`` (:func:`.taps.direct`)."""
    k, s = win.kernel[0], win.strides[0]
    rows, pitch, span = taps.geometry(k, s, *win.out)
    o = taps.offsets(k, s, rows, pitch)
    wk = np.ascontiguousarray(w.reshape(w.shape[0], x.shape[1], k * k))
    size = s * s * rows * pitch

    def phases(i: int) -> np.ndarray:
        return taps.phases(x[i], s, win.pads_begin[0], win.pads_begin[1], rows, pitch,
                           taps.rounded(span))

    def channels(flat: np.ndarray, lo: int, hi: int, out: np.ndarray) -> None:
        taps.direct(flat, size, pitch, o, wk[lo:hi], out, 0, out.shape[1])

    return phases, channels


def add_bias(y: np.ndarray, bias: np.ndarray) -> None:
    """``y[:, m] += bias[m]`` in place, for a contiguous ``y`` of shape (N, M, *spatial).

    Viewed as (N, M, pixels) so numpy's inner loop runs over all pixels of a channel; a 4-D
    broadcast would run it over one image row (7 to 56 elements here) and measured slower.
    """
    flat = y.reshape(y.shape[0], y.shape[1], -1)
    np.add(flat, bias[:, None], out=flat)


def _bias(op: str, b: np.ndarray | None, m: int) -> np.ndarray | None:
    if b is None:
        return None
    if b.shape != (m,):
        raise KernelError(op, "", f"bias shape {b.shape} must be ({m},), one per output channel")
    return to_compute(op, "B", b)


def _inputs(op: str, inputs: Sequence[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray, Any]:
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        raise KernelError(op, "", f"needs inputs X and W, got {len(inputs)} inputs")
    return inputs[0], inputs[1], (inputs[2] if len(inputs) > 2 else None)


def channel_scale(w: np.ndarray, group: int, inputs: Sequence[np.ndarray | None],
                  attrs: Mapping[str, Any]) -> np.ndarray | None:
    """The fused per-input-channel scale (:mod:`npu_sim.epilogue`'s prologue) as a (C,) view,
    or None when its operand is not a float scale of one value per input channel (group 1)."""
    index = input_scale("Conv", attrs)
    s = inputs[index] if 0 <= index < len(inputs) else None
    c = w.shape[1] * group
    if s is None or group != 1 or s.dtype.kind != "f" or s.size != c or \
            any(d != 1 for i, d in enumerate(s.shape) if i != s.ndim - len(w.shape) + 1):
        return None
    return s.reshape(c)


def _scaled_weights(w: np.ndarray, group: int, inputs: Sequence[np.ndarray | None],
                    attrs: Mapping[str, Any]) -> np.ndarray:
    """``w`` times the fused per-input-channel scale (:func:`channel_scale`)."""
    scale = channel_scale(w, group, inputs, attrs)
    if scale is None:
        index = input_scale("Conv", attrs)
        s = inputs[index] if 0 <= index < len(inputs) else None
        c = w.shape[1] * group
        raise KernelError("Conv", "", f"input_scale operand {index} must be a float "
                                      f"per-channel scale of {c} channels, shape (1, {c}, 1, ...)"
                                      f" (group 1); got "
                                      f"{None if s is None else (s.shape, str(s.dtype))}, "
                                      f"group={group}")
    return w * scale.reshape(1, -1, *(1,) * (w.ndim - 2)).astype(np.float32, copy=False)


def prepare_conv(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                 out: Sequence[np.ndarray | None] | None = None) -> Callable[[], list[np.ndarray]]:
    """Conv for these operands, checked and planned once (:attr:`.registry.Kernel.prepare`):
    the geometry, the output buffer and the fused bias loop; what reads values runs per call."""
    x, w, b = _inputs("Conv", inputs)
    dtype = same_dtype("Conv", {"X": x, "W": w, "B": b})
    group, win = geometry(x.shape, w.shape, attrs)
    _bias("Conv", b, w.shape[0])
    into = computes_into(out, (x.shape[0], w.shape[0]) + win.out, dtype)
    fused = None if b is None else fused_bias_loop("Conv", attrs)
    steps = decode("Conv", attrs)  # once: the run only applies them
    scaled = "input_scale" in attrs
    in_place = into is not None and x.dtype == np.float32 and x.flags.c_contiguous and \
        pointwise(group, win)
    gather = None
    if in_place:  # x's columns and the output's rows as views of fixed arrays, made once
        check_elements("Conv", "output", into.shape)
        pixels = pointwise_pixels(as5d(x), win)
        columns = [image.reshape(x.shape[1], -1) for image in pixels]
        rows = into.reshape(into.shape[0], into.shape[1], -1)
        if not all(np.shares_memory(c, x) for c in columns):
            # strided pixels: gathered each call into a buffer made once (the same elements
            # a copy made per call would hold), whose images are the columns
            gathered = np.empty(pixels.shape, x.dtype)
            columns = [image.reshape(x.shape[1], -1) for image in gathered]
            gather = functools.partial(np.copyto, gathered, pixels)

    wide = dtype != np.float32  # float32 operands are computed on as they are
    from . import conv_bands, conv_lean, conv_parts  # lazy: they build on this module

    views = columns if in_place else None
    parts = conv_parts.plan(inputs, attrs, group, win, into, fused, steps, views) or \
        conv_bands.plan(inputs, attrs, group, win, into, fused, steps)
    lean = None if parts is not None else \
        conv_lean.plan(inputs, attrs, group, win, into, fused, steps, views)

    def run() -> list[np.ndarray]:
        if gather is not None:
            gather()
        if parts is not None and parts():
            return [into]
        if lean is not None and lean():
            return [into]
        bias = _bias("Conv", b, w.shape[0]) if wide else b
        w32 = to_compute("Conv", "W", w) if wide else w
        if scaled:
            w32 = _scaled_weights(w32, group, inputs, attrs)
        if in_place:
            pointwise_products(w32.reshape(w.shape[0], -1), columns, rows)
            y = into
        else:
            y = conv_nd(to_compute("Conv", "X", x), w32, group, win, into=into)
        if bias is not None:
            if fused is not None and fused(y, bias):
                return [landed(into, rounded(y, dtype))]
            add_bias(y, bias)
        return [landed(into, finish(y, attrs, dtype, "Conv", inputs, steps))]

    return run


@kernel("Conv", writes_into=True, prepare=prepare_conv)
def conv(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
         out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """ONNX Conv (1-3 spatial dims, groups, depthwise, dilations, pads/auto_pad, bias);
    ``out``: see :attr:`.registry.Kernel.writes_into`."""
    return prepare_conv(inputs, attrs, out)()
