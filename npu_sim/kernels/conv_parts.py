"""Kernel helper: a large prepared convolution split by output channels over the host's cores.

A mobile net's large launches are a 1x1 convolution or a depthwise one followed by its bias and
fused activation (SiLU, hard-swish, Relu), each a pass over an output of up to 4.8 MB. On one
core EfficientNet's 16 to 96 channel 1x1 convolution of 112x112 took 1.6 ms (GEMM 0.49, bias
0.15, exp 0.54, gate 0.39); onnxruntime runs it on both cores. :func:`plan` cuts such a launch
into ranges of output channels, one per core and image (:func:`.cores.split`), and each part
runs the whole launch for its channels: the GEMM of those weight rows (or the depthwise planes
of those channels) and then the bias and epilogue on those rows while they are the part's own.
Every element gets exactly the arithmetic of the unsplit launch (the same dot product in the
same order, the same float32 epilogue steps), so the values are the same bits; GEMM parts start
at multiples of :data:`ALIGN` rows, so BLAS runs the same micro-kernel blocks as on the whole.

Measured on 2 vCPUs (AMD EPYC Zen 4), one-thread BLAS, medians of 200: the 16 to 96 channel
1x1 convolution with bias and SiLU 1.62 ms whole, 0.91 ms in two parts (four parts 0.99, eight
2.3: each part's few numpy and numba calls take and release the GIL, and with many small
parts the two threads queue for it). Cutting the output into cache-sized column tiles instead
was slower (1.8-2.4 ms in two threads): a column tile of an (M, pixels) output is a strided
view, whose epilogue loops do not vectorise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import cores, taps
from .bias_fused import FusedLoop
from .conv import Window, as5d, pointwise, pointwise_columns
from .depthwise import tapped

#: A 1x1 convolution splits when its multiply-adds plus :data:`EPILOGUE_WEIGHT` per output
#: element reach this much work, a depthwise one at :data:`DEPTHWISE_WORK` (its multiply-adds
#: run several times slower than a GEMM's). Median of 200 launches, 50 us of Python between
#: them, whole against split: 1x1 16 to 96 channels of 112x112 with SiLU (41M) 1522 against
#: 1062 us, 40 to 240 of 28x28 SiLU (10.8M) 361 against 248, 112 to 672 of 14x14 SiLU (16.6M)
#: 336 against 263, but 16 to 72 of 56x56 Relu (7.8M) 108 against 134 and 576 to 96 of 7x7
#: (2.7M) 72 against 79; depthwise 144 of 56x56 3x3 SiLU (12.5M) 720 against 447, 72 of 56x56
#: 3x3 stride 2 Relu (1.6M) 169 against 134, 240 of 14x14 5x5 hard-swish (2.0M) 150 against
#: 129, but 16 of 112x112 3x3 stride 2 Relu (1.4M) 123 against 121.
SPLIT_WORK = 1 << 23
DEPTHWISE_WORK = 3 << 19
#: Multiply-adds an output element's bias and epilogue cost, for :data:`SPLIT_WORK` (a SiLU
#: element about as long as 20 multiply-adds of a one-thread GEMM).
EPILOGUE_WEIGHT = 20
#: GEMM parts start at multiples of this many output channels (the AVX-512 sgemm kernel's block
#: of rows), so each output row is computed by the same kernel block as in the unsplit GEMM.
ALIGN = 16

Part = Callable[[int, int, int], object]


def plan(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, group: int, win: Window,
         into: np.ndarray | None, attrs: Mapping[str, Any],
         fused: FusedLoop | None) -> Callable[[], bool] | None:
    """A function computing the whole Conv launch (values, bias, fused epilogue) into ``into``
    in parts over the cores, or None when the launch does not split: it must be float32 with an
    ``into`` buffer, a contiguous input, no input scale, a bias and epilogue done by ``fused``
    (or no epilogue and no activation at all), a 1x1 convolution over views of its input or a
    depthwise one on phase-split planes (:func:`.depthwise.tapped`), and at least
    :data:`SPLIT_WORK` of work. The function returns False (nothing written) when this run's
    values rule the split out (non-finite depthwise weights), and the caller runs it whole."""
    if into is None or x.dtype != np.float32 or w.dtype != np.float32 or \
            not x.flags.c_contiguous or not w.flags.c_contiguous or "input_scale" in attrs or \
            (b is not None and b.dtype != np.float32) or \
            (fused is None and ("epilogue" in attrs or attrs.get("activation"))) or \
            (fused is not None and b is None):
        return None
    n, m = into.shape[:2]
    y = into.reshape(n, m, -1)
    gemm = pointwise(group, win)
    if gemm:
        compute, macs = _pointwise(x, w, win, y), y.size * x.shape[1]
    elif group > 1 and w.shape[1] == 1:
        compute, macs = _depthwise(x, w, win, into), y.size * math.prod(win.kernel)
    else:
        return None
    if compute is None or macs + EPILOGUE_WEIGHT * y.size < (SPLIT_WORK if gemm else
                                                              DEPTHWISE_WORK):
        return None
    edges = _edges(m, ALIGN if gemm else 1)
    parts = [(i, lo, hi) for i in range(n) for lo, hi in zip(edges, edges[1:], strict=False)]

    def part(k: int) -> None:
        i, lo, hi = parts[k]
        compute(i, lo, hi)
        if b is None:
            return
        rows = y[i:i + 1, lo:hi]
        if fused is not None:
            fused(rows, b[lo:hi])  # float32, contiguous: always applies
        else:
            np.add(rows, b[lo:hi, None], out=rows)

    def run() -> bool:
        if not gemm and not np.isfinite(w).all():  # padding would multiply inf by 0
            return False
        cores.split(len(parts), part)
        return True

    return run


def _edges(m: int, align: int) -> list[int]:
    """Channel boundaries cutting ``m`` into :data:`.cores.THREADS` ranges, inner boundaries at
    multiples of ``align`` (fewer ranges when ``m`` is too small for that)."""
    blocks = -(-m // align)
    count = max(1, min(cores.THREADS, blocks))
    inner = sorted({min(m, blocks * k // count * align) for k in range(1, count)} - {0, m})
    return [0, *inner, m]


def _pointwise(x: np.ndarray, w: np.ndarray, win: Window, y: np.ndarray) -> Part | None:
    """Part ``(image, lo, hi)`` of a 1x1 convolution: weight rows ``lo..hi`` times the image's
    pixel columns, when those are views of ``x`` (strided pixels are gathered into a copy made
    per run: then None)."""
    columns = pointwise_columns(as5d(x), win)
    if not all(np.shares_memory(c, x) for c in columns):
        return None
    w2 = w.reshape(w.shape[0], -1)

    def compute(i: int, lo: int, hi: int) -> None:
        with np.errstate(all="ignore"):  # inf/NaN inputs give inf/NaN, not warnings
            np.matmul(w2[lo:hi], columns[i], out=y[i, lo:hi])

    return compute


def _depthwise(x: np.ndarray, w: np.ndarray, win: Window, into: np.ndarray) -> Part | None:
    """Part ``(image, lo, hi)`` of a depthwise convolution on phase-split planes: output planes
    ``lo..hi`` of the image (:func:`.taps.depthwise`), when its geometry takes that path."""
    x5, w5 = as5d(x), as5d(w)
    k3, st3, di3, pb3 = win.as3()
    out3 = (1,) * (3 - len(win.out)) + win.out
    if not tapped(x5, w5, st3, di3, pb3, out3):
        return None
    m, k, s = w.shape[0], int(k3[2]), int(st3[2])
    rows, pitch, _ = taps.geometry(k, s, out3[1], out3[2])
    args = (x5[:, :, 0], w5.reshape(m, k * k), s, int(pb3[1]), int(pb3[2]), rows, pitch,
            taps.offsets(k, s, rows, pitch), into.reshape(x.shape[0], m, *out3[1:]))

    def compute(i: int, lo: int, hi: int) -> None:
        taps.depthwise(*args, i * m + lo, i * m + hi)

    return compute
