"""Kernel helper: a large prepared convolution split by output channels over the host's cores.

A mobile net's large launches are a 1x1 convolution or a depthwise one followed by its bias and
fused activation (SiLU, hard-swish, Relu), each a pass over an output of up to 4.8 MB. On one
core EfficientNet's 16 to 96 channel 1x1 convolution of 112x112 took 1.6 ms (GEMM 0.49, bias
0.15, exp 0.54, gate 0.39); onnxruntime runs it on both cores. :func:`plan` cuts such a launch
into ranges of output channels, one per core (:func:`.cores.split`), and each part runs the
whole launch for its channels, image by image: the GEMM of those weight rows (scaled by a
squeeze-excite input scale first, if it has one), the depthwise planes of those channels, or an
image stem's channels (:func:`.conv.direct_fits`), then the bias and epilogue (a fused gate or
Relu, or a residual ``Add``) on those rows while they are its own. Every element gets exactly
the arithmetic of the unsplit launch (the same dot product in the same order, the same float32
epilogue steps), so the values are the same bits: GEMM parts start at multiples of the BLAS
kernel's block of rows and stay above :data:`.blas.SMALL_GEMM`, off OpenBLAS's small-matrix
kernel (:func:`.blas.kernel_split`, :func:`.blas.edges`); with a BLAS kernel not measured
there, 1x1 convolutions run whole.

When its epilogue has a native loop (:func:`_native_epilogue`), each part is native code run
without the GIL (:func:`.cores.split_native`, :mod:`.native`): a 1x1 convolution's rows
(:func:`_native_pointwise`), a depthwise one's channels on phase-split planes or channels-last
(:func:`_native_depthwise`), an image stem's bands of output rows, each reading its own rows
of the image (:func:`_native_direct`). Such a split costs a post, so it starts at smaller
launches (:data:`NATIVE_WORK`, :data:`NATIVE_DEPTHWISE_WORK`). Otherwise the parts are Python,
and whether they run over the cores or one after another on the caller is timed in the
launch's first runs (:class:`.cores.Choice`): on a host where handing a part over costs more
than it gains, the launch runs whole, with the same bits.

Measured on 2 vCPUs (AMD EPYC Zen 4), one-thread BLAS, medians of 200: the 16 to 96 channel
1x1 convolution with bias and SiLU 1.62 ms whole, 0.91 ms in two parts (four parts 0.99, eight
2.3: each part's few numpy and numba calls take and release the GIL, and with many small
parts the two threads queue for it). Cutting the output into cache-sized column tiles instead
was slower (1.8-2.4 ms in two threads): a column tile of an (M, pixels) output is a strided
view, whose epilogue loops do not vectorise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..epilogue import Step, input_scale
from ..errors import KernelError
from . import blas, cores, native, taps
from .activations import apply_activation
from .bias_fused import FusedLoop, bias_residual, native_form, native_loops
from .conv import Window, as5d, channel_scale, direct_fits, direct_steps, pointwise
from .depthwise import (
    channels_last_part,
    channels_last_record,
    planar,
    tapped,
    tapped_args,
    tapped_geometry,
)
from .epilogue import UFUNCS

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
#: A 1x1 convolution whose parts run natively (:func:`_native_pointwise`) splits from this much
#: work: a spinning helper takes a native part at once, so two parts of a 2-million-MAC GEMM
#: (MobileNet-V3's 576 to 96 channels of 7x7) already gain.
NATIVE_WORK = 1 << 21
#: A depthwise convolution whose parts run natively (:func:`_native_depthwise`) splits from
#: this much work (its multiply-adds plus :data:`EPILOGUE_WEIGHT` per output element).
NATIVE_DEPTHWISE_WORK = 1 << 19
#: Multiply-adds an output element's bias and epilogue cost, for :data:`SPLIT_WORK` (a SiLU
#: element about as long as 20 multiply-adds of a one-thread GEMM).
EPILOGUE_WEIGHT = 20
#: A direct (image stem) convolution's parts start at multiples of this many output channels,
#: the group :func:`.taps.direct` sums together.
DIRECT_ALIGN = 4

Part = Callable[[int, int, int], object]


def plan(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any], group: int,
         win: Window, into: np.ndarray | None, fused: FusedLoop | None,
         steps: Sequence[Step], columns: list[np.ndarray] | None) -> Callable[[], bool] | None:
    """A function computing the whole Conv launch of ``inputs`` (values, bias, epilogue) into
    ``into`` in parts over the cores, or None when the launch does not split. It splits when
    it is float32 with an ``into`` buffer and a contiguous input; a 1x1 convolution over views
    of its input (its weights scaled per input channel or not: each part scales its own rows),
    a depthwise one on phase-split planes (:func:`.depthwise.tapped`) or an image stem
    (:func:`.conv.direct_fits`), neither with an input scale; its bias and epilogue
    done by ``fused``, or no fused activation and epilogue steps that are all ``Add`` or ``Mul``
    of a float32 operand of the output's shape, with at most a Relu after them (a
    :class:`Tail`); and at least :data:`SPLIT_WORK` (or
    :data:`DEPTHWISE_WORK`) of work. The function returns False (nothing written) when this
    run's values rule the split out (non-finite depthwise weights): the caller runs it whole.
    ``steps`` is the launch's decoded epilogue, ``columns`` a 1x1 convolution's pixel columns
    when they are views of its input or of the buffer its strided pixels are gathered into
    each run (:func:`.conv.prepare_conv` made both, and gathers before the run)."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    # prepare_conv gives an ``into`` only for a float32 output, and X, W and B share its dtype
    if into is None or not x.flags.c_contiguous or not w.flags.c_contiguous:
        return None
    tail = operand_steps(inputs, attrs, steps, into.shape) if fused is None else None
    if (fused is None and tail is None) or (fused is not None and b is None):
        return None
    n, m = into.shape[:2]
    y = into.reshape(n, m, -1)
    gemm, setup = pointwise(group, win), None
    split = blas.kernel_split()
    if gemm and split is None:  # a BLAS whose pieces may sum in another order
        return None
    if gemm:
        native = _native_pointwise(inputs, attrs, columns, y, fused, tail, split[0])
        if native is not None:
            return native
        compute, macs = _pointwise(inputs, attrs, columns, y), y.size * x.shape[1]
    elif "input_scale" in attrs:
        return None
    elif group > 1 and w.shape[1] == 1:
        native = _native_depthwise(x, w, win, into, b, fused, tail)
        if native is not None:
            return native
        compute, macs = _depthwise(x, w, win, into), y.size * math.prod(win.kernel)
    elif group == 1 and direct_fits(x.shape[1], w.shape, win, x.dtype):
        native = _native_direct(x, w, win, into, b, fused, tail)
        if native is not None:
            return native
        (setup, compute), macs = _direct(x, w, win, into), w.size * y.size // m
    else:
        return None
    if compute is None or macs + EPILOGUE_WEIGHT * y.size < (SPLIT_WORK if gemm else
                                                              DEPTHWISE_WORK):
        return None
    edges = blas.edges(m, y.shape[2] * x.shape[1] if gemm else 0,
                       split[0] if gemm else DIRECT_ALIGN if setup else 1)
    if len(edges) < 3:
        return None

    def part(k: int) -> None:
        lo, hi = edges[k], edges[k + 1]
        for i in range(n):
            compute(i, lo, hi)
            rows = y[i:i + 1, lo:hi]
            if fused is not None:
                if not fused(rows, b[lo:hi]):  # float32 and contiguous: it always applies
                    raise KernelError("Conv", "", f"the fused bias loop refused rows {lo}:{hi}")
                continue
            tail(rows, None if b is None else b[lo:hi], slice(i, i + 1), slice(lo, hi))

    choice = cores.Choice()  # split or whole, timed in this launch's first runs

    def run() -> bool:
        if not gemm and not np.isfinite(w).all():  # padding would multiply inf by 0
            return False
        if setup is not None:
            setup()
        # one BLAS thread per part, as blas.matmul runs its pieces: a threaded OpenBLAS call
        # takes other kernels for the same product, and would change the bits
        with blas.single_thread():
            choice.run(len(edges) - 1, part)
        return True

    return run


