"""Winograd minimal filtering F(2x2, 3x3) for 3x3, stride-1, undilated 2-D convolutions.

A direct 3x3 convolution spends 9 multiply-adds per output pixel per input channel. Winograd's
F(2x2, 3x3) computes each 2x2 output tile from a 4x4 input tile with 16: the input tile ``d`` and
the filter ``g`` are mapped into a transform domain (``V = B^T d B``, ``U = G g G^T``), multiplied
element-wise, and mapped back (``Y = A^T (U * V) A``). Summed over channels, the element-wise
product at each of the 16 tile positions is a GEMM, so a layer becomes

* an input transform (numba): every 4x4 tile of every channel into ``V[16, C, tiles]``;
* 16 GEMMs ``U[t] (K x C) @ V[t] (C x tiles)``, one batched numpy ``matmul`` (BLAS);
* an output transform (numba): ``M[16, K, tiles]`` back into 2x2 output tiles.

That is 16/36 = 0.44 of the direct GEMM's multiplies, at the cost of two memory-bound passes.
F(4x4, 3x3) would need 36/144 = 0.25, but its transforms amplify float32 rounding (coefficients
up to 8 and 1/24): measured on ResNet-50 layer shapes (64 to 512 channels) it misses the float32
tolerance against onnxruntime (rtol 1e-4, atol 1e-5) by up to 18x, so F(2x2, 3x3) is used; its
coefficients are 0, +-1 and 1/2, exact in float32.

The transformed filters ``U`` are cached: a network reuses the same weights on every run, and
transforming them each call would cost more memory traffic than the GEMMs save. The cache is
keyed by a cheap fingerprint (shape and a few sampled values) and every hit is confirmed by an
exact comparison with a copy of the weights it was built from, so a weight array that changed in
place, or a different array at a recycled address, can never reuse a stale transform; the
comparison reads the weights once more, which costs far less than the multiplies saved on the
layer shapes :func:`eligible` accepts. The numba loops are serial for the same reason as the
ones in :mod:`npu_sim.kernels.conv` (they run between BLAS calls whose threads keep spinning).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

import numpy as np
from numba import njit

#: Smallest channels per group (input and output) for which the transforms pay for themselves.
MIN_CHANNELS = 32
#: Smallest output image (H * W) for which the transforms pay for themselves.
MIN_PIXELS = 14 * 14
#: Most transformed filters kept; ResNet-50 has 13 eligible convolutions.
CACHE_ENTRIES = 64

#: Filter transform G of F(2x2, 3x3).
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

_STATS = {"winograd.calls": 0, "winograd.filter_transforms": 0}
_LOCK = threading.Lock()
_WORK = threading.local()
_CACHE: OrderedDict[tuple, tuple[np.ndarray, np.ndarray]] = OrderedDict()


def stats() -> dict[str, int]:
    """Counters: ``winograd.calls`` (convolutions run here) and ``winograd.filter_transforms``
    (cache misses that transformed a filter)."""
    with _LOCK:
        return dict(_STATS)


def reset_stats() -> None:
    """Zero the counters of :func:`stats`."""
    with _LOCK:
        for key in _STATS:
            _STATS[key] = 0


def eligible(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    group: int,
    strides: tuple[int, ...],
    dilations: tuple[int, ...],
    out: tuple[int, ...],
    dtype: np.dtype,
) -> bool:
    """Whether a validated Conv is 2-D, 3x3, stride 1, undilated, float32 and large enough for
    Winograd to be faster than im2col + GEMM (crossover measured on ResNet-50 layer shapes)."""
    return (
        len(x_shape) == 4
        and tuple(w_shape[2:]) == (3, 3)
        and tuple(strides) == (1, 1)
        and tuple(dilations) == (1, 1)
        and np.dtype(dtype) == np.float32
        and w_shape[1] >= MIN_CHANNELS
        and w_shape[0] // group >= MIN_CHANNELS
        and out[0] * out[1] >= MIN_PIXELS
    )


def conv3x3(
    x: np.ndarray, w: np.ndarray, group: int, pads_begin: tuple[int, int], out: tuple[int, int]
) -> np.ndarray:
    """Grouped 3x3 stride-1 correlation of ``x`` (N, C, H, W) with ``w`` (K, C/group, 3, 3), no
    bias, giving (N, K, *out); ``pads_begin`` are the top/left pads (the bottom/right ones are
    implied by ``out``). Shapes must already be validated; ``x`` and ``w`` are float32."""
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    oh, ow = out
    th, tw = -(-oh // 2), -(-ow // 2)
    tiles = n * th * tw
    u = _filters(w, group)
    # Zero-padded to whole tiles: 2 * tiles + 2 covers the top pad, the input and the bottom pad.
    xp = np.zeros((n, c, 2 * th + 2, 2 * tw + 2), np.float32)
    h, w_ = x.shape[2:]
    xp[:, :, pads_begin[0] : pads_begin[0] + h, pads_begin[1] : pads_begin[1] + w_] = x
    v = _work("v", (16, c, tiles))
    _input_transform(xp, th, tw, v)
    m = _work("m", (16, group, k // group, tiles))
    np.matmul(u, v.reshape(16, group, cg, tiles), out=m)
    y = np.empty((n, k, oh, ow), np.float32)
    _output_transform(m.reshape(16, k, tiles), th, tw, y)
    with _LOCK:
        _STATS["winograd.calls"] += 1
    return y


def _work(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A reused per-thread float32 buffer of ``shape`` (contents undefined).

    The transformed tiles are MBs per layer; fresh allocations measured ~50% slower on the
    56x56x64 layer (a page fault per 4 KiB on first touch), as for the im2col scratch in conv.
    """
    size = math.prod(shape)
    buffers = _WORK.__dict__.setdefault("buffers", {})
    buf = buffers.get(name)
    if buf is None or buf.size < size:
        buf = buffers[name] = np.empty(size, np.float32)
    return buf[:size].reshape(shape)


