"""Native parts: pieces of a kernel launch that helper threads run without taking the GIL.

A part handed to a helper thread as a Python callable waits for the GIL before it starts: the
caller holds it until its own part enters compiled code, and waking a thread asleep on the
GIL took 10-40 us here, on launches of 100-300 us. A *native part* is a numba ``cfunc`` of
C signature ``void part(int64_t *context, int64_t k)``: it computes part ``k`` of its launch
from ``context``, an int64 array holding the addresses and sizes of the launch's arrays (made
once when the launch is planned). :func:`npu_sim.kernels.cores.run_native` hands its address
and the context's to the helpers, which call it from their compiled spin loop.

A part's context is laid out by the module that defines the part; :func:`address` and
:func:`float_bits` put arrays and float parameters in it, and :func:`pointer` (for
``numba.carray``) and :func:`from_bits` read them back inside the ``cfunc``. numba caches a
compiled function by its own file only, so a part calls only loops of its own file and reaches
the others (an epilogue) through another native part, never by inlining them.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

#: The C signature of a native part: ``void part(int64_t *context, int64_t k)``.
SIGNATURE = types.void(types.CPointer(types.int64), types.int64)


def address(array: np.ndarray) -> int:
    """The address of ``array``'s first element, for a context slot."""
    return int(array.__array_interface__["data"][0])


def float_bits(value: float) -> int:
    """A float parameter as the int64 bits of its float64, for a context slot
    (:func:`from_bits` reads it back)."""
    return int(np.float64(value).view(np.int64))


@intrinsic
def call_part(typingctx, function, context, k):  # pragma: no cover - compiled
    """Call the native part at address ``function`` with the context at address ``context``
    and part number ``k``."""
    def codegen(cgctx, builder, signature, args):
        i64 = ir.IntType(64)
        kind = ir.FunctionType(ir.VoidType(), [i64.as_pointer(), i64])
        target = builder.inttoptr(args[0], kind.as_pointer())
        builder.call(target, [builder.inttoptr(args[1], i64.as_pointer()), args[2]])
        return cgctx.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def pointer(typingctx, at, dtype):  # pragma: no cover - compiled
    """The address ``at`` (an int64 context slot) as a pointer to ``dtype`` elements, for
    ``numba.carray``."""
    element = dtype.dtype if isinstance(dtype, types.DTypeSpec) else dtype.instance_type
    target = types.CPointer(element)

    def codegen(cgctx, builder, signature, args):
        return builder.inttoptr(args[0], cgctx.get_value_type(target))
    return target(types.int64, dtype), codegen


@intrinsic
def from_bits(typingctx, bits):  # pragma: no cover - compiled
    """The float64 whose bits :func:`float_bits` stored in an int64 slot."""
    def codegen(cgctx, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


#: CBLAS's row-major order and no-transpose codes.
_ROW_MAJOR, _NO_TRANS = 101, 111


@intrinsic
def sgemm(typingctx, function, ilp64, m, n, k, a, lda, b, ldb, c, ldc):  # pragma: no cover
    """``cblas_sgemm(RowMajor, NoTrans, NoTrans, m, n, k, 1, a, lda, b, ldb, 0, c, ldc)``, the
    call numpy's ``matmul`` makes for a float32 product of two matrices, through the address
    ``function`` of the BLAS's ``cblas_sgemm`` (its integers 64-bit if ``ilp64``, else 32-bit;
    a run-time test, so a compiled part fits either build); ``a``, ``b``, ``c`` addresses."""
    def codegen(cgctx, builder, signature, args):
        function, ilp64, m, n, k, a, lda, b, ldb, c, ldc = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        fp = f32.as_pointer()

        def call(width):
            kind = ir.FunctionType(ir.VoidType(), [i32, i32, i32, width, width, width, f32, fp,
                                                   width, fp, width, f32, fp, width])
            target = builder.inttoptr(function, kind.as_pointer())

            def size(v):
                return v if width is i64 else builder.trunc(v, i32)

            builder.call(target, [ir.Constant(i32, _ROW_MAJOR), ir.Constant(i32, _NO_TRANS),
                                  ir.Constant(i32, _NO_TRANS), size(m), size(n), size(k),
                                  ir.Constant(f32, 1.0), builder.inttoptr(a, fp), size(lda),
                                  builder.inttoptr(b, fp), size(ldb), ir.Constant(f32, 0.0),
                                  builder.inttoptr(c, fp), size(ldc)])

        with builder.if_else(builder.icmp_signed("!=", ilp64, ir.Constant(i64, 0))) as (wide,
                                                                                      narrow):
            with wide:
                call(i64)
            with narrow:
                call(i32)
        return cgctx.get_dummy_value()
    return types.void(*(types.int64,) * 11), codegen

