"""Kernel: depthwise convolution (one input channel per group), channels-last or planar.

A depthwise convolution has no reduction over channels, so it cannot use a GEMM, and its
spatial rows are short in mobile nets (7 to 112 pixels): a loop vectorised along a row runs
mostly in vector tails. :func:`channels_last_rows` transposes the image once to channels-last
``(N, D, H, W, C)`` and vectorises along the channels instead (16 to 1152 of them, contiguous):
each output pixel adds its in-bounds taps, in (i, j, l) order as a loop per element would, each
tap one multiply-add over the whole channel vector; the result is transposed back. Best of 10
on MobileNet-V3's and EfficientNet-B0's layers against the planar row loop it replaced (the
transposes included): 240 channels of 28x28 5x5 0.6 against 5.7 ms, 144 of 56x56 5x5 1.9
against 9.7 ms, 96 of 112x112 3x3 4.2 against 11.0 ms, 32 of 112x112 1.3 against 3.1 ms.
Few channels of large planes (:func:`planar`) skip the transposes instead: :func:`_planes`
vectorises along the output rows, in the same tap order (same bits).

The mobile nets' 3x3 and 5x5 kernels on planes of 14x14 outputs and more (:func:`tapped`) run
neither: :func:`npu_sim.kernels.taps.depthwise` splits each plane into its stride phases and
sums each element's taps in registers along the flattened plane, storing it once, where the
loops above load and store the output once per tap. Same tap order, same bits. Best of 60 on
EfficientNet-B0's and MobileNet-V3's layers, one image, against the loop each replaced (ranges
over two sessions): 96 channels of 112x112 3x3 stride 2 0.31-0.53 against 1.57-1.76 ms, 144 of
56x56 3x3 0.19-0.30 against 0.87-0.90, 16 of 112x112 3x3 stride 2 0.09 against 0.28
(onnxruntime, one thread: 0.05), 88 of 28x28 3x3 0.06 against 0.17 (0.04), 240 of 14x14 5x5
0.10-0.11 against 0.13-0.14 (0.05). Smaller planes (7x7, or 14x14 at stride 2) stay on the loops
above, which they measured faster (:data:`TAPPED_PIXELS`), as do other kernels, dilations,
3-D and non-finite weights.

A channel multiplier (``M = C * mult`` output channels) repeats every input channel ``mult``
times first, so output channel ``m`` reads input channel ``m // mult`` as ONNX defines. Output
rows are independent: a large convolution is split by rows over the calling thread and the
kernels' helper threads (:func:`npu_sim.kernels.blas.spread`); numba's own parallel loop fought
OpenBLAS's spinning threads (measured slower end to end on ResNet-50). A prepared Conv on
phase-split planes splits by channels with its epilogue instead (:mod:`.conv_parts`).
The loop does the planar loop's float32 multiply-adds in the same order, so the values are the
same bits as before: no fastmath.
"""

from __future__ import annotations

import math

import numpy as np
from numba import carray, njit

from . import blas, taps
from .native import (
    PART,
    address,
    address_of,
    compiled,
    contiguous_float32,
    epilogue,
    optional_address,
    record,
)

#: Depthwise convolutions of at least this many MACs run on the kernels' threads (smaller
#: ones measured slower split than whole on a busy 2-core machine: 240 channels of 14x14, 5x5).
SPLIT_MACS = 1 << 21