class Tail(NamedTuple):
    """A launch's steps after its products when they can run on any block of its output rows:
    the bias, then ``Add`` or ``Mul`` steps of float32 operands of the output's shape (viewed
    as (N, M, pixels)), then a Relu if ``relu`` (a ResNet block's residual and Relu)."""

    operands: list[tuple[np.ufunc, np.ndarray]]
    relu: bool

    def __call__(self, rows: np.ndarray, bias: np.ndarray | None, images: slice,
                 channels: slice) -> None:
        """The steps on ``rows``, the output's (N, M, pixels) view at ``images`` and
        ``channels``, whose bias is ``bias`` (those channels' own, or None): the bias as
        :func:`.conv.add_bias` adds it, each step as :func:`.epilogue.apply_epilogue` applies
        it, each in its own pass, or a bias, residual ``Add`` and Relu in one
        (:func:`.bias_fused.bias_residual`, the same float32 operations)."""
        pairs = self.operands
        if bias is not None and len(pairs) == 1 and pairs[0][0] is np.add and \
                bias_residual(rows, bias, pairs[0][1][images, channels], self.relu):
            return
        if bias is not None:
            np.add(rows, bias[:, None], out=rows)
        with np.errstate(all="ignore"):  # as apply_epilogue's binary steps
            for ufunc, operand in pairs:
                ufunc(rows, operand[images, channels], out=rows)
        if self.relu:
            apply_activation(rows, "Relu", inplace=True)


