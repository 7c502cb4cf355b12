"""Kernel helper: the im2col unfold of a convolution with long strided output rows, in numba.

:func:`npu_sim.kernels.conv.unfolder` pads the image and copies one strided view of it; for an
image stem (3 channels of 224x224, stride 2) the pad is a whole extra pass, and the stride-2
copy gathers every other element. Here instead :func:`phases` splits each input row once into
its ``stride`` phases (every ``stride``-th element from offset ``p``), once per image, and
:func:`fill` writes a band of output rows from them: each kernel tap's output row is one
contiguous copy from a phase, with the out-of-bounds head and tail zero-filled, bounds computed
per row rather than tested per element: there is no padded copy. The values are the same
elements, so the bits of the convolution do not change.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: The numba unfold runs when the width stride is above 1 and output rows are at least this
#: long. Best of 30, one image, numba against pad plus numpy copy: 3 channels of 224x224 3x3
#: stride 2 (MobileNet-V3's stem) 93 against 150 us, 3 of 224x224 7x7 stride 2 363 against
#: 663, 16 of 112x112 3x3 stride 2 158 against 212, 32 of 112x112 316 against 412; but 64 of
#: 56x56 stride 2 (28-pixel rows) 227 against 209, 128 of 28x28 211 against 143, and stride 1
#: is mixed (16 of 112x112 291 against 260, 64 of 56x56 403 against 332).
MIN_ROW = 56


def fits(dtype: np.dtype, stride_w: int, out_w: int) -> bool:
    """Whether a convolution's unfold (width stride ``stride_w``, output width ``out_w``) runs
    from its phases (:func:`phases`, :func:`fill`) rather than as a pad and a strided numpy
    copy (float32 and float64 only: numba has no float16 arrays)."""
    return dtype in (np.float32, np.float64) and stride_w > 1 and out_w >= MIN_ROW


@njit(cache=True, nogil=True, error_model="numpy")
def phases(x, s):  # pragma: no cover - compiled
    """``x`` (C, D, H, W) split along W into its ``s`` phases: (C, D, H, s, ceil(W / s)), phase
    ``p`` of a row every ``s``-th element from offset ``p``."""
    c, d, h, w = x.shape
    out = np.empty((c, d, h, s, (w + s - 1) // s), x.dtype)
    for ci in range(c):
        for z in range(d):
            for y in range(h):
                row = x[ci, z, y]
                for p in range(s):
                    dst = out[ci, z, y, p]
                    for e in range((w - p + s - 1) // s):
                        dst[e] = row[p + e * s]
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def fill(phases, w, k, st, di, pb, cols):  # pragma: no cover - compiled
    """Fill ``cols`` (C*KD*KH*KW, OD, OH, OW) from the phase-split input ``phases`` (C, D, H,
    stride, ceil(W / stride), :func:`phases`) of an input ``w`` wide, 3-D kernel ``k``, strides
    ``st``, dilations ``di`` and leading pads ``pb`` (int64 arrays of 3; output rows from
    ``r0`` on are those of a leading row pad less ``r0`` strides). Each tap's output row is a
    zero head, one contiguous copy of the in-bounds columns (views from 0, so LLVM vectorises
    it) and a zero tail."""
    c, d, h = phases.shape[0], phases.shape[1], phases.shape[2]
    od, oh, ow = cols.shape[1], cols.shape[2], cols.shape[3]
    s = st[2]
    for ci in range(c):
        for i in range(k[0]):
            for j in range(k[1]):
                for lw in range(k[2]):
                    r = ((ci * k[0] + i) * k[1] + j) * k[2] + lw
                    off = lw * di[2] - pb[2]  # input column of output column e: e * s + off
                    e0 = 0 if off >= 0 else min(ow, (s - 1 - off) // s)
                    e1 = max(e0, min(ow, (w - 1 - off) // s + 1)) if off <= w - 1 else e0
                    col = e0 * s + off
                    for a in range(od):
                        z = a * st[0] - pb[0] + i * di[0]
                        for b in range(oh):
                            y = b * st[1] - pb[1] + j * di[1]
                            dst = cols[r, a, b]
                            if z < 0 or z >= d or y < 0 or y >= h or e1 == e0:
                                dst[:] = 0
                                continue
                            dst[:e0] = 0
                            dst[e1:] = 0
                            part = dst[e0:e1]
                            src = phases[ci, z, y, col % s, col // s:]
                            for e in range(e1 - e0):
                                part[e] = src[e]
