"""Kernel helper: native code reached by address (parts run over the cores, BLAS's own calls).

A launch split over the cores with Python parts pays for the GIL at every part's start and
between its calls (:mod:`.cores`); a part that is one native function pays neither: the helper
threads run it from their spin loop (:func:`.cores.split_native`). Such a part is a numba
``cfunc`` of :data:`PART` that reads its operands from an ``int64`` record of addresses and
sizes, and calls, by address, the BLAS functions numpy's ``matmul`` calls
(:func:`sgemm_address`, :func:`sgemv_address`) and the one-pass epilogue loop of the launch
(:data:`EPILOGUE`, each a ``cfunc`` beside the loop it runs: numba's cache knows a function's
own file only, so a cached part never keeps an old copy of a loop it would inline).

This module holds the 1x1 convolution's part (:func:`pointwise_part`, rows of weights times
each image's pixel columns) and the classifier Gemm's (:func:`gemv_part`, outputs of a row
vector times a transposed matrix); the depthwise and image-stem parts live beside their loops
(:mod:`.taps`, :mod:`.depthwise`). A part that calls numpy's ``cblas_sgemm`` or ``cblas_sgemv``
on the operands ``matmul`` would pass gets ``matmul``'s bits (``tests/kernels/test_native.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, types
from numba.extending import intrinsic

from . import blas, cores

PART = types.void(types.voidptr, types.int64)
"""A native part: ``void f(void *record, int64 part)`` (:func:`.cores.split_native`)."""

EPILOGUE = types.void(types.voidptr, types.voidptr, types.voidptr, types.voidptr, types.int64,
                      types.int64)
"""A one-pass epilogue on ``rows`` x ``columns`` float32 elements, in place:
``void f(float *y, float *bias, float *residual, double *params, int64 rows, int64 columns)``
(the bias is each row's; the residual, of ``y``'s shape, and the parameters may be null when
the loop reads none)."""

_SYMBOLS = {"sgemm": "scipy_cblas_sgemm64_", "sgemv": "scipy_cblas_sgemv64_"}
"""numpy's OpenBLAS (scipy-openblas64): ``cblas_sgemm`` and ``cblas_sgemv`` with 64-bit
integers."""


@functools.cache
def _blas_address(name: str) -> int | None:
    if blas.kernel_split() is None:
        return None
    paths = [Path(lib.filepath) for lib in blas._libraries() if lib.internal_api == "openblas"]
    try:
        function = getattr(ctypes.CDLL(str(paths[0])), _SYMBOLS[name])
    except (AttributeError, IndexError, OSError):
        return None
    return ctypes.cast(function, ctypes.c_void_p).value


def sgemm_address() -> int | None:
    """The address of the ``cblas_sgemm`` numpy's ``matmul`` calls, or None when numpy's BLAS
    is not the bundled OpenBLAS with 64-bit integers whose GEMM splits are known
    (:func:`.blas.kernel_split`): then no native GEMM part runs."""
    return _blas_address("sgemm")


def sgemv_address() -> int | None:
    """The address of the ``cblas_sgemv`` numpy's ``matmul`` calls for a row vector times a
    matrix, or None (as :func:`sgemm_address`)."""
    return _blas_address("sgemv")


@functools.cache
def compiled(signature: types.Signature, function: object) -> int:
    """The address of ``function`` compiled as a numba ``cfunc`` of ``signature`` (a
    :data:`PART` or an :data:`EPILOGUE`), compiled or loaded from numba's cache on first use."""
    return cfunc(signature, cache=True)(function).address


def address_of(a: np.ndarray) -> int:
    """The address of ``a``'s first element."""
    return a.__array_interface__["data"][0]


def optional_address(a: np.ndarray | None) -> int:
    """``a``'s address, or 0 (a null pointer) for no array."""
    return 0 if a is None else address_of(a)


