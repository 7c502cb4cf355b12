"""Kernels: MaxPool, AveragePool, the global pools and LRN.

Pools run on the vector unit: each output element reduces one window of its channel, so the
kernels are direct numba loops over (batch, channel) planes. They are not numba parallel loops: a
pool sits between BLAS-backed convolutions, whose threads keep spinning after each GEMM, and a
parallel loop there fought them for the cores (measured slower end to end on ResNet-50). A
large MaxPool without indices splits its planes over the kernels' own helper threads instead
(:func:`.blas.spread`, :data:`SPLIT_ELEMENTS`), which the convolutions around it use too.
Windows come from :func:`npu_sim.kernels.conv.window` (``pads``, ``auto_pad``, ``strides``,
``dilations``, ``ceil_mode``), on 1-, 2- and 3-D spatial inputs viewed as 3-D. Float16 and
bfloat16 inputs are reduced in float32 and rounded once; MaxPool also takes int8 and uint8, whose
values float32 holds exactly.

MaxPool's optional second output holds, for every output element, the flat index of the input
element it took: ``(n * C + c) * D*H*W + spatial offset``, the offset in row-major order
(``storage_order=0``) or column-major order (``storage_order=1``), ignoring padding.
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from ..errors import KernelError
from . import blas
from .conv import MAX_SPATIAL, Window, as5d, spatial_rank, window
from .gemm import FLOAT_DTYPES, computes_into, to_compute
from .limits import check_elements
from .registry import kernel

_MAXPOOL_DTYPES = FLOAT_DTYPES + (np.dtype(np.int8), np.dtype(np.uint8))

#: A MaxPool without indices whose input has at least this many elements splits its planes
#: over the cores (each plane's maxima are its own, so the same bits). Medians of 300, one
#: image, 3x3 stride 2, whole against split: ResNet-50's 64 planes of 112x112 537 against 331
#: us, 64 of 56x56 182 against 158, but 32 of 56x56 90 against 100 and 64 of 28x28 72
#: against 92.
SPLIT_ELEMENTS = 1 << 18


@njit(cache=True, inline="always")
def _taps(o, stride, pad, dil, kernel, size):  # pragma: no cover - compiled
    """Range [lo, hi) of kernel taps whose input coordinate o*stride - pad + tap*dil is in
    [0, size): the loops below then need no bounds test per tap."""
    start = o * stride - pad
    lo = 0 if start >= 0 else (-start + dil - 1) // dil
    hi = (size - 1 - start) // dil + 1 if size - 1 >= start else 0
    return start, lo, max(lo, min(kernel, hi))


def _empty(dims: tuple[int, ...], rank: int, col_major: bool) -> int:
    """The index onnxruntime gives a window that holds only padding: its per-rank offset
    formula with every coordinate left at -1 (``dims`` the (D, H, W) view of the input)."""
    d, h, w = dims
    if rank == 1:
        return -1
    if rank == 2:
        return -1 - h if col_major else -w - 1
    return -1 - d - d * h if col_major else -h * w - w - 1


@njit(cache=True)
def _max_pool(x, k, st, di, pb, col_major, empty, out, idx):  # pragma: no cover - compiled
    """x (P, D, H, W) float32 -> out, idx (P, OD, OH, OW); padding never wins. A window with
    no input element in it gets the lowest float and index ``empty`` (see :func:`_empty`)."""
    P, D, H, W = x.shape
    OD, OH, OW = out.shape[1], out.shape[2], out.shape[3]
    kd, kh, kw = k[0], k[1], k[2]
    sd, sh, sw = st[0], st[1], st[2]
    dd, dh, dw = di[0], di[1], di[2]
    pd, ph, pw = pb[0], pb[1], pb[2]
    lowest = np.float32(-3.4028234663852886e38)
    for t in range(P):
        plane = x[t]
        for a in range(OD):
            z0, i_lo, i_hi = _taps(a, sd, pd, dd, kd, D)
            for b in range(OH):
                y0, j_lo, j_hi = _taps(b, sh, ph, dh, kh, H)
                for e in range(OW):
                    x0, l_lo, l_hi = _taps(e, sw, pw, dw, kw, W)
                    best = lowest
                    where = empty
                    for i in range(i_lo, i_hi):
                        z = z0 + i * dd
                        for j in range(j_lo, j_hi):
                            y = y0 + j * dh
                            for lw in range(l_lo, l_hi):
                                v = plane[z, y, x0 + lw * dw]
                                if v > best:
                                    best = v
                                    where = (z * H + y) * W + x0 + lw * dw
                    if col_major and where >= 0:  # row-major offset -> column-major offset
                        z, rest = where // (H * W), where % (H * W)
                        where = z + (rest // W + (rest % W) * H) * D
                    out[t, a, b, e] = best
                    idx[t, a, b, e] = t * D * H * W + where


@njit(cache=True, inline="always")
def _row_edge(row, e, sw, pw, dw, kw, lowest):  # pragma: no cover - compiled
    """Output column ``e``'s maximum over the in-bounds taps of one input row."""
    x0, lo, hi = _taps(e, sw, pw, dw, kw, row.size)
    best = lowest
    for lw in range(lo, hi):
        v = row[x0 + lw * dw]
        if v > best:
            best = v
    return best