def operand_steps(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                  steps: Sequence[Step], shape: tuple[int, ...]) -> Tail | None:
    """The epilogue as a :class:`Tail` when it has no fused activation, only ``Add`` and
    ``Mul`` steps with float32 operands of the output's ``shape`` (a residual), and at most a
    parameterless Relu after them; else None."""
    if attrs.get("activation"):
        return None
    relu = bool(steps) and steps[-1].op == "Relu" and steps[-1].operand < 0 and \
        not steps[-1].gate and not steps[-1].params
    pairs = []
    for step in steps[:-1] if relu else steps:
        other = inputs[step.operand] if 0 <= step.operand < len(inputs) else None
        if step.op not in UFUNCS or other is None or other.shape != shape or \
                other.dtype != np.float32 or not other.flags.c_contiguous:
            return None
        pairs.append((UFUNCS[step.op], other.reshape(shape[0], shape[1], -1)))
    return Tail(pairs, relu)


def _native_pointwise(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                      columns: list[np.ndarray] | None, y: np.ndarray, fused: FusedLoop | None,
                      tail: Tail | None, block: int) -> Callable[[], bool] | None:
    """The 1x1 convolution split by output channels into native parts (:mod:`.native`), run
    over the cores without the GIL (:func:`.cores.split_native`), or None when it does not
    split that way: it needs a bias, pixel columns made once, at least :data:`NATIVE_WORK`,
    and an epilogue with a native loop: a fused bias loop's, or a :class:`Tail` of a bias
    alone, perhaps a residual ``Add``, perhaps a Relu. Each part computes what
    :func:`_pointwise` and the epilogue compute for its rows, with the same sgemm and the same
    loop, so the same bits; its rows start at multiples of the BLAS kernel's ``block``."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    if columns is None or b is None:
        return None
    m, k = w.shape[0], x.shape[1]
    if y.size * (k + EPILOGUE_WEIGHT) < NATIVE_WORK:
        return None
    edges = blas.edges(m, y.shape[2] * k, block)
    if len(edges) < 3:
        return None
    after = _native_epilogue(fused, tail)
    if after is None:
        return None
    loop, params, residual = after
    w2 = w.reshape(m, -1)
    weights, scaled = w2, None
    if input_scale("Conv", attrs) >= 0:
        s = channel_scale(w, 1, inputs, attrs)
        if s is None or s.dtype != np.float32:
            return None  # the whole launch checks and names what is wrong
        weights, scaled = np.empty_like(w2), (w2, np.ascontiguousarray(s).reshape(-1))
    record = native.pointwise_record(weights, scaled, columns, y, b, loop, residual, params,
                                     edges)
    if record is None:
        return None
    return native.launch(record, native.pointwise_part(), len(edges) - 1,
                         (weights, scaled, params, columns, residual, y, b), blas_call=True)


def _native_epilogue(fused: FusedLoop | None, tail: Tail | None
                     ) -> tuple[int, np.ndarray | None, np.ndarray | None] | None:
    """The native loop after a split launch's products (:data:`.native.EPILOGUE`): its
    address, the parameters it reads and the residual it adds (or None), for a fused bias
    loop, or a :class:`Tail` of a bias alone, perhaps a residual ``Add``, perhaps a Relu;
    None for any other epilogue."""
    if fused is not None:
        form = native_form(fused)
        return None if form is None else (*form, None)
    if tail is not None and not tail.operands:
        return native_loops()["bias_relu" if tail.relu else "bias"], None, None
    if tail is not None and len(tail.operands) == 1 and tail.operands[0][0] is np.add:
        loop = native_loops()["bias_residual_relu" if tail.relu else "bias_residual"]
        return loop, None, tail.operands[0][1]
    return None


def _native_bias_split(b: np.ndarray | None, work: int, threshold: int,
                       fused: FusedLoop | None, tail: Tail | None,
                       count: int) -> tuple[int, np.ndarray | None, list[int]] | None:
    """Whether a launch whose parts add no residual (a depthwise convolution, an image stem)
    splits natively: a bias, ``work`` of at least ``threshold``, an epilogue with a native loop
    (:func:`_native_epilogue`) and ``count`` units cut into two parts or more. The loop's
    address, the parameters it reads and the parts' edges, or None."""
    if b is None or work < threshold:
        return None
    after = _native_epilogue(fused, tail)
    if after is None or after[2] is not None:
        return None
    edges = blas.edges(count, 0)
    return None if len(edges) < 3 else (after[0], after[1], edges)