def contiguous_float32(*arrays: np.ndarray) -> bool:
    """Whether every array is C-contiguous float32, as a part reads them through their
    addresses."""
    return all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays)


def record(head: Sequence[int], edges: Sequence[int],
           buffers: Sequence[np.ndarray] = ()) -> np.ndarray:
    """A native part's record, laid out as every part reads it: its ``head`` (int64 slots
    whose last holds the part count), the parts' ``len(edges)`` boundaries, then the address
    of each of ``buffers`` (per part or per image, as the part says)."""
    return np.array([*head, *edges, *(address_of(b) for b in buffers)], np.int64)


def launch(record: np.ndarray, part: int, parts: int, arrays: tuple, *,
           finite: np.ndarray | None = None, before: Callable[[], object] | None = None,
           blas_call: bool = False) -> Callable[[], bool]:
    """A launch of ``parts`` native parts at address ``part`` reading ``record``, which holds
    the addresses of ``arrays`` (kept alive with the launch, as the record is: its
    ``arrays``). Each run first returns False (nothing written) when ``finite`` holds a
    non-finite value (the tap loops multiply padding by the weights: ``inf * 0`` is NaN), then
    calls ``before`` (its result kept until the parts have run), then splits
    (:func:`.cores.split_native`); ``blas_call``: the parts call BLAS, which runs one thread
    per part."""
    data = record.ctypes.data

    def run() -> bool:
        if finite is not None and not np.isfinite(finite).all():
            return False
        made = before() if before is not None else None
        with blas.single_thread() if blas_call else contextlib.nullcontext():
            cores.split_native(parts, part, data)
        del made
        return True

    run.arrays = (record, *arrays)  # type: ignore[attr-defined]
    return run


def _pointer(builder: ir.IRBuilder, address: ir.Value) -> ir.Value:
    return builder.inttoptr(address, ir.IntType(8).as_pointer())


@intrinsic
def sgemm(typingctx, function, m, n, k, a, b, c):  # pragma: no cover - compiled
    """``c = a @ b`` by the ``cblas_sgemm`` at ``function``: row-major float32 matrices at
    addresses ``a`` (m x k), ``b`` (k x n) and ``c`` (m x n), each C-contiguous."""
    def codegen(context, builder, signature, args):
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, ptr, i64,
                                               ptr, i64, f32, ptr, i64])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        row_major, no_trans = ir.Constant(i32, 101), ir.Constant(i32, 111)
        m_, n_, k_ = args[1], args[2], args[3]
        builder.call(fn, [row_major, no_trans, no_trans, m_, n_, k_, ir.Constant(f32, 1.0),
                          _pointer(builder, args[4]), k_, _pointer(builder, args[5]), n_,
                          ir.Constant(f32, 0.0), _pointer(builder, args[6]), n_])
        return context.get_dummy_value()
    i64 = types.int64
    return types.void(i64, i64, i64, i64, i64, i64, i64), codegen


@intrinsic
def sgemv_t(typingctx, function, k, n, a, x, y):  # pragma: no cover - compiled
    """``y = a @ x`` by the ``cblas_sgemv`` at ``function`` as numpy's ``matmul`` calls it for
    ``x @ a.T``: ``a`` (n x k) row-major, seen column-major (k x n) and transposed; ``x`` (k)
    and ``y`` (n) contiguous."""
    def codegen(context, builder, signature, args):
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i64, i64, f32, ptr, i64, ptr, i64,
                                               f32, ptr, i64])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        col_major, trans, one = ir.Constant(i32, 102), ir.Constant(i32, 112), ir.Constant(i64, 1)
        builder.call(fn, [col_major, trans, args[1], args[2], ir.Constant(f32, 1.0),
                          _pointer(builder, args[3]), args[1], _pointer(builder, args[4]), one,
                          ir.Constant(f32, 0.0), _pointer(builder, args[5]), one])
        return context.get_dummy_value()
    i64 = types.int64
    return types.void(i64, i64, i64, i64, i64, i64), codegen