@njit(cache=True, nogil=True)
def _max_rows(x, k, st, di, pb, out):  # pragma: no cover - compiled
    """x (P, H, W) float32 -> out (P, OH, OW): :func:`_max_pool`'s maxima of a 1- or 2-D
    pool, without the indices, in two passes: each input row's maxima over the horizontal
    taps, then each output row's over the vertical ones.

    The same values, bits included: a window's result is its greatest non-NaN element (the
    first of equal ones in row-major order, so -0.0 and +0.0 come out as they do there) or
    the lowest float. The passes run along contiguous rows with a select (``v > c``), which
    vectorises, the inner columns' taps in bounds by construction; strided columns are
    indexed unsigned (numba's wraparound test on a signed index blocked the vectoriser)."""
    P, H, W = x.shape
    OH, OW = out.shape[1], out.shape[2]
    kh, kw, sh, sw, dh, dw, ph, pw = k[0], k[1], st[0], st[1], di[0], di[1], pb[0], pb[1]
    lowest = np.float32(-3.4028234663852886e38)
    rows = np.empty((H, OW), np.float32)
    inner_lo = min(OW, -(-pw // sw))  # columns whose taps are all in bounds
    inner_hi = max(inner_lo, min(OW, (W - 1 + pw - (kw - 1) * dw) // sw + 1))
    inner, step = inner_hi - inner_lo, np.uint64(sw)
    for t in range(P):
        plane = x[t]
        for y in range(H):
            row, best = plane[y], rows[y]
            run = best[inner_lo:inner_hi]
            for lw in range(kw):
                src = row[inner_lo * sw - pw + lw * dw:]
                for q in range(inner):
                    v = src[np.uint64(q) * step]
                    c = run[q] if lw else lowest
                    run[q] = v if v > c else c
            for e in range(inner_lo):
                best[e] = _row_edge(row, e, sw, pw, dw, kw, lowest)
            for e in range(inner_hi, OW):
                best[e] = _row_edge(row, e, sw, pw, dw, kw, lowest)
        for b in range(OH):
            y0, j_lo, j_hi = _taps(b, sh, ph, dh, kh, H)
            dst = out[t, b]
            dst[:] = lowest
            for j in range(j_lo, j_hi):
                src = rows[y0 + j * dh]
                for e in range(OW):
                    v, c = src[e], dst[e]
                    dst[e] = v if v > c else c


@njit(cache=True)
def _avg_pool(x, k, st, di, pb, limit, include_pad, out):  # pragma: no cover - compiled
    """x (P, D, H, W) float32 -> out (P, OD, OH, OW).

    The divisor counts in-bounds taps, or with ``include_pad`` every tap that falls before
    ``limit`` (the input extent plus the end padding, so ceil-mode overhang is not counted).
    """
    P, D, H, W = x.shape
    OD, OH, OW = out.shape[1], out.shape[2], out.shape[3]
    kd, kh, kw = k[0], k[1], k[2]
    sd, sh, sw = st[0], st[1], st[2]
    dd, dh, dw = di[0], di[1], di[2]
    pd, ph, pw = pb[0], pb[1], pb[2]
    for t in range(P):
        plane = x[t]
        for a in range(OD):
            z0, i_lo, i_hi = _taps(a, sd, pd, dd, kd, D)
            pad_d = _taps(a, sd, 0, dd, kd, limit[0] + pd)[2] if include_pad else 0
            for b in range(OH):
                y0, j_lo, j_hi = _taps(b, sh, ph, dh, kh, H)
                pad_h = _taps(b, sh, 0, dh, kh, limit[1] + ph)[2] if include_pad else 0
                for e in range(OW):
                    x0, l_lo, l_hi = _taps(e, sw, pw, dw, kw, W)
                    acc = np.float32(0.0)
                    for i in range(i_lo, i_hi):
                        for j in range(j_lo, j_hi):
                            row = plane[z0 + i * dd, y0 + j * dh]
                            for lw in range(l_lo, l_hi):
                                acc += row[x0 + lw * dw]
                    if include_pad:
                        divisor = pad_d * pad_h * _taps(e, sw, 0, dw, kw, limit[2] + pw)[2]
                    else:
                        divisor = (i_hi - i_lo) * (j_hi - j_lo) * (l_hi - l_lo)
                    out[t, a, b, e] = acc / divisor if divisor > 0 else np.float32(0.0)


def _pool_window(op: str, x: np.ndarray, attrs: Mapping[str, Any]) -> Window:
    """Validate a pool's input and attributes and resolve its window."""
    rank = spatial_rank(op, x.shape)
    if "kernel_shape" not in attrs:
        raise KernelError(op, "", "the kernel_shape attribute is required")
    kernel_shape = tuple(int(v) for v in attrs["kernel_shape"])
    if len(kernel_shape) != rank:
        raise KernelError(
            op,
            "",
            f"kernel_shape={list(kernel_shape)} must have one entry per spatial dim of the "
            f"input shape {x.shape}",
        )
    win = window(op, x.shape[2:], kernel_shape, attrs, ceil_mode=bool(attrs.get("ceil_mode", 0)))
    for pads in (win.pads_begin, win.pads_end):
        if any(p >= k for p, k in zip(pads, kernel_shape, strict=True)):
            raise KernelError(
                op,
                "",
                f"pads {list(win.pads_begin + win.pads_end)} must be smaller than "
                f"kernel_shape {list(kernel_shape)}",
            )
    check_elements(op, "output", x.shape[:2] + win.out)
    return win


def _planes(x32: np.ndarray) -> np.ndarray:
    """``(N, C, *spatial)`` as contiguous ``(N*C, D, H, W)`` planes."""
    x5 = as5d(x32)
    return np.ascontiguousarray(x5.reshape((-1,) + x5.shape[2:]))


def _out3(win: Window) -> tuple[int, ...]:
    return (1,) * (MAX_SPATIAL - len(win.out)) + win.out


def _rounded_max(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """MaxPool's float32 maxima in the input's dtype. A window holding only padding has the
    lowest float, which an integer type takes as its own lowest value, as onnxruntime gives
    (numpy's cast of an out-of-range float is undefined: it gave 0 for int8)."""
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        y = np.clip(y, info.min, info.max)
    return y.astype(dtype)


@kernel("MaxPool", writes_into=True)
def max_pool(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
             out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """ONNX MaxPool; returns ``[Y, Indices]`` (Indices int64, see the module docstring), or
    ``[Y]`` when ``out`` (:attr:`.registry.Kernel.writes_into`) has one entry: a launch
    without Indices, whose 1- and 2-D pools take :func:`_max_rows` (ResNet-50's 64 planes of
    112x112, 3x3 stride 2: 3.5 ms with the indices' loop, 0.5 ms)."""
    x = _one_input("MaxPool", inputs)
    if x.dtype not in _MAXPOOL_DTYPES:
        raise KernelError(
            "MaxPool",
            "",
            f"X has dtype {x.dtype}; expected float32, float16, bfloat16, int8 or uint8",
        )
    storage_order = int(attrs.get("storage_order", 0))
    if storage_order not in (0, 1):
        raise KernelError("MaxPool", "", f"storage_order={storage_order}; expected 0 or 1")
    win = _pool_window("MaxPool", x, attrs)
    k3, st3, di3, pb3 = win.as3()
    planes = _planes(x.astype(np.float32, copy=False))
    shape = x.shape[:2] + win.out
    wanted = 2 if out is None else len(out)
    if wanted == 1 and len(win.out) <= 2:
        into = computes_into(out, shape, np.dtype(x.dtype))
        y = np.empty(shape, np.float32) if into is None else into
        rows, args, maxima = planes[:, 0], (k3[1:], st3[1:], di3[1:], pb3[1:]), \
            y.reshape(-1, *_out3(win)[1:])
        if x.size >= SPLIT_ELEMENTS and len(rows) > 1:
            blas.spread(len(rows), lambda lo, hi: _max_rows(rows[lo:hi], *args, maxima[lo:hi]))
        else:
            _max_rows(rows, *args, maxima)
        return [y if into is not None else _rounded_max(y, x.dtype)]
    y = np.empty((planes.shape[0],) + _out3(win), np.float32)
    idx = np.empty(y.shape, np.int64)
    _max_pool(planes, k3, st3, di3, pb3, storage_order == 1,
              _empty(planes.shape[1:], len(win.out), storage_order == 1), y, idx)
    return [_rounded_max(y.reshape(shape), x.dtype), idx.reshape(shape)][:wanted]


@kernel("AveragePool")
def average_pool(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX AveragePool (``count_include_pad``, ``ceil_mode``, ``dilations``, ``auto_pad``)."""
    x = _one_input("AveragePool", inputs)
    x32 = to_compute("AveragePool", "X", x)
    win = _pool_window("AveragePool", x, attrs)
    k3, st3, di3, pb3 = win.as3()
    lead = MAX_SPATIAL - len(win.out)
    in3 = as5d(x).shape[2:]
    pe3 = (0,) * lead + win.pads_end
    limit = np.array([i + p for i, p in zip(in3, pe3, strict=True)], np.int64)
    planes = _planes(x32)
    out = np.empty((planes.shape[0],) + _out3(win), np.float32)
    include = bool(int(attrs.get("count_include_pad", 0)))
    _avg_pool(planes, k3, st3, di3, pb3, limit, include, out)
    return [out.reshape(x.shape[:2] + win.out).astype(x.dtype)]


def _global(op: str, inputs: Sequence[np.ndarray | None]) -> tuple[np.ndarray, tuple[int, ...]]:
    x = _one_input(op, inputs)
    if x.ndim < 3:
        raise KernelError(op, "", f"input of shape {x.shape} needs rank >= 3 (N, C, *spatial)")
    return x, tuple(range(2, x.ndim))


#: Whether MLAS adds its four running sums pairwise in neighbours, (first + second) + (third
#: + fourth), as its ARM NEON reduction does, rather than (first + third) + (second + fourth),
#: as its SSE/AVX one does (``MlasReduceAddFloat32x4``).
_NEIGHBOUR_PAIRS = platform.machine().lower() in ("aarch64", "arm64")


@njit(cache=True, nogil=True, error_model="numpy")
def _plane_means(planes, neighbours, out):  # pragma: no cover - compiled
    """``out[p]``: the mean of row ``p`` of ``planes`` (P, n) float32, in the order of
    onnxruntime's MLAS global pooling kernel: four running sums from 0 over the elements in
    fours, added pairwise (:data:`_NEIGHBOUR_PAIRS` says which pairs), then the rest one by
    one, divided by ``n`` (0 / 0, NaN, for an empty row)."""
    n = planes.shape[1]
    size = np.float32(n)
    fours = n - n % 4
    for p in range(planes.shape[0]):
        row = planes[p]
        a0 = a1 = a2 = a3 = np.float32(0)
        for i in range(0, fours, 4):
            a0 += row[i]
            a1 += row[i + 1]
            a2 += row[i + 2]
            a3 += row[i + 3]
        total = (a0 + a1) + (a2 + a3) if neighbours else (a0 + a2) + (a1 + a3)
        for i in range(fours, n):
            total += row[i]
        out[p] = total / size


def prepare_global_average_pool(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                                out: Sequence[np.ndarray | None] | None = None
                                ) -> Callable[[], list[np.ndarray]]:
    """GlobalAveragePool for these operands (:attr:`.registry.Kernel.prepare`): a float32,
    C-contiguous input into an ``out=`` buffer is one call of :func:`_plane_means` over views
    made once (a squeeze-excite's pool spent 30-40 us of a run around its 5-10 us loop); any
    other launch runs :func:`global_average_pool` each call."""
    x, _ = _global("GlobalAveragePool", inputs)
    n, c = x.shape[:2]
    into = computes_into(out, (n, c) + (1,) * (x.ndim - 2), np.dtype(x.dtype))
    if into is None or x.dtype != np.float32 or not x.flags.c_contiguous:
        return lambda: global_average_pool(inputs, attrs, out)
    planes, means = x.reshape(n * c, math.prod(x.shape[2:])), into.reshape(n * c)

    def run() -> list[np.ndarray]:
        _plane_means(planes, _NEIGHBOUR_PAIRS, means)
        return [into]

    return run


@kernel("GlobalAveragePool", writes_into=True, prepare=prepare_global_average_pool)
def global_average_pool(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
    out: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """ONNX GlobalAveragePool: the mean over all spatial dims, kept as size-1 dims; ``out``:
    see :attr:`.registry.Kernel.writes_into`.

    onnxruntime's bits (:func:`_plane_means`, MLAS's order on x86-64 and ARM64), as its CPU
    provider gives them at every optimization level but where its NCHWc layout transform
    takes the node (level LAYOUT and above, x86-64, a channel count the machine's channel
    block, 8 or 16, divides), whose kernel sums each plane in order. numpy's pairwise sum,
    used before, was an ulp or so off, which a float16 graph's ``x - Cast(Cast(x))`` makes
    thousands of fp16 ulps (a property-test seed found it). One numba call: a squeeze-excite's
    576 planes of 7x7 4.5 against 15 us.
    """
    x, axes = _global("GlobalAveragePool", inputs)
    n, c = x.shape[:2]
    planes = to_compute("GlobalAveragePool", "X", x).reshape(n * c, math.prod(x.shape[2:]))
    shape = (n, c) + (1,) * len(axes)
    into = computes_into(out, shape, np.dtype(x.dtype))
    means = np.empty(n * c, np.float32) if into is None else into.reshape(n * c)
    _plane_means(np.ascontiguousarray(planes), _NEIGHBOUR_PAIRS, means)
    return [into if into is not None else means.reshape(shape).astype(x.dtype)]


@kernel("GlobalMaxPool")
def global_max_pool(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX GlobalMaxPool: the maximum over all spatial dims, kept as size-1 dims."""
    x, axes = _global("GlobalMaxPool", inputs)
    y = to_compute("GlobalMaxPool", "X", x).max(axis=axes, keepdims=True)
    return [y.astype(x.dtype)]


@kernel("LRN")
def lrn(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> list[np.ndarray]:
    """ONNX LRN: ``x / (bias + alpha / size * sum of x^2 over nearby channels) ** beta``."""
    x = _one_input("LRN", inputs)
    if x.ndim < 3:
        raise KernelError("LRN", "", f"input of shape {x.shape} needs rank >= 3 (N, C, ...)")
    if "size" not in attrs or int(attrs["size"]) < 1:
        raise KernelError("LRN", "", f"size={attrs.get('size')!r}; expected an integer >= 1")
    size = int(attrs["size"])
    alpha = np.float32(attrs.get("alpha", 1e-4))
    beta = np.float32(attrs.get("beta", 0.75))
    bias = np.float32(attrs.get("bias", 1.0))
    x32 = to_compute("LRN", "X", x)
    sq = x32 * x32
    channels = x.shape[1]
    total = np.zeros_like(sq)
    # Window [c - floor((size-1)/2), c + ceil((size-1)/2)], clipped to the channel range.
    for off in range(-((size - 1) // 2), math.ceil((size - 1) / 2) + 1):
        lo, hi = max(0, -off), min(channels, channels - off)
        if lo < hi:
            total[:, lo:hi] += sq[:, lo + off : hi + off]
    y = x32 / (bias + (alpha / np.float32(size)) * total) ** beta
    return [y.astype(x.dtype)]


def _one_input(op: str, inputs: Sequence[np.ndarray | None]) -> np.ndarray:
    if len(inputs) < 1 or inputs[0] is None:
        raise KernelError(op, "", "needs input X")
    return inputs[0]