def _native_depthwise(x: np.ndarray, w: np.ndarray, win: Window, into: np.ndarray,
                      b: np.ndarray | None, fused: FusedLoop | None,
                      tail: Tail | None) -> Callable[[], bool] | None:
    """The depthwise convolution split by output channels into native parts, or None when it
    does not split that way: it needs a bias, at least :data:`NATIVE_DEPTHWISE_WORK` and an
    epilogue with a native loop (:func:`_native_epilogue`, no residual). On phase-split
    planes (:func:`.depthwise.tapped_geometry`) a part (:func:`.taps.depthwise_part`) runs
    :func:`.taps.depthwise` on its planes and the epilogue's loop on them, as
    :func:`_depthwise` and the fused loop do, so the same bits; the launch returns False
    (nothing written) for non-finite weights, which that path does not take. Smaller planes
    run channels-last (:func:`_native_channels_last`)."""
    x5, w5 = as5d(x), as5d(w)
    _, st3, di3, pb3 = win.as3()
    out3 = (1,) * (3 - len(win.out)) + win.out
    m = w.shape[0]
    split = _native_bias_split(b, into.size * (math.prod(win.kernel) + EPILOGUE_WEIGHT),
                               NATIVE_DEPTHWISE_WORK, fused, tail, m)
    if split is None:
        return None
    loop, params, edges = split
    if not tapped_geometry(x5, w5, st3, di3, pb3, out3):
        if planar(x5.shape[1], math.prod(out3), int(st3[2])) or m != x5.shape[1]:
            return None
        return _native_channels_last(x5, w5, np.concatenate([st3, di3, pb3]).astype(np.int64),
                                     into.reshape(x5.shape[0], m, *out3), b, loop, params,
                                     edges)
    args = tapped_args(x5, w5, st3, pb3, out3, into)
    record = taps.depthwise_record(args, b, loop, params, edges)
    if record is None:
        return None
    return native.launch(record, taps.depthwise_part(), len(edges) - 1, (args, b, params),
                         finite=w)


def _native_direct(x: np.ndarray, w: np.ndarray, win: Window, into: np.ndarray,
                   b: np.ndarray | None, fused: FusedLoop | None,
                   tail: Tail | None) -> Callable[[], bool] | None:
    """An image stem (:func:`.conv.direct_fits`) split by output rows into native parts
    (:func:`.taps.direct_part`), or None when it does not split that way: float32, a bias, at
    least :data:`NATIVE_WORK`, two output rows and an epilogue with a native loop (no
    residual). Each part splits the input rows its band reads into phases of its own, runs
    :func:`.taps.direct` on them for every channel and the loop on its rows, as :func:`_direct`
    and the fused loop do: the same bits. By rows, not by channels: the image is a fresh input,
    and its phases were one core's cold pass over all of it (MobileNet-V3's stem in a run:
    phases 87 us, then the channel parts 100). It returns False (nothing written) for
    non-finite weights."""
    m = w.shape[0]
    split = _native_bias_split(b, into.size * (w[0].size + EPILOGUE_WEIGHT), NATIVE_WORK,
                               fused, tail, into.shape[2])
    if split is None or x.dtype != np.float32:
        return None
    loop, params, edges = split
    k = win.kernel[0]
    wk = np.ascontiguousarray(w.reshape(m, x.shape[1], k * k))
    made = taps.direct_record(x, k, win.strides[0], win.pads_begin[:2], wk, into, b, loop,
                              params, edges)
    if made is None:
        return None
    record, buffers = made
    return native.launch(record, taps.direct_part(), len(edges) - 1,
                         (x, wk, into, b, params, *buffers), finite=w)