@intrinsic
def epilogue(typingctx, function, y, bias, residual, params, rows,
             columns):  # pragma: no cover - compiled
    """Call the :data:`EPILOGUE` loop at address ``function`` (the other arguments are
    addresses, 0 for none, and sizes)."""
    def codegen(context, builder, signature, args):
        i64, ptr = ir.IntType(64), ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [ptr, ptr, ptr, ptr, i64, i64])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        builder.call(fn, [_pointer(builder, a) for a in args[1:5]] + list(args[5:]))
        return context.get_dummy_value()
    i64 = types.int64
    return types.void(i64, i64, i64, i64, i64, i64, i64), codegen


@intrinsic
def address(typingctx, value):  # pragma: no cover - compiled
    """The address ``value`` (an int64) as a ``void *``, for ``numba.carray``."""
    def codegen(context, builder, signature, args):
        return _pointer(builder, args[0])
    return types.voidptr(types.int64), codegen


# -- a 1x1 convolution's part -----------------------------------------------------------------

#: The head of a 1x1 convolution's record (int64 slots), then its ``parts + 1`` row edges, then
#: the address of each image's pixel columns.
(_SGEMM, _WEIGHTS, _SOURCE, _SCALE, _M, _K, _P, _IMAGES, _Y, _BIAS, _EPILOGUE, _RESIDUAL,
 _PARAMS, _PARTS) = range(14)
_HEAD = 14


def _pointwise_part(record, part):  # pragma: no cover - numba
    """Rows ``edges[part]:edges[part + 1]`` of a 1x1 convolution, image by image: the weight
    rows (scaled per input channel first when the record has a scale, as numpy multiplies
    them), one sgemm against the image's columns, then the epilogue loop on those rows."""
    head = carray(record, (_HEAD,), np.int64)
    parts, images = head[_PARTS], head[_IMAGES]
    tail = carray(record, (_HEAD + parts + 1 + images,), np.int64)
    lo, hi = tail[_HEAD + part], tail[_HEAD + part + 1]
    m, k, p = head[_M], head[_K], head[_P]
    rows, weights = hi - lo, head[_WEIGHTS] + lo * k * 4
    if head[_SCALE]:
        src = carray(address(head[_SOURCE] + lo * k * 4), (rows, k), np.float32)
        dst = carray(address(weights), (rows, k), np.float32)
        scale = carray(address(head[_SCALE]), (k,), np.float32)
        for r in range(rows):
            for c in range(k):
                dst[r, c] = src[r, c] * scale[c]
    for i in range(images):
        offset = (i * m + lo) * p * 4
        y = head[_Y] + offset
        sgemm(head[_SGEMM], rows, p, k, weights, tail[_HEAD + parts + 1 + i], y)
        residual = head[_RESIDUAL] + offset if head[_RESIDUAL] else 0
        epilogue(head[_EPILOGUE], y, head[_BIAS] + lo * 4, residual, head[_PARAMS], rows, p)


def pointwise_part() -> int:
    """The address of the 1x1 convolution's :data:`PART` (:func:`compiled`); its record is
    :func:`pointwise_record`'s."""
    return compiled(PART, _pointwise_part)


