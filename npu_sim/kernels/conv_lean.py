"""Kernel helper: a prepared Conv's common launches as one short closure each.

Inside a run, the Python around a launch runs with cold caches: the launch before it streamed
its megabytes of activations through them, and every attribute lookup, shape check and small
numpy call of the general path misses. Timed in MobileNet-V3's runs, its 64 launches spent
3.5 of 8.5 ms outside their compiled loops and BLAS calls; a 16-channel 112x112 depthwise
launch 134 us beside its loop's 136.

:func:`plan` works out at prepare time everything that depends only on shapes for the two
launches a mobile net is mostly made of, and returns a closure that then makes only the calls
that read values:

- a 1x1 convolution over views of its input (:func:`.conv.pointwise_columns`), with its
  weights scaled per input channel by a squeeze-excite's gate or not: the scaling into a buffer
  of its own, one GEMM per image, then the fused bias loop, or the bias, a residual and a Relu;
- a depthwise convolution on phase-split planes (:func:`.depthwise.tapped`): the finite
  weights check, the tap loop over views made once, then the same; or channels-last (small
  planes, :func:`.depthwise.channels_last_rows`), transposed into buffers made once.
  Both split as :func:`.depthwise.depthwise` splits them (:func:`.depthwise.launch`).

Each does exactly the general path's arithmetic, with the same calls in the same order, so the
values are the same bits (``tests/kernels/test_conv_lean.py`` compares them). Anything else, or
a launch :mod:`.conv_parts` splits, keeps the general path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..epilogue import Step
from . import blas, depthwise, taps
from .bias_fused import FusedLoop
from .conv import Window, as5d, channel_scale, pointwise
from .conv_parts import Tail, operand_steps

Lean = Callable[[], bool]


def plan(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], group: int,
         win: Window, into: np.ndarray | None, fused: FusedLoop | None,
         steps: Sequence[Step], columns: list[np.ndarray] | None) -> Lean | None:
    """The closure computing the whole Conv launch of ``inputs`` into ``into``, or None when it
    is not one of the launches above: float32 into an ``into`` buffer, from a C-contiguous
    input, and after the products either the fused bias loop (``fused``), or the bias and
    epilogue steps that are all ``Add`` or ``Mul`` of a float32 operand of the output's shape
    (a residual), perhaps then a Relu, with no fused activation (:class:`.conv_parts.Tail`).
    It returns False (nothing written) when this run's values rule it out (non-finite
    depthwise weights): the caller then runs the general path.
    ``columns`` are a 1x1 convolution's pixel columns when they are views made once (of its
    input, or of the buffer its strided pixels are gathered into), and
    ``steps`` the decoded epilogue (:func:`.conv.prepare_conv` made both)."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if into is None or x.dtype != np.float32 or not x.flags.c_contiguous or \
            not w.flags.c_contiguous:
        return None
    if fused is not None:
        def finish() -> None:
            fused(into, b)  # float32, contiguous and writable (computes_into): it applies
    else:
        tail = operand_steps(inputs, attrs, steps, into.shape)
        if tail is None:
            return None
        finish = _tail(into, b, tail)
    if pointwise(group, win):
        return None if columns is None else _pointwise(inputs, attrs, columns, into, finish)
    if group > 1 and w.shape[1] == 1 and "input_scale" not in attrs:
        return _depthwise(x, w, win, into, finish)
    return None


def _tail(into: np.ndarray, b: np.ndarray | None, tail: Tail) -> Callable[[], None]:
    """The bias and the epilogue's residual steps (:class:`.conv_parts.Tail`) on the whole
    output."""
    y = into.reshape(into.shape[0], into.shape[1], -1)
    everything = slice(None)

    def finish() -> None:
        tail(y, b, everything, everything)

    return finish


