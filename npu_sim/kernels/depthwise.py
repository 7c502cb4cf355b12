"""Kernel: depthwise convolution (one input channel per group), channels-last or planar.

A depthwise convolution has no reduction over channels, so it cannot use a GEMM, and its
spatial rows are short in mobile nets (7 to 112 pixels): a loop vectorised along a row runs
mostly in vector tails. :func:`_rows` transposes the image once to channels-last
``(N, D, H, W, C)`` and vectorises along the channels instead (16 to 1152 of them, contiguous):
each output pixel adds its in-bounds taps, in (i, j, l) order as a loop per element would, each
tap one multiply-add over the whole channel vector. Measured on MobileNet-V3's and
EfficientNet-B0's 7x7 and 14x14 layers: 4-7x faster than the planar row loop, the transposes
included. On wide images with many channels the transposes cost more than the row loop loses,
and the planar loop (:func:`_planes`) stays (:func:`channels_last` picks).

A channel multiplier (``M = C * mult`` output channels) repeats every input channel ``mult``
times first, so output channel ``m`` reads input channel ``m // mult`` as ONNX defines. Output
rows (channels-last) or channels (planar) are independent: a large convolution is split over
the kernels' thread pool (:func:`npu_sim.kernels.blas.spread`), whose threads wait without
spinning; numba's own parallel loop fought OpenBLAS's spinning threads (measured slower end to
end on ResNet-50). Both loops do the same float32 multiply-adds in the same order, so both give
the same bits: no fastmath.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from . import blas

#: Depthwise convolutions of at least this many MACs run on the kernels' thread pool (smaller
#: ones measured slower split than whole on a busy 2-core machine: 240 channels of 14x14, 5x5).
SPLIT_MACS = 1 << 21


@njit(cache=True, nogil=True, error_model="numpy")
def _rows(x, w, st, di, pb, out, lo, hi):  # pragma: no cover - compiled
    """Output rows ``lo..hi`` (of N*OD*OH) of out (N, OD, OH, OW, M), which is zero-filled.

    x (N, D, H, W, M) and w (KD, KH, KW, M) are channels-last; every tap outside the input is
    skipped, as in :func:`_planes`. The channel loop runs over 1-D views, which LLVM
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


@njit(cache=True, nogil=True)
def _planes(x, w, mult, st, di, pb, out):  # pragma: no cover - compiled
    """Direct conv with one input channel per group: out (N, M, OD, OH, OW), zero-filled.

    Each output element adds its in-bounds taps in (i, j, l) order, as a loop per element
    would, but the innermost loop runs along an output row over the range of columns whose
    tap lies inside the input (computed once per tap), so it has no branch and vectorizes.
    """
    N, M, OD, OH, OW = out.shape
    D, H, W = x.shape[2], x.shape[3], x.shape[4]
    KD, KH, KW = w.shape[2], w.shape[3], w.shape[4]
    lo = np.empty(KW, np.int64)
    hi = np.empty(KW, np.int64)
    for lw in range(KW):  # columns e with 0 <= e * st - pb + lw * di < W
        first = pb[2] - lw * di[2]
        lo[lw] = min(OW, max(0, -(-first // st[2])))
        last = W - 1 + pb[2] - lw * di[2]
        hi[lw] = 0 if last < 0 else min(OW, last // st[2] + 1)
    s2 = st[2]
    for t in range(N * M):
        n = t // M
        m = t % M
        c = m // mult
        for a in range(OD):
            for i in range(KD):
                z = a * st[0] - pb[0] + i * di[0]
                if z < 0 or z >= D:
                    continue
                for j in range(KH):
                    for b in range(OH):
                        y = b * st[1] - pb[1] + j * di[1]
                        if y < 0 or y >= H:
                            continue
                        row = out[n, m, a, b]
                        src = x[n, c, z, y]
                        for lw in range(KW):
                            wv = w[m, 0, i, j, lw]
                            off = lw * di[2] - pb[2]
                            if s2 == 1:  # contiguous: a loop of its own, vectorized
                                for e in range(lo[lw], hi[lw]):
                                    row[e] += src[e + off] * wv
                            else:
                                for e in range(lo[lw], hi[lw]):
                                    row[e] += src[e * s2 + off] * wv


def channels_last(channels: int, width: int) -> bool:
    """Whether the channels-last loop is the faster one for this image.

    Transposing costs a pass over the input and the output; on a wide image with many channels
    that costs more than the row loop loses in vector tails (96 channels of 112x112, stride 2:
    4.5 ms planar, 5.5 ms channels-last), while narrow images or few channels gain (144 of
    56x56: 2.0 ms planar, 1.1 ms channels-last; 32 of 112x112: 6.4 against 3.8 ms).
    """
    return channels <= 32 or width < 64


def depthwise(x5: np.ndarray, w5: np.ndarray, st3: np.ndarray, di3: np.ndarray,
              pb3: np.ndarray, out3: tuple[int, int, int]) -> np.ndarray:
    """Depthwise correlation of ``x5`` (N, C, D, H, W) with ``w5`` (M, 1, KD, KH, KW), no bias.

    ``st3``, ``di3``, ``pb3`` are the 3-D strides, dilations and leading pads (int64 arrays) and
    ``out3`` the 3-D output size; returns a C-contiguous (N, M, *out3) array of ``x5``'s dtype.
    """
    n, c = x5.shape[:2]
    m = w5.shape[0]
    if not channels_last(c, x5.shape[4]):
        y5 = np.zeros((n, m, *out3), x5.dtype)
        mult = m // c
        if y5.size * math.prod(w5.shape[2:]) < SPLIT_MACS:
            _planes(x5, w5, mult, st3, di3, pb3, y5)
        else:  # channel ranges (whole groups) on the pool's threads
            blas.spread(c, lambda lo, hi: _planes(x5[:, lo:hi], w5[lo * mult:hi * mult], mult,
                                                  st3, di3, pb3, y5[:, lo * mult:hi * mult]))
        return y5
    xt = np.ascontiguousarray(x5.transpose(0, 2, 3, 4, 1))
    if m != c:
        xt = np.repeat(xt, m // c, axis=4)
    wt = np.ascontiguousarray(w5[:, 0].transpose(1, 2, 3, 0))
    yt = np.zeros((n, *out3, m), x5.dtype)
    rows = n * out3[0] * out3[1]
    flat = xt, wt, st3, di3, pb3, yt
    if yt.size * math.prod(w5.shape[2:]) < SPLIT_MACS:
        _rows(*flat, 0, rows)
    else:
        blas.spread(rows, lambda lo, hi: _rows(*flat, lo, hi))
    return np.ascontiguousarray(yt.transpose(0, 4, 1, 2, 3))