def pointwise_record(weights: np.ndarray, scaled: tuple[np.ndarray, np.ndarray] | None,
                     columns: Sequence[np.ndarray], y: np.ndarray, bias: np.ndarray,
                     loop: int, residual: np.ndarray | None, params: np.ndarray | None,
                     edges: Sequence[int]) -> np.ndarray | None:
    """The record of a 1x1 convolution's parts, or None when a part could not run it natively.

    ``weights`` (M, K) are the GEMM's left operand, or, with ``scaled`` = (source weights,
    scale per input channel), the buffer each part scales its rows into; ``columns`` each
    image's (K, P) pixels; ``y`` the output (N, M, P); ``bias`` (M,); ``loop`` the address of
    the :data:`EPILOGUE` after the products, which reads ``residual`` (``y``'s shape) and
    ``params`` when given; ``edges`` the parts' row boundaries. Every array must be
    C-contiguous float32 (the parameters float64), and the caller keeps them alive while the
    record is used. Products of one pixel column stay on numpy, which multiplies them as
    matrix-vector products (another BLAS function)."""
    sgemm = sgemm_address()
    m, k = weights.shape
    n, p = y.shape[0], y.shape[2]
    arrays = [weights, y, bias, *columns, *(scaled or ()), *([] if residual is None else
                                                               [residual])]
    if sgemm is None or p < 2 or y.shape[1] != m or len(columns) != n or \
            not contiguous_float32(*arrays) or \
            any(c.shape != (k, p) for c in columns) or bias.shape != (m,) or \
            (residual is not None and residual.shape != y.shape) or \
            (scaled is not None and (scaled[0].shape != (m, k) or scaled[1].size != k)):
        return None
    head = np.zeros(_HEAD, np.int64)
    head[[_SGEMM, _WEIGHTS, _M, _K, _P, _IMAGES, _Y, _BIAS, _EPILOGUE, _PARTS]] = (
        sgemm, address_of(weights), m, k, p, n, address_of(y), address_of(bias), loop,
        len(edges) - 1)
    if scaled is not None:
        head[_SOURCE], head[_SCALE] = address_of(scaled[0]), address_of(scaled[1])
    if residual is not None:
        head[_RESIDUAL] = address_of(residual)
    head[_PARAMS] = optional_address(params)
    return record(head.tolist(), edges, columns)


# -- a row vector times a transposed matrix's part (a classifier's Gemm) -----------------------

(_GEMV, _A, _X, _YV, _K2, _BIASV, _LOOP, _PARAMSV, _PARTSV) = range(9)
_HEADV = 9


def _gemv_part(record, part):  # pragma: no cover - numba
    """Outputs ``edges[part]:edges[part + 1]`` of ``x @ a.T``: one sgemv over those rows of
    ``a``, then the epilogue loop on those outputs (each a row of one element, its bias the
    matching element of C)."""
    head = carray(record, (_HEADV,), np.int64)
    edges = carray(record, (_HEADV + head[_PARTSV] + 1,), np.int64)[_HEADV:]
    lo, hi, k = edges[part], edges[part + 1], head[_K2]
    y = head[_YV] + lo * 4
    sgemv_t(head[_GEMV], k, hi - lo, head[_A] + lo * k * 4, head[_X], y)
    epilogue(head[_LOOP], y, head[_BIASV] + lo * 4, 0, head[_PARAMSV], hi - lo, 1)


def gemv_part() -> int:
    """The address of the row-vector product's :data:`PART` (:func:`compiled`); its record is
    :func:`gemv_record`'s."""
    return compiled(PART, _gemv_part)


def gemv_record(a: np.ndarray, x: np.ndarray, y: np.ndarray, bias: np.ndarray, loop: int,
                params: np.ndarray | None, edges: Sequence[int]) -> np.ndarray | None:
    """The record of ``y = x @ a.T`` then the :data:`EPILOGUE` ``loop`` (reading ``bias`` and
    ``params``) in parts of outputs cut at ``edges``, or None when a part could not run it:
    ``a`` (N, K), ``x`` (K,) or (1, K), ``y`` and ``bias`` N elements, all C-contiguous
    float32 (the caller keeps them alive while the record is used)."""
    sgemv = sgemv_address()
    n, k = a.shape
    if sgemv is None or not contiguous_float32(a, x, y, bias) or \
            x.size != k or y.size != n or bias.size != n:
        return None
    return record([sgemv, address_of(a), address_of(x), address_of(y), k, address_of(bias),
                   loop, optional_address(params), len(edges) - 1], edges)
