"""Kernel helper: a large prepared convolution split by bands of output rows over the cores.

ResNet-50's 3x3 convolutions unfold their input (im2col) and multiply it by the weights. Split
by output channels (:mod:`.blas`' row split), each part packs the whole unfolded matrix (7.2 MB
for 64 channels of 56x56) for its few weight rows, and the unfold runs on one thread before
them: a 64-channel 56x56 3x3 layer took 3.2 ms against onnxruntime's 1.4 ms on two threads.
Cut into bands of output rows (:func:`.conv.bands`) instead, each part unfolds its own band,
multiplies all the weights by it into a buffer of its own, adds the bias and applies the fused
activation there (:mod:`.bias_fused`) and copies the band into the output, so nothing is done
twice and nothing waits.

The bands are part of the convolution's arithmetic (:func:`.conv.bands`): the general path
multiplies the same bands one after another, so each element gets the same dot product and the
same float32 bias and activation steps, and the values are the same bits whichever path and
however many cores run it. Whether the bands then run over the cores or one after another on
the caller is timed in the launch's first runs (:class:`.cores.Choice`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..epilogue import Step
from ..errors import KernelError
from . import blas, cores
from .bias_fused import FusedLoop
from .conv import Window, as5d, bands, direct_fits, pointwise, scratch, unfolder


def plan(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], group: int,
         win: Window, into: np.ndarray | None, fused: FusedLoop | None,
         steps: Sequence[Step]) -> Callable[[], bool] | None:
    """A function computing the whole Conv launch of ``inputs`` into ``into`` band by band over
    the cores, or None when the launch does not split that way. It does when it is a float32
    convolution of one group, unfolded (not 1x1, not an image stem run directly), with an
    ``into`` buffer and contiguous operands, that :func:`.conv.bands` cuts into bands, on a BLAS
    kernel :func:`.blas.kernel_split` knows, and with the bias and its fused loop (``fused``) or
    a bias alone after the products (``steps`` empty, no activation)."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if into is None or group != 1 or pointwise(group, win) or "input_scale" in attrs or \
            x.dtype != np.float32 or not x.flags.c_contiguous or not w.flags.c_contiguous or \
            direct_fits(x.shape[1], w.shape, win, x.dtype) or blas.kernel_split() is None:
        return None
    if fused is None and (steps or attrs.get("activation")):
        return None
    m, rows = w.shape[0], w[0].size
    cuts = bands(m, rows, win)
    if len(cuts) < 3:
        return None
    n, width = x.shape[0], win.out[-1]  # pixels per output row: bands are 2-D or 1-D
    x5, w2, y = as5d(x), w.reshape(m, rows), into.reshape(into.shape[0], m, -1)
    spans = list(itertools.pairwise(cuts))
    tiles = [np.empty((1, m, (r1 - r0) * width), np.float32) for r0, r1 in spans]
    fills: list[Callable[[np.ndarray, int, int], None]] = []
    bias = None if b is None else b[:, None]

    def part(k: int) -> None:
        (r0, r1), tile = spans[k], tiles[k]
        for i in range(n):
            cols = scratch((rows, (r1 - r0) * width), x.dtype)  # the thread's own
            fills[i](cols, r0, r1)
            with np.errstate(all="ignore"):  # inf/NaN inputs give inf/NaN, not warnings
                np.matmul(w2, cols, out=tile[0])
                if fused is not None:
                    if not fused(tile, b):  # float32 and contiguous: it always applies
                        raise KernelError("Conv", "", f"the fused bias loop refused band {k}")
                elif bias is not None:
                    np.add(tile[0], bias, out=tile[0])  # as conv.add_bias adds it
            y[i, :, r0 * width:r1 * width] = tile[0]

    choice = cores.Choice()  # over the cores or one after another, timed in the first runs

    def run() -> bool:
        fills[:] = [unfolder(x5[i], win) for i in range(n)]  # each image padded once
        with blas.single_thread():  # one BLAS thread per band, as the general path's pieces
            choice.run(len(spans), part)
        return True

    return run