@njit(cache=True, nogil=True, error_model="numpy")
def channels_last_rows(x, w, st, di, pb, out, lo, hi):  # pragma: no cover - compiled
    """Output rows ``lo..hi`` (of N*OD*OH) of out (N, OD, OH, OW, M), which is zero-filled.

    x (N, D, H, W, M) and w (KD, KH, KW, M) are channels-last; every tap outside the input is
    skipped (padding is never multiplied). The channel loop runs over 1-D views, which LLVM
    vectorises (flat indices did not: numba's negative-index wraparound blocked it).
    """
    N, OD, OH, OW, M = out.shape
    D, H, W = x.shape[1], x.shape[2], x.shape[3]
    KD, KH, KW = w.shape[0], w.shape[1], w.shape[2]
    for r in range(lo, hi):
        n = r // (OD * OH)
        a = (r // OH) % OD
        b = r % OH
        for e in range(OW):
            acc = out[n, a, b, e]
            for i in range(KD):
                z = a * st[0] - pb[0] + i * di[0]
                if z < 0 or z >= D:
                    continue
                for j in range(KH):
                    y = b * st[1] - pb[1] + j * di[1]
                    if y < 0 or y >= H:
                        continue
                    for lw in range(KW):
                        xx = e * st[2] - pb[2] + lw * di[2]
                        if xx < 0 or xx >= W:
                            continue
                        src = x[n, z, y, xx]
                        tap = w[i, j, lw]
                        for m in range(M):  # contiguous in x, w and out: vectorised
                            acc[m] += src[m] * tap[m]


@njit(cache=True, nogil=True, error_model="numpy")
def _planes(x, w, st, di, pb, out, lo, hi):  # pragma: no cover - compiled
    """Output rows ``lo..hi`` (of N*M*OD*OH) of out (N, M, OD, OH, OW), which is zero-filled.

    x (N, C, D, H, W) and w (M, KD, KH, KW) stay planar (no transposes); output channel ``m``
    reads input channel ``m // (M // C)``. Each tap is one multiply-add along an output row,
    over the columns whose input pixel is in bounds, so every element still adds its in-bounds
    taps in (i, j, l) order: the same bits as :func:`channels_last_rows`.
    """
    N, M, OD, OH, OW = out.shape
    C, D, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW = w.shape[1], w.shape[2], w.shape[3]
    mult = M // C
    for r in range(lo, hi):
        n = r // (M * OD * OH)
        m = (r // (OD * OH)) % M
        a = (r // OH) % OD
        b = r % OH
        acc = out[n, m, a, b]
        for i in range(KD):
            z = a * st[0] - pb[0] + i * di[0]
            if z < 0 or z >= D:
                continue
            for j in range(KH):
                y = b * st[1] - pb[1] + j * di[1]
                if y < 0 or y >= H:
                    continue
                src = x[n, m // mult, z, y]
                for lw in range(KW):
                    off = lw * di[2] - pb[2]
                    e0 = 0 if off >= 0 else (-off + st[2] - 1) // st[2]
                    e1 = min(OW, (W - 1 - off) // st[2] + 1) if W - 1 - off >= 0 else 0
                    if e1 <= e0:
                        continue
                    tap = w[m, i, j, lw]
                    dst = acc[e0:e1]  # views from 0: no negative-index wraparound, vectorised
                    row = src[e0 * st[2] + off:]
                    if st[2] == 1:
                        for e in range(e1 - e0):
                            dst[e] += row[e] * tap
                    else:
                        for e in range(e1 - e0):
                            dst[e] += row[e * st[2]] * tap


#: A 3x3 or 5x5 depthwise convolution runs on phase-split planes (:func:`.taps.depthwise`) when
#: its output plane has at least this many pixels times the stride squared (14x14 at stride 1,
#: 28x28 at stride 2); smaller planes pay more per plane (the split, the copy out) than the
#: channels-last loop pays for its transposes. Best of 60, one image, against the loop each
#: replaced: 96 channels of 112x112 3x3 stride 2 0.53 against 1.76 ms, 144 of 56x56 3x3 0.30
#: against 0.90, 16 of 112x112 stride 2 0.09 against 0.28, 88 of 28x28 0.06 against 0.17, 240
#: of 28x28 5x5 0.20 against 0.52, 144 of 56x56 5x5 stride 2 0.23 against 0.53, 72 of 56x56
#: stride 2 0.14 against 0.21, 240 of 14x14 5x5 0.11 against 0.14, 480 of 14x14 0.13 against
#: 0.14; but 240 of 28x28 stride 2 0.21 against 0.14, 288 of 14x14 5x5 stride 2 0.14 against
#: 0.06, 576 of 7x7 5x5 0.12 against 0.08, 1152 of 7x7 3x3 0.14 against 0.10.
TAPPED_PIXELS = 14 * 14


def tapped(x5: np.ndarray, w5: np.ndarray, st3: np.ndarray, di3: np.ndarray, pb3: np.ndarray,
           out3: tuple[int, int, int]) -> bool:
    """Whether a depthwise convolution runs on phase-split planes: 2-D (one depth slice, depth
    kernel 1, no depth padding, one output slice), a square kernel of :data:`.taps.SIZES`,
    equal strides, no dilation, an output plane of at least :data:`TAPPED_PIXELS` times the
    stride squared, and finite weights (padding is multiplied as zeros there, and ``inf * 0``
    is NaN)."""
    return tapped_geometry(x5, w5, st3, di3, pb3, out3) and bool(np.isfinite(w5).all())


def tapped_geometry(x5: np.ndarray, w5: np.ndarray, st3: np.ndarray, di3: np.ndarray,
                    pb3: np.ndarray, out3: tuple[int, int, int]) -> bool:
    """:func:`tapped` but for the weights' values: whether the shapes take that path."""
    k, s = w5.shape[3], int(st3[2])
    return (x5.shape[2] == 1 and w5.shape[2] == 1 and pb3[0] == 0 and out3[0] == 1
            and k in taps.SIZES and w5.shape[4] == k and st3[1] == s and not (di3 - 1).any()
            and out3[1] * out3[2] >= TAPPED_PIXELS * s * s)


#: A depthwise convolution runs planar (:func:`_planes`) when its width stride is 1, it has at
#: most this many input channels and at least :data:`PLANAR_PIXELS` output pixels per plane:
#: its channel vectors are too short to pay for the two transposes, its contiguous rows long
#: enough to vectorise. Best of 15, planar against channels-last: 16 channels of 112x112 3x3
#: 0.29 against 0.88 ms, 32 of 112x112 0.64 against 1.38, 24 of 56x56 0.18 against 0.27, 32
#: of 56x56 0.24 against 0.35; but 32 of 40x40 5x5 0.39 against 0.26, 32 of 28x28 0.10
#: against 0.08, 40 of 28x28 5x5 0.29 against 0.17, 144 of 56x56 5x5 2.6 against 1.9, and
#: strided rows gather: 72 of 56x56 5x5 stride 2 1.1 against 0.29. Otherwise channels-last.
PLANAR_CHANNELS = 32
PLANAR_PIXELS = 56 * 56


def planar(c: int, pixels: int, stride_w: int) -> bool:
    """Whether a depthwise convolution of ``c`` input channels, ``pixels`` output pixels per
    plane and width stride ``stride_w`` runs planar rather than channels-last."""
    return stride_w == 1 and c <= PLANAR_CHANNELS and pixels >= PLANAR_PIXELS


def depthwise(x5: np.ndarray, w5: np.ndarray, st3: np.ndarray, di3: np.ndarray,
              pb3: np.ndarray, out3: tuple[int, int, int],
              into: np.ndarray | None = None) -> np.ndarray:
    """Depthwise correlation of ``x5`` (N, C, D, H, W) with ``w5`` (M, 1, KD, KH, KW), no bias.

    ``st3``, ``di3``, ``pb3`` are the 3-D strides, dilations and leading pads (int64 arrays) and
    ``out3`` the 3-D output size; returns a C-contiguous (N, M, *out3) array of ``x5``'s dtype:
    ``into`` (any shape of that size, C-contiguous) when given.
    """
    n, c = x5.shape[:2]
    m = w5.shape[0]
    if tapped(x5, w5, st3, di3, pb3, out3):
        y = np.empty((n, m, *out3), x5.dtype) if into is None else into.reshape(n, m, *out3)
        launch(taps.depthwise, tapped_args(x5, w5, st3, pb3, out3, y), n * m,
                y.size * w5.shape[3] ** 2)
        return y
    if planar(c, math.prod(out3), int(st3[2])):
        y = np.empty((n, m, *out3), x5.dtype) if into is None else into.reshape(n, m, *out3)
        y.fill(0)
        args = x5, np.ascontiguousarray(w5[:, 0]), st3, di3, pb3, y
        launch(_planes, args, n * m * out3[0] * out3[1], y.size * math.prod(w5.shape[2:]))
        return y
    xt = np.ascontiguousarray(x5.transpose(0, 2, 3, 4, 1))
    if m != c:
        xt = np.repeat(xt, m // c, axis=4)
    wt = np.ascontiguousarray(w5[:, 0].transpose(1, 2, 3, 0))
    yt = np.zeros((n, *out3, m), x5.dtype)
    args = xt, wt, st3, di3, pb3, yt
    launch(channels_last_rows, args, n * out3[0] * out3[1], yt.size * math.prod(w5.shape[2:]))
    back = yt.transpose(0, 4, 1, 2, 3)
    if into is None:
        return np.ascontiguousarray(back)
    y = into.reshape(back.shape)
    np.copyto(y, back)
    return y


def tapped_args(x5: np.ndarray, w5: np.ndarray, st3: np.ndarray, pb3: np.ndarray,
                out3: tuple[int, int, int], y: np.ndarray) -> tuple:
    """The arguments of :func:`.taps.depthwise` but its plane range, for a :func:`tapped`
    geometry and its output ``y`` (N, M, *out3)."""
    m, k, s = w5.shape[0], w5.shape[3], int(st3[2])
    rows, pitch, _ = taps.geometry(k, s, out3[1], out3[2])
    return (x5[:, :, 0], w5.reshape(m, k * k), s, int(pb3[1]), int(pb3[2]), rows, pitch,
            taps.offsets(k, s, rows, pitch), y.reshape(y.shape[0], m, *out3)[:, :, 0])


def launch(loop, args: tuple, count: int, macs: int) -> None:
    """``loop(*args, lo, hi)`` over rows ``0..count``: whole below :data:`SPLIT_MACS`, else
    split over the kernels' threads (:func:`npu_sim.kernels.blas.spread`)."""
    if macs < SPLIT_MACS:
        loop(*args, 0, count)
    else:
        blas.spread(count, lambda lo, hi: loop(*args, lo, hi))


# -- a channels-last depthwise convolution's native part (npu_sim.kernels.native) -------------

#: The record of :func:`_channels_last_part` (int64 slots), then its ``parts + 1`` channel
#: edges, then each part's scratch buffer (:func:`channels_last_record`).
(_X, _N, _M, _D, _H, _W, _WEIGHTS, _KD, _KH, _KW, _WINDOW, _OUT, _OD, _OH, _OW, _EPILOGUE,
 _BIAS, _PARAMS, _PARTS) = range(19)
_HEAD = 19


def _channels_last_part(record, part):  # pragma: no cover - numba
    """Channels ``edges[part]:edges[part + 1]`` of a depthwise convolution of one output channel
    per input channel, channels-last as :func:`depthwise` runs it: those channels of the input
    and weights transposed into the part's own buffer, :func:`channels_last_rows` on every
    output row from zeros, the result transposed back, then the epilogue loop on it. A channel
    is one lane of the channel loop whatever the others are, so the same bits."""
    h = carray(record, (_HEAD,), np.int64)
    parts = h[_PARTS]
    tail = carray(record, (_HEAD + 2 * parts + 1,), np.int64)
    lo, hi = tail[_HEAD + part], tail[_HEAD + part + 1]
    n, m, d, hh, ww, kd, kh, kw = h[_N], h[_M], h[_D], h[_H], h[_W], h[_KD], h[_KH], h[_KW]
    od, oh, ow, mk = h[_OD], h[_OH], h[_OW], hi - lo
    window = carray(address(h[_WINDOW]), (9,), np.int64)
    x = carray(address(h[_X]), (n, m, d, hh, ww), np.float32)
    w = carray(address(h[_WEIGHTS]), (m, kd, kh, kw), np.float32)
    out = carray(address(h[_OUT]), (n, m, od, oh, ow), np.float32)
    sx, sw, sy = n * d * hh * ww * mk, kd * kh * kw * mk, n * od * oh * ow * mk
    buf = carray(address(tail[_HEAD + parts + 1 + part]), (sx + sw + sy,), np.float32)
    xt = buf[:sx].reshape((n, d, hh, ww, mk))
    wt = buf[sx:sx + sw].reshape((kd, kh, kw, mk))
    yt = buf[sx + sw:].reshape((n, od, oh, ow, mk))
    for c in range(mk):
        for i in range(n):
            for z in range(d):
                for y in range(hh):
                    for e in range(ww):
                        xt[i, z, y, e, c] = x[i, lo + c, z, y, e]
        for z in range(kd):
            for y in range(kh):
                for e in range(kw):
                    wt[z, y, e, c] = w[lo + c, z, y, e]
    yt[:] = 0
    channels_last_rows(xt, wt, window[0:3], window[3:6], window[6:9], yt, 0, n * od * oh)
    for i in range(n):
        for c in range(mk):
            for z in range(od):
                for y in range(oh):
                    for e in range(ow):
                        out[i, lo + c, z, y, e] = yt[i, z, y, e, c]
        epilogue(h[_EPILOGUE], h[_OUT] + (i * m + lo) * od * oh * ow * 4, h[_BIAS] + lo * 4, 0,
                 h[_PARAMS], mk, od * oh * ow)


def channels_last_part() -> int:
    """The address of a channels-last depthwise convolution's :data:`.native.PART`
    (:func:`.native.compiled`); its record is :func:`channels_last_record`'s."""
    return compiled(PART, _channels_last_part)


def channels_last_record(x5: np.ndarray, w4: np.ndarray, window: np.ndarray, y: np.ndarray,
                         bias: np.ndarray, loop: int, params: np.ndarray | None,
                         edges: list[int]) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """The record of a channels-last depthwise convolution's native parts and the scratch
    buffers it points to (the caller keeps both, and the arrays, alive while it is used):
    input ``x5`` (N, M, D, H, W), weights ``w4`` (M, KD, KH, KW), ``window`` its 3-D strides,
    dilations and leading pads (9 int64), output ``y`` (N, M, OD, OH, OW), the ``bias``, the
    address of the :data:`.native.EPILOGUE` ``loop`` and the ``params`` it reads, the parts'
    channel ``edges``. None when an array is not C-contiguous float32 (the window int64)."""
    if not contiguous_float32(x5, w4, y, bias) or \
            window.dtype != np.int64 or window.shape != (9,) or x5.shape[1] != w4.shape[0] or \
            y.shape[:2] != x5.shape[:2] or bias.shape != (w4.shape[0],):
        return None
    n, m = x5.shape[:2]
    widest = int(np.diff(edges).max())
    floats = widest * (n * math.prod(x5.shape[2:]) + math.prod(w4.shape[1:]) +
                       n * math.prod(y.shape[2:]))
    buffers = [np.empty(floats, np.float32) for _ in edges[1:]]
    return record([address_of(x5), n, m, *x5.shape[2:], address_of(w4), *w4.shape[1:],
                   address_of(window), address_of(y), *y.shape[2:], loop, address_of(bias),
                   optional_address(params), len(edges) - 1], edges, buffers), buffers