def _filters(w: np.ndarray, group: int) -> np.ndarray:
    """``U = G w G^T`` as (16, group, K/group, C/group), from the cache when ``w`` is unchanged."""
    flat = w.reshape(-1)
    probe = flat[:: max(1, flat.size // 16)][:16]
    key = (w.shape, group, probe.tobytes())
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None and np.array_equal(hit[0], w):
            _CACHE.move_to_end(key)
            return hit[1]
    k, cg = w.shape[:2]
    u = np.einsum("ij,kcjl,ml->imkc", _G, w.astype(np.float64), _G).astype(np.float32)
    u = np.ascontiguousarray(u.reshape(16, group, k // group, cg))
    with _LOCK:
        _STATS["winograd.filter_transforms"] += 1
        _CACHE[key] = (w.copy(), u)
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return u


@njit(cache=True)
def _input_transform(xp, th, tw, v):  # pragma: no cover - compiled
    """``v[4r + s, c, tile] = (B^T d B)[r, s]`` for every 4x4 tile ``d`` of the padded ``xp``.

    One tile row at a time: the row combinations of B^T run over the whole padded row, the
    column ones write each of the 16 outputs as a contiguous run of tiles (a per-tile loop
    scattering 16 values measured 5x slower).
    """
    N, C = xp.shape[0], xp.shape[1]
    Wp = xp.shape[3]
    e = np.empty((4, Wp), np.float32)
    for n in range(N):
        for c in range(C):
            for i in range(th):
                y0 = 2 * i
                for q in range(Wp):  # B^T d: rows
                    e[0, q] = xp[n, c, y0, q] - xp[n, c, y0 + 2, q]
                    e[1, q] = xp[n, c, y0 + 1, q] + xp[n, c, y0 + 2, q]
                    e[2, q] = xp[n, c, y0 + 2, q] - xp[n, c, y0 + 1, q]
                    e[3, q] = xp[n, c, y0 + 1, q] - xp[n, c, y0 + 3, q]
                p0 = (n * th + i) * tw
                for r in range(4):  # (B^T d) B: columns
                    for j in range(tw):
                        q = 2 * j
                        v[4 * r, c, p0 + j] = e[r, q] - e[r, q + 2]
                        v[4 * r + 1, c, p0 + j] = e[r, q + 1] + e[r, q + 2]
                        v[4 * r + 2, c, p0 + j] = e[r, q + 2] - e[r, q + 1]
                        v[4 * r + 3, c, p0 + j] = e[r, q + 1] - e[r, q + 3]


@njit(cache=True)
def _output_transform(m, th, tw, y):  # pragma: no cover - compiled
    """``y`` 2x2 tiles ``A^T M A`` from ``m[4r + s, k, tile]``, cropped to ``y``'s size."""
    N, K, OH, OW = y.shape
    a = np.empty((2, 4, tw), np.float32)
    half = OW // 2
    for n in range(N):
        for k in range(K):
            for i in range(th):
                p0 = (n * th + i) * tw
                for s in range(4):  # A^T M: rows, contiguous over the tiles of a tile row
                    for j in range(tw):
                        p = p0 + j
                        a[0, s, j] = m[s, k, p] + m[4 + s, k, p] + m[8 + s, k, p]
                        a[1, s, j] = m[4 + s, k, p] - m[8 + s, k, p] - m[12 + s, k, p]
                for r in range(2):  # (A^T M) A: columns
                    yy = 2 * i + r
                    if yy >= OH:
                        continue
                    for j in range(half):
                        y[n, k, yy, 2 * j] = a[r, 0, j] + a[r, 1, j] + a[r, 2, j]
                        y[n, k, yy, 2 * j + 1] = a[r, 1, j] - a[r, 2, j] - a[r, 3, j]
                    if OW % 2:
                        y[n, k, yy, OW - 1] = a[r, 0, half] + a[r, 1, half] + a[r, 2, half]
