"""Kernel helper: 3x3 and 5x5 convolution taps over phase-split planes, summed in registers.

A 2-D convolution tap ``(j, l)`` with strides ``s`` reads input pixel ``(s*b + j - pt,
s*e + l - pl)`` for output pixel ``(b, e)``. :func:`split` copies one input plane, zero-padded,
into ``s*s`` *phases* ``ph[a, c, r, q] = padded[s*r + a, s*q + c]`` (a space-to-depth), each
``pitch`` wide; then tap ``(j, l)`` of output pixel ``(b, e)`` is phase ``(j % s, l % s)`` at
``(b + j // s, e + l // s)``. Numbered along the flattened output ``t = b * pitch + e``, every
tap reads one contiguous run of the phases at a fixed offset (:func:`offsets`): the whole plane
is one long vectorised loop whatever its width or stride (7-pixel rows are no vector tails, and
stride 2 is no gather), at the cost of ``pitch - OW`` discarded columns per row.

:func:`acc3` adds the 9 taps of each element in registers, in (j, l) order, onto what the
output holds, and stores it once: one load per tap rather than a load and a store of the output;
:func:`acc5` does the same for each row of a 5x5 kernel, storing the sum after each (on AVX2,
25 taps at once spill their weights). Padding is multiplied as zeros, so callers use these
only with finite weights (``w * 0`` is 0 there, and adding ``+-0`` leaves a sum that started
at ``+0.0`` unchanged: the bits of a loop that skips the padded taps). No fastmath: a multiply
and an add per tap, each rounded to float32, as the other kernels do.

Measured and left out (best of 60, one image): the same unrolled sums channels-last (a weight
vector per tap, as :func:`.depthwise.channels_last_rows` but stored once) were no faster than it on
small planes, blocked by 256 channels or not (1152 channels of 7x7 5x5 0.20-0.26 against 0.16
ms); two planes per pass (two sums in flight) were slower on every layer (576 of 7x7 5x5 0.14
against 0.11); and splitting short stride-2 rows by a table of offsets was no faster than
:func:`split`.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import carray, njit

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

#: Square kernel sizes with an unrolled tap loop.
SIZES = (3, 5)
#: Elements per vector iteration of the tap loops (AVX-512 float32).
VECTOR = 16


def geometry(k: int, s: int, out_h: int, out_w: int) -> tuple[int, int, int]:
    """``(rows, pitch, span)`` of the phases of a ``k``x``k``, stride-``s`` convolution with an
    ``out_h`` x ``out_w`` output: each phase is ``rows`` x ``pitch``, and the flattened output
    run is ``span`` long (the last row has no discarded columns)."""
    reach = (k - 1) // s
    pitch = out_w + reach
    return out_h + reach, pitch, (out_h - 1) * pitch + out_w


@njit(cache=True)
def rounded(span):  # pragma: no cover - compiled
    """``span`` rounded up to whole vectors: the tap loops then run no scalar tail (each tail
    element costs 9 or 25 scalar multiply-adds); the phases' buffer must reach that far."""
    return -(-span // VECTOR) * VECTOR


@functools.lru_cache(maxsize=1024)
def offsets(k: int, s: int, rows: int, pitch: int) -> np.ndarray:
    """Offset of tap ``(j, l)``'s run in the flattened phases (s, s, rows, pitch), (j, l)
    order; read-only, made once per geometry (a program runs the same layers every time)."""
    found = np.array([((j % s * s + i % s) * rows + j // s) * pitch + i // s
                      for j in range(k) for i in range(k)], np.int64)
    found.flags.writeable = False
    return found


@njit(cache=True, nogil=True, error_model="numpy")
def split(plane, s, pt, pl, rows, pitch, ph):  # pragma: no cover - compiled
    """Write ``plane`` (H, W) into its phases, ``ph`` flattened from (s, s, rows, pitch):
    element ``(y, x)`` lands at padded position ``(y + pt, x + pl)``. Positions not written
    (padding) keep what ``ph`` held: callers zero it once. Stride 2 splits each row into both
    phases in one pass (a loop per phase measured 4x slower: LLVM did not vectorise its strided
    reads). Bounds are worked out once per plane and the rows indexed in 2-D, no view per row
    (a reference count each), with column offsets the compiler knows are not negative (numba
    tests every index for wraparound, which blocked the vectoriser). Best of 3 medians of 200,
    :func:`depthwise` against three views per row: 16 planes of 112x112 3x3 stride 2 66 against
    85 us (the split alone 41 against 59-63), 72 of 56x56 104 against 143, 96 of 112x112 389
    against 515; stride 1 unchanged (88 of 28x28 52 against 50, 144 of 56x56 252 against 244)."""
    h, w = plane.shape
    ph2 = ph[:s * s * rows * pitch].reshape(s * s * rows, pitch)  # row (a*s + c)*rows + r
    n = min(w, pitch - pl)  # stride 1: columns copied
    lo = (pl + 1) // 2 if s == 2 else pitch  # stride 2: both phases in bounds from here...
    hi = max(lo, min(pitch, (w - 2 + pl) // 2 + 1)) if s == 2 else pitch  # ...to here
    # column offsets are never negative; max tells the compiler so
    first, start, off = max(pl, 0), max(lo, 0), max(2 * lo - pl, 0)
    r, a = pt // s, pt % s
    for y in range(min(h, rows * s - pt)):
        base = a * s * rows + r  # phase (a, 0), row r
        a += 1
        if a == s:
            a, r = 0, r + 1
        if s == 1:
            for q in range(n):
                ph2[base, first + q] = plane[y, q]
            continue
        for t in range(hi - lo):
            ph2[base, start + t] = plane[y, 2 * t + off]
            ph2[base + rows, start + t] = plane[y, 2 * t + off + 1]
        for q in range(lo + pitch - hi):  # the rest one by one: every column at strides > 2
            q = q if q < lo else q - lo + hi
            for c in range(s):
                x = s * q + c - pl
                if 0 <= x < w:
                    ph2[base + c * rows, q] = plane[y, x]


@njit(cache=True, nogil=True, error_model="numpy")
def acc3(src, o, w, out):  # pragma: no cover - compiled
    """``out[t] += sum of src[o[k] + t] * w[k]`` over the 9 taps ``k`` in order, each product
    and sum rounded to ``out``'s dtype, for every ``t`` of ``out`` (1-D)."""
    s0, s1, s2 = src[o[0]:], src[o[1]:], src[o[2]:]
    s3, s4, s5 = src[o[3]:], src[o[4]:], src[o[5]:]
    s6, s7, s8 = src[o[6]:], src[o[7]:], src[o[8]:]
    w0, w1, w2, w3, w4, w5, w6, w7, w8 = w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8]
    for t in range(out.size):
        out[t] = _taps9(out[t], s0[t], s1[t], s2[t], s3[t], s4[t], s5[t], s6[t], s7[t], s8[t],
                        w0, w1, w2, w3, w4, w5, w6, w7, w8)


@njit(inline="always")
def _taps9(a, x0, x1, x2, x3, x4, x5, x6, x7, x8,
           w0, w1, w2, w3, w4, w5, w6, w7, w8):  # pragma: no cover - compiled
    """``a`` plus the 9 products ``x_k * w_k`` added in order, each rounded to ``a``'s dtype
    (inlined: the callers' loops keep every value in registers)."""
    a += x0 * w0
    a += x1 * w1
    a += x2 * w2
    a += x3 * w3
    a += x4 * w4
    a += x5 * w5
    a += x6 * w6
    a += x7 * w7
    a += x8 * w8
    return a


@njit(cache=True, nogil=True, error_model="numpy")
def acc3x4(src, o, w, out):  # pragma: no cover - compiled
    """:func:`acc3` for 4 output rows ``out[i]`` with weights ``w[i]`` (4, 9) at once: each
    tap loaded once for the four (a convolution of several input channels, where the output
    channels read the same taps), four independent sums in flight. Same order per element."""
    s0, s1, s2 = src[o[0]:], src[o[1]:], src[o[2]:]
    s3, s4, s5 = src[o[3]:], src[o[4]:], src[o[5]:]
    s6, s7, s8 = src[o[6]:], src[o[7]:], src[o[8]:]
    r0, r1, r2, r3 = out[0], out[1], out[2], out[3]
    a0, a1, a2, a3, a4 = w[0, 0], w[0, 1], w[0, 2], w[0, 3], w[0, 4]
    a5, a6, a7, a8 = w[0, 5], w[0, 6], w[0, 7], w[0, 8]
    b0, b1, b2, b3, b4 = w[1, 0], w[1, 1], w[1, 2], w[1, 3], w[1, 4]
    b5, b6, b7, b8 = w[1, 5], w[1, 6], w[1, 7], w[1, 8]
    c0, c1, c2, c3, c4 = w[2, 0], w[2, 1], w[2, 2], w[2, 3], w[2, 4]
    c5, c6, c7, c8 = w[2, 5], w[2, 6], w[2, 7], w[2, 8]
    d0, d1, d2, d3, d4 = w[3, 0], w[3, 1], w[3, 2], w[3, 3], w[3, 4]
    d5, d6, d7, d8 = w[3, 5], w[3, 6], w[3, 7], w[3, 8]
    for t in range(r0.size):
        x0, x1, x2, x3, x4 = s0[t], s1[t], s2[t], s3[t], s4[t]
        x5, x6, x7, x8 = s5[t], s6[t], s7[t], s8[t]
        r0[t] = _taps9(r0[t], x0, x1, x2, x3, x4, x5, x6, x7, x8,
                       a0, a1, a2, a3, a4, a5, a6, a7, a8)
        r1[t] = _taps9(r1[t], x0, x1, x2, x3, x4, x5, x6, x7, x8,
                       b0, b1, b2, b3, b4, b5, b6, b7, b8)
        r2[t] = _taps9(r2[t], x0, x1, x2, x3, x4, x5, x6, x7, x8,
                       c0, c1, c2, c3, c4, c5, c6, c7, c8)
        r3[t] = _taps9(r3[t], x0, x1, x2, x3, x4, x5, x6, x7, x8,
                       d0, d1, d2, d3, d4, d5, d6, d7, d8)


@njit(cache=True, nogil=True, error_model="numpy")
def acc5(src, o, w, out):  # pragma: no cover - compiled
    """:func:`acc3` for the 25 taps of a 5x5 kernel, in five passes over ``out``, one per
    kernel row (:func:`_row5`). Each element's sum is stored between rows, as the float32 (or
    float64) it already is, so the sum and its bits are those of one pass.

    One pass of all 25 taps keeps 25 weights and 25 tap pointers live: on AVX2's 16 vector
    registers they were reloaded from the stack on every iteration. A row's 5 and 5 stay in
    registers. Zen 3 (AVX2), :func:`depthwise` on every channel of one image, the two
    alternating in one process, best of 300, one pass against rows: 240 channels of 14x14 146
    against 118 us, 120 of 14x14 74 against 59, 144 of 14x14 88 against 71, 240 of 28x28 402
    against 314, 672 of 14x14 409 against 329, 144 of 56x56 stride 2 365 against 317. (3x3
    kernels gained nothing in passes: :func:`acc3` keeps one.)
    """
    for k in range(0, 25, 5):
        _row5(src, o, k, w, out)


@njit(cache=True, nogil=True, error_model="numpy")
def _row5(src, o, k, w, out):  # pragma: no cover - compiled
    """``out[t] +=`` taps ``k..k+4`` of :func:`acc5`, in order, for every ``t`` of ``out``."""
    s0, s1, s2, s3, s4 = src[o[k]:], src[o[k + 1]:], src[o[k + 2]:], src[o[k + 3]:], \
        src[o[k + 4]:]
    w0, w1, w2, w3, w4 = w[k], w[k + 1], w[k + 2], w[k + 3], w[k + 4]
    for t in range(out.size):
        a = out[t]
        a += s0[t] * w0
        a += s1[t] * w1
        a += s2[t] * w2
        a += s3[t] * w3
        a += s4[t] * w4
        out[t] = a


@njit(cache=True, nogil=True, error_model="numpy")
def depthwise(x, w, s, pt, pl, rows, pitch, o, out, lo, hi):  # pragma: no cover - compiled
    """Output planes ``lo..hi`` (of N*M) of ``out`` (N, M, OH, OW), a depthwise convolution of
    ``x`` (N, C, H, W) with ``w`` (M, K*K), K 3 or 5, finite: stride ``s`` both ways, no
    dilation, leading pads ``pt``, ``pl``; phases ``rows`` x ``pitch``, tap offsets ``o``
    (:func:`geometry`, :func:`offsets`). Output channel ``m`` reads input channel
    ``m // (M // C)``.

    Each plane is split into its phases (:func:`split`), its taps summed from 0.0 along the
    flattened output (:func:`acc3`, :func:`acc5`), and the run's rows copied out. Padded taps
    add ``w * 0``, which leaves the bits of the channels-last loop that skips them.
    """
    m_, oh, ow = out.shape[1], out.shape[2], out.shape[3]
    mult = m_ // x.shape[1]
    size = s * s * rows * pitch
    span = rounded((oh - 1) * pitch + ow)
    flat = np.zeros(size + span, x.dtype)  # padding stays zero: split writes the pixels only
    run = np.empty(span, x.dtype)
    for p in range(lo, hi):
        n, m = divmod(p, m_)
        split(x[n, m // mult], s, pt, pl, rows, pitch, flat)
        run[:] = 0
        if w.shape[1] == 9:
            acc3(flat, o, w[m], run)
        else:
            acc5(flat, o, w[m], run)
        for b in range(oh):
            dst = out[n, m, b]
            src = run[b * pitch:]
            for e in range(ow):
                dst[e] = src[e]


@njit(cache=True, nogil=True, error_model="numpy")
def phases(image, s, pt, pl, rows, pitch, span):  # pragma: no cover - compiled
    """Every channel of ``image`` (C, H, W) split into its phases (:func:`split`), channel
    ``c``'s at ``c * s * s * rows * pitch`` of the returned 1-D buffer, which reaches ``span``
    past the last (the tap loops' rounded run)."""
    size = s * s * rows * pitch
    flat = np.zeros(image.shape[0] * size + span, image.dtype)
    for c in range(image.shape[0]):
        split(image[c], s, pt, pl, rows, pitch, flat[c * size:])
    return flat


@njit(cache=True, nogil=True, error_model="numpy")
def direct(flat, size, pitch, o, w, out, r0, oh):  # pragma: no cover - compiled
    """Rows ``r0 .. r0 + oh`` of ``out`` (M, OH, OW), one image's convolution (group 1), from
    the phases ``flat`` of the input rows those output rows read (:func:`phases` of the whole
    image for all of them, ``size`` per input channel) with ``w`` (M, C, K*K), K 3 or 5: each
    output element sums its taps from 0.0 in (channel, j, l) order, the im2col row order. A
    3x3 kernel's output channels go four at a time (:func:`acc3x4`)."""
    m_, ow = out.shape[0], out.shape[2]
    run = np.empty((4, rounded((oh - 1) * pitch + ow)), out.dtype)
    k2 = w.shape[2]
    step = 4 if k2 == 9 else 1
    for m0 in range(0, m_, step):
        m1 = min(m_, m0 + step)
        run[:] = 0
        for c in range(w.shape[1]):
            src = flat[c * size:]
            if m1 - m0 == 4:
                acc3x4(src, o, w[m0:m1, c], run)
                continue
            for m in range(m0, m1):
                if k2 == 9:
                    acc3(src, o, w[m, c], run[m - m0])
                else:
                    acc5(src, o, w[m, c], run[m - m0])
        for m in range(m0, m1):
            for b in range(oh):
                dst = out[m, r0 + b]
                row = run[m - m0, b * pitch:]
                for e in range(ow):
                    dst[e] = row[e]


# -- a depthwise convolution's native part (npu_sim.kernels.native) ---------------------------

#: The record of :func:`_depthwise_part` (int64 slots), then its ``parts + 1`` plane edges.
(_X, _N, _C, _H, _W, _WEIGHTS, _M, _TAPS, _S, _PT, _PL, _ROWS, _PITCH, _OFFSETS, _OUT, _OH,
 _OW, _EPILOGUE, _BIAS, _PARAMS, _PARTS) = range(21)
_HEAD = 21


def _depthwise_part(record, part):  # pragma: no cover - numba
    """Output channels ``edges[part]:edges[part + 1]`` of a depthwise convolution, image by
    image: :func:`depthwise` on their planes, then the epilogue loop (its bias and fused
    activation, :data:`.native.EPILOGUE`) on them."""
    h = carray(record, (_HEAD,), np.int64)
    edges = carray(record, (_HEAD + h[_PARTS] + 1,), np.int64)[_HEAD:]
    n, m, oh, ow, k2 = h[_N], h[_M], h[_OH], h[_OW], h[_TAPS]
    x = carray(address(h[_X]), (n, h[_C], h[_H], h[_W]), np.float32)
    w = carray(address(h[_WEIGHTS]), (m, k2), np.float32)
    o = carray(address(h[_OFFSETS]), (k2,), np.int64)
    out = carray(address(h[_OUT]), (n, m, oh, ow), np.float32)
    lo, hi = edges[part], edges[part + 1]
    for i in range(n):
        depthwise(x, w, h[_S], h[_PT], h[_PL], h[_ROWS], h[_PITCH], o, out, i * m + lo,
                  i * m + hi)
        epilogue(h[_EPILOGUE], h[_OUT] + (i * m + lo) * oh * ow * 4, h[_BIAS] + lo * 4, 0,
                 h[_PARAMS], hi - lo, oh * ow)


def depthwise_part() -> int:
    """The address of a depthwise convolution's :data:`.native.PART`
    (:func:`.native.compiled`); its record is :func:`depthwise_record`'s."""
    return compiled(PART, _depthwise_part)


def depthwise_record(args: tuple, bias: np.ndarray, loop: int, params: np.ndarray | None,
                     edges: list[int]) -> np.ndarray | None:
    """The record of a depthwise convolution's native parts, from :func:`depthwise`'s
    arguments but its plane range (``args``, as :func:`.depthwise.tapped_args` makes them),
    its ``bias`` (M,), the address of its :data:`.native.EPILOGUE` ``loop`` and the
    ``params`` it reads, and the parts' channel ``edges``; None when an array is not
    C-contiguous float32 (the offsets int64). The caller keeps them alive while the record is
    used."""
    x, w, s, pt, pl, rows, pitch, o, out = args
    if not contiguous_float32(x, w, out, bias) or \
            o.dtype != np.int64 or not o.flags.c_contiguous or bias.shape != (w.shape[0],):
        return None
    return record([address_of(x), *x.shape, address_of(w), *w.shape, s, pt, pl, rows, pitch,
                   address_of(o), address_of(out), *out.shape[2:], loop, address_of(bias),
                   optional_address(params), len(edges) - 1], edges)


#: The record of :func:`_direct_part` (int64 slots), then its ``parts + 1`` row edges and the
#: address of each part's phases buffer.
(_DX, _DN, _DC, _DH, _DW, _DS, _DPT, _DPL, _DROWS, _DPITCH, _DSIZE, _DTAPS, _DOFFSETS, _DWEIGHTS,
 _DM, _DOUT, _DOH, _DOW, _DEPILOGUE, _DBIAS, _DPARAMS, _DPARTS) = range(22)
_DHEAD = 22


def _direct_part(record, part):  # pragma: no cover - numba
    """Output rows ``edges[part]:edges[part + 1]`` of a direct convolution (an image stem), all
    channels, image by image: the input rows they read split into the part's own phases buffer
    (:func:`split`; its padding zeroed once, when the record was made), :func:`direct` on them,
    then the epilogue loop on each channel's rows. Each part reads only its band of the input,
    so the two cores fetch the image (a fresh input, not in cache) side by side."""
    h = carray(record, (_DHEAD,), np.int64)
    parts = h[_DPARTS]
    tail = carray(record, (_DHEAD + 2 * parts + 1,), np.int64)
    r0, r1 = tail[_DHEAD + part], tail[_DHEAD + part + 1]
    n, c, m, oh, ow, k2 = h[_DN], h[_DC], h[_DM], h[_DOH], h[_DOW], h[_DTAPS]
    s, size, rows, pitch = h[_DS], h[_DSIZE], h[_DROWS], h[_DPITCH]
    x = carray(address(h[_DX]), (n, c, h[_DH], h[_DW]), np.float32)
    o = carray(address(h[_DOFFSETS]), (k2,), np.int64)
    w = carray(address(h[_DWEIGHTS]), (m, c, k2), np.float32)
    out = carray(address(h[_DOUT]), (n, m, oh, ow), np.float32)
    flat = carray(address(tail[_DHEAD + parts + 1 + part]),
                  (c * size + rounded((r1 - r0 - 1) * pitch + ow),), np.float32)
    k = 3 if k2 == 9 else 5
    top = s * r0 - h[_DPT]  # the input row at the band's first padded row
    start, end = max(top, 0), min(h[_DH], s * (r1 - 1) - h[_DPT] + k)
    for i in range(n):
        for ch in range(c):
            split(x[i, ch, start:end], s, start - top, h[_DPL], rows, pitch, flat[ch * size:])
        direct(flat, size, pitch, o, w, out[i], r0, r1 - r0)
        for mm in range(m):
            epilogue(h[_DEPILOGUE], h[_DOUT] + ((i * m + mm) * oh + r0) * ow * 4,
                     h[_DBIAS] + mm * 4, 0, h[_DPARAMS], 1, (r1 - r0) * ow)


def direct_part() -> int:
    """The address of a direct convolution's :data:`.native.PART` (:func:`.native.compiled`);
    its record is :func:`direct_record`'s."""
    return compiled(PART, _direct_part)


def direct_record(x: np.ndarray, k: int, s: int, pads: tuple[int, int], w: np.ndarray,
                  out: np.ndarray, bias: np.ndarray, loop: int, params: np.ndarray | None,
                  edges: list[int]) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """The record of a direct convolution's native parts and their phases buffers: input ``x``
    (N, C, H, W), a ``k`` x ``k`` kernel at stride ``s`` with leading ``pads`` (top, left);
    weights ``w`` (M, C, K*K); output ``out`` (N, M, OH, OW); the ``bias``, the address of the
    :data:`.native.EPILOGUE` ``loop`` and the ``params`` it reads; the parts' output row
    ``edges``. Every band's phases have the geometry of the tallest (:func:`geometry`), so one
    table of tap offsets serves them all. None when an array is not C-contiguous float32."""
    if not contiguous_float32(x, w, out, bias) or bias.shape != (w.shape[0],) or \
            w.ndim != 3 or x.ndim != 4 or out.ndim != 4 or \
            out.shape[:2] != (x.shape[0], w.shape[0]) or w.shape[1] != x.shape[1]:
        return None
    tallest = max(b - a for a, b in zip(edges, edges[1:], strict=False))
    rows, pitch, span = geometry(k, s, tallest, out.shape[3])
    size = s * s * rows * pitch
    o = offsets(k, s, rows, pitch)
    # zeroed once: split writes the pixels only, and a band's padding is the same every run
    buffers = [np.zeros(x.shape[1] * size + rounded(span), np.float32) for _ in edges[1:]]
    return record([address_of(x), *x.shape, s, *pads, rows, pitch, size, o.size,
                   address_of(o), address_of(w), w.shape[0], address_of(out), *out.shape[2:],
                   loop, address_of(bias), optional_address(params), len(edges) - 1],
                  edges, buffers), [o, *buffers]
