"""Kernel: ConvTranspose, the adjoint of :mod:`.conv`'s convolution.

One GEMM per group multiplies the transposed weights with the input, giving each input pixel's
kernel-sized patch of the output as a column; *col2im* (numba, serial: a numba parallel loop
fights OpenBLAS's spinning threads) scatter-adds the columns into the output. The geometry
(:func:`transpose_window`) follows the ONNX rules for ``output_padding``, ``output_shape`` and
``auto_pad`` as onnxruntime applies them; the window helpers are :mod:`.conv`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from ..errors import KernelError
from .conv import (
    _AUTO_PADS,
    MAX_SPATIAL,
    Window,
    _bias,
    _inputs,
    add_bias,
    as5d,
    explicit_pads,
    int_tuple,
    spatial_rank,
    split_pads,
)
from .gemm import finish, same_dtype, to_compute
from .limits import check_elements
from .registry import kernel


@njit(cache=True)  # serial: a numba parallel loop fights OpenBLAS's spinning threads
def _col2im(cols, k, st, di, pb, in_dims, out):  # pragma: no cover - compiled
    """Scatter-add cols[(m, i, j, l), (a, b, e)] into out[m, a*s-p+i*d, ...] (out zero-filled)."""
    M, OD, OH, OW = out.shape
    KD, KH, KW = k[0], k[1], k[2]
    ID, IH, IW = in_dims[0], in_dims[1], in_dims[2]
    for m in range(M):
        for i in range(KD):
            for j in range(KH):
                for lw in range(KW):
                    r = ((m * KD + i) * KH + j) * KW + lw
                    for a in range(ID):
                        z = a * st[0] - pb[0] + i * di[0]
                        if z < 0 or z >= OD:
                            continue
                        for b in range(IH):
                            y = b * st[1] - pb[1] + j * di[1]
                            if y < 0 or y >= OH:
                                continue
                            base = (a * IH + b) * IW
                            for e in range(IW):
                                xx = e * st[2] - pb[2] + lw * di[2]
                                if 0 <= xx < OW:
                                    out[m, z, y, xx] += cols[r, base + e]



def transpose_window(
    op: str, in_shape: Sequence[int], kernel_shape: Sequence[int], attrs: Mapping[str, Any]
) -> Window:
    """ConvTranspose geometry: ``out`` is the output's spatial shape, ``pads_*`` the crop."""
    rank = len(in_shape)
    strides = int_tuple(op, attrs, "strides", (1,) * rank, 1)
    dilations = int_tuple(op, attrs, "dilations", (1,) * rank, 1)
    out_pad = int_tuple(op, attrs, "output_padding", (0,) * rank, 0)
    for p, s, d in zip(out_pad, strides, dilations, strict=True):
        if p >= max(s, d):
            raise KernelError(
                op,
                "",
                f"output_padding={list(out_pad)} must be smaller than the stride or "
                f"dilation ({list(strides)}, {list(dilations)})",
            )
    auto_pad = str(attrs.get("auto_pad", "NOTSET"))
    if auto_pad not in _AUTO_PADS:
        raise KernelError(op, "", f"auto_pad={auto_pad!r}; expected one of {list(_AUTO_PADS)}")
    full = [
        s * (i - 1) + p + (k - 1) * d + 1
        for s, i, p, k, d in zip(strides, in_shape, out_pad, kernel_shape, dilations, strict=True)
    ]
    if "output_shape" in attrs or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if "output_shape" in attrs:
            out = [int(v) for v in attrs["output_shape"]][-rank:]
            if len(out) != rank:
                raise KernelError(
                    op, "", f"output_shape={list(attrs['output_shape'])} needs {rank} spatial dims"
                )
            if any(o >= f + s for o, f, s in zip(out, full, strides, strict=True)):
                raise KernelError(
                    op,
                    "",
                    f"output_shape {out} does not fit the input: each entry must be below the "
                    f"full output {full} plus the stride {list(strides)}",
                )
        else:
            # onnxruntime's rule: in * stride, but never beyond the full output
            out = [min(i * s, f) for i, s, f in zip(in_shape, strides, full, strict=True)]
        # An output_shape beyond the full output crops nothing and leaves zeros (plus bias)
        # at the end, as onnxruntime does.
        total = [max(0, f - o) for f, o in zip(full, out, strict=True)]
        begin, end = split_pads(total, upper=auto_pad == "SAME_UPPER")
    else:
        begin, end = explicit_pads(op, attrs, rank, auto_pad)
        out = [f - b - e for f, b, e in zip(full, begin, end, strict=True)]
    if any(o < 1 for o in out):
        raise KernelError(op, "", f"pads {begin + end} leave an empty output {out}")
    return Window(tuple(kernel_shape), strides, dilations, tuple(begin), tuple(end), tuple(out))


@kernel("ConvTranspose")
def conv_transpose(
    inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
) -> list[np.ndarray]:
    """ONNX ConvTranspose (1-3 spatial dims, groups, dilations, output_padding/output_shape)."""
    x, w, b = _inputs("ConvTranspose", inputs)
    op = "ConvTranspose"
    dtype = same_dtype(op, {"X": x, "W": w, "B": b})
    spatial_rank(op, x.shape)
    if w.ndim != x.ndim:
        raise KernelError(op, "", f"weight shape {w.shape} must have the input's rank {x.ndim}")
    group = int(attrs.get("group", 1))
    c = x.shape[1]
    if group < 1 or c % group or w.shape[0] != c:
        raise KernelError(
            op,
            "",
            f"weight shape {w.shape} and group={group} do not fit {c} input channels "
            f"(weight dim 0 must equal the input channels, group must divide them)",
        )
    if "kernel_shape" in attrs and tuple(attrs["kernel_shape"]) != tuple(w.shape[2:]):
        raise KernelError(
            op,
            "",
            f"kernel_shape={list(attrs['kernel_shape'])} does not match the weight's "
            f"spatial dims {list(w.shape[2:])}",
        )
    win = transpose_window(op, x.shape[2:], w.shape[2:], attrs)
    mg = w.shape[1]
    m = mg * group
    check_elements(op, "output", (x.shape[0], m) + win.out)
    bias = _bias(op, b, m)
    x32, w32 = to_compute(op, "X", x), to_compute(op, "W", w)
    n = x.shape[0]
    k3, st3, di3, pb3 = win.as3()
    in3 = np.array(as5d(x).shape[2:], np.int64)
    out3 = (1,) * (MAX_SPATIAL - len(win.out)) + win.out
    kp = int(np.prod(k3))
    pixels = int(np.prod(in3))
    cg = c // group
    wg = w32.reshape(group, cg, mg * kp)
    xg = x32.reshape(n, group, cg, pixels)
    y = np.zeros((n, m) + out3, np.float32)
    cols = np.empty((group, mg * kp, pixels), np.float32)
    for i in range(n):
        for g in range(group):
            np.matmul(wg[g].T, xg[i, g], out=cols[g])
        _col2im(cols.reshape(m * kp, pixels), k3, st3, di3, pb3, in3, y[i])
    y = y.reshape((n, m) + win.out)
    if bias is not None:
        add_bias(y, bias)
    return [finish(y, attrs, dtype, op, inputs)]