def _native_channels_last(x5: np.ndarray, w5: np.ndarray, window: np.ndarray, y: np.ndarray,
                          b: np.ndarray, loop: int, params: np.ndarray | None,
                          edges: list[int]) -> Callable[[], bool] | None:
    """A depthwise convolution that runs channels-last (small planes, strided ones: not
    :func:`.depthwise.planar`, one output channel per input channel) split by channels into
    native parts (:func:`.depthwise.channels_last_part`), or None when the record refuses the
    arrays. Each part transposes its own channels, as :func:`.depthwise.depthwise` transposes
    them all; padding is skipped there, so any weights take it."""
    w4 = np.ascontiguousarray(w5[:, 0])
    made = channels_last_record(x5, w4, window, y, b, loop, params, edges)
    if made is None:
        return None
    record, buffers = made
    return native.launch(record, channels_last_part(), len(edges) - 1,
                         (buffers, x5, w4, window, y, b, params))


def _pointwise(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
               columns: list[np.ndarray] | None, y: np.ndarray) -> Part | None:
    """Part ``(image, lo, hi)`` of a 1x1 convolution: weight rows ``lo..hi`` (times the input
    scale, into a buffer of the launch's own, as :func:`.conv._scaled_weights` multiplies) times
    the image's pixel ``columns``, when there are such views made once (of ``x``, or of the
    buffer :func:`.conv.prepare_conv` gathers strided pixels into) and the scale is one float32
    per input channel."""
    if columns is None:
        return None
    w = inputs[1]
    w2 = w.reshape(w.shape[0], -1)
    if input_scale("Conv", attrs) < 0:
        def compute(i: int, lo: int, hi: int) -> None:
            with np.errstate(all="ignore"):  # inf/NaN inputs give inf/NaN, not warnings
                np.matmul(w2[lo:hi], columns[i], out=y[i, lo:hi])

        return compute
    s = channel_scale(w, 1, inputs, attrs)
    if s is None or s.dtype != np.float32:
        return None  # the whole launch checks and names what is wrong
    scale, scaled = s.reshape(1, -1), np.empty_like(w2)

    def compute_scaled(i: int, lo: int, hi: int) -> None:
        with np.errstate(all="ignore"):
            if i == 0:  # a part's images come in order: its rows once, before the first
                np.multiply(w2[lo:hi], scale, out=scaled[lo:hi])
            np.matmul(scaled[lo:hi], columns[i], out=y[i, lo:hi])

    return compute_scaled


def _depthwise(x: np.ndarray, w: np.ndarray, win: Window, into: np.ndarray) -> Part | None:
    """Part ``(image, lo, hi)`` of a depthwise convolution on phase-split planes: output planes
    ``lo..hi`` of the image (:func:`.taps.depthwise`), when its geometry takes that path."""
    x5, w5 = as5d(x), as5d(w)
    _, st3, di3, pb3 = win.as3()
    out3 = (1,) * (3 - len(win.out)) + win.out
    if not tapped(x5, w5, st3, di3, pb3, out3):
        return None
    m = w.shape[0]
    args = tapped_args(x5, w5, st3, pb3, out3, into)

    def compute(i: int, lo: int, hi: int) -> None:
        taps.depthwise(*args, i * m + lo, i * m + hi)

    return compute


def _direct(x: np.ndarray, w: np.ndarray, win: Window,
            into: np.ndarray) -> tuple[Callable[[], None], Part]:
    """Setup and part ``(image, lo, hi)`` of a direct convolution (an image stem,
    :func:`.conv.direct_fits`): each run splits every image into its phases once (the setup, on
    the calling thread), then a part computes output channels ``lo..hi`` of an image from them,
    with :func:`.conv.direct_steps` as :func:`.conv._direct` does for all of them."""
    phases, channels = direct_steps(x, w, win)
    flats: list[np.ndarray] = []

    def setup() -> None:
        flats[:] = [phases(i) for i in range(x.shape[0])]

    def compute(i: int, lo: int, hi: int) -> None:
        channels(flats[i], lo, hi, into[i, lo:hi])

    return setup, compute