def _pointwise(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
               columns: list[np.ndarray], into: np.ndarray, finish: Callable[[], object]
               ) -> Lean | None:
    """A 1x1 convolution: weights (scaled, into a buffer of the launch's own, as
    :func:`.conv._scaled_weights` multiplies) times each image's columns, as
    :func:`.conv.pointwise_products` multiplies them, then ``finish``."""
    w = inputs[1]
    m = w.shape[0]
    w2 = w.reshape(m, -1)
    rows = into.reshape(into.shape[0], m, -1)
    scale = buffer = None
    if "input_scale" in attrs:
        s = channel_scale(w, 1, inputs, attrs)
        if s is None or s.dtype != np.float32:
            return None  # the general path checks and names what is wrong
        scale, buffer = s.reshape(1, -1), np.empty_like(w2)
    images = list(zip(columns, rows, strict=True))

    def run() -> bool:
        weights = w2
        if scale is not None:
            weights = np.multiply(w2, scale, out=buffer)
        with np.errstate(all="ignore"):  # inf/NaN inputs give inf/NaN, not warnings
            for cols, out in images:
                blas.matmul(weights, cols, out=out)
        finish()
        return True

    return run


def _depthwise(x: np.ndarray, w: np.ndarray, win: Window, into: np.ndarray,
               finish: Callable[[], object]) -> Lean | None:
    """A depthwise convolution run as :func:`.depthwise.depthwise` runs it, then ``finish``:
    on phase-split planes (:func:`.depthwise.tapped` but for the weights' values), or
    channels-last (:func:`_channels_last`)."""
    x5, w5 = as5d(x), as5d(w)
    _, st3, di3, pb3 = win.as3()
    out3 = (1,) * (3 - len(win.out)) + win.out
    if not depthwise.tapped_geometry(x5, w5, st3, di3, pb3, out3):
        if depthwise.planar(x5.shape[1], math.prod(out3), int(st3[2])) or \
                w5.shape[0] != x5.shape[1]:
            return None
        return _channels_last(x5, w5, (st3, di3, pb3), out3, into, finish)
    y = into.reshape(x5.shape[0], w5.shape[0], *out3)
    args = depthwise.tapped_args(x5, w5, st3, pb3, out3, y)
    count, macs = y.shape[0] * y.shape[1], y.size * w5.shape[3] ** 2

    def run() -> bool:
        if not np.isfinite(w).all():  # padding would multiply inf by 0: the general path
            return False
        depthwise.launch(taps.depthwise, args, count, macs)
        finish()
        return True

    return run


def _channels_last(x5: np.ndarray, w5: np.ndarray, window: tuple[np.ndarray, ...],
                   out3: tuple[int, int, int], into: np.ndarray,
                   finish: Callable[[], object]) -> Lean:
    """A depthwise convolution of one output channel per input channel that runs channels-last
    (:func:`.depthwise.channels_last_rows`; ``window`` its 3-D strides, dilations and leading
    pads): the input and weights transposed into buffers of the launch's own, the output
    summed from zeros in a third and transposed back into ``into``, as
    :func:`.depthwise.depthwise` does with arrays it allocates afresh on every call."""
    n, m = x5.shape[0], w5.shape[0]
    xt = np.empty((n, *x5.shape[2:], m), x5.dtype)
    wt = np.empty((*w5.shape[2:], m), w5.dtype)
    yt = np.empty((n, *out3, m), x5.dtype)
    x_view, w_view = x5.transpose(0, 2, 3, 4, 1), w5[:, 0].transpose(1, 2, 3, 0)
    y, y_view = into.reshape(n, m, *out3), yt.transpose(0, 4, 1, 2, 3)
    args = (xt, wt, *window, yt)
    rows, macs = n * out3[0] * out3[1], yt.size * math.prod(w5.shape[2:])

    def run() -> bool:
        np.copyto(xt, x_view)
        np.copyto(wt, w_view)
        yt.fill(0)
        depthwise.launch(depthwise.channels_last_rows, args, rows, macs)
        np.copyto(y, y_view)
        finish()
        return True

    return run
