"""Kernels: a float32 GEMM compiled by numba, blocked like BLIS for the host's vector unit.

``C = A @ B`` is cut GotoBLAS-style: a ``KC x NC`` block of B and an ``MC x KC`` block of A are
packed into contiguous panels (B in strips of ``NR`` columns, A in strips of ``MR`` rows), and a
register-blocked micro-kernel multiplies one A strip by one B strip, keeping the ``MR x NR``
block of C in vector registers for the whole ``KC`` loop. The micro-kernel is written directly
in LLVM IR (a numba intrinsic) with ``<16 x float>`` accumulators and ``llvm.fma``, so the code
the CPU runs does not depend on the loop vectoriser finding it; numba compiles it for the host.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

#: Lanes of one vector register (float32 in a 512-bit register).
LANES = 16
#: Micro-kernel shapes ``MR x NR`` (rows x columns of C held in registers): the usual one, and a
#: wide one whose 7 rows tile N = 49 (7x7 pixels) exactly when computing C^T.
MR, NR = 12, 2 * LANES
MR_W, NR_W = 7, 3 * LANES
#: Cache blocks: depth of the packed panels, rows of A per packed block, columns of B per block.
KC = 256
MC = 420  # a multiple of both micro-kernel heights
NC = 4096
#: Rows of B packed together (see _pack_b).
KB = 16


def _make_micro(MR: int, NR: int):  # noqa: N803 (the shape reads as the module constants)
    """Micro-kernel intrinsic for an ``MR x NR`` tile (NR a multiple of LANES)."""
    NV = NR // LANES  # noqa: N806

    @intrinsic
    def micro(typingctx, kc, a, aoff, b, boff, c, coff, ldc, accumulate):  # noqa: ARG001
        """``C[coff:] (+)= Apanel(MR x kc) @ Bpanel(kc x NR)`` on packed panels, ``kc >= 1``."""
        def codegen(context, builder, signature, args):
            kc_v, a_v, aoff_v, b_v, boff_v, c_v, coff_v, ldc_v, acc_v = args
            f32 = ir.FloatType()
            i64 = ir.IntType(64)
            vec = ir.VectorType(f32, LANES)
            vptr = vec.as_pointer()
            fma = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{LANES}f32"
            )

            def data(idx, val):
                return context.make_array(signature.args[idx])(context, builder, val).data

            ap = builder.gep(data(1, a_v), [aoff_v])
            bp = builder.gep(data(3, b_v), [boff_v])
            cp = builder.gep(data(5, c_v), [coff_v])
            zero = ir.Constant(vec, [0.0] * LANES)
            splat = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
            undef = ir.Constant(vec, ir.Undefined)

            # bring the C tile towards L1 while the k loop runs: its rows are ldc apart (new pages)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            prefetch = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                "llvm.prefetch.p0",
            )
            for i in range(MR):
                crow = builder.gep(cp, [builder.mul(ldc_v, ir.Constant(i64, i))])
                for j in range(0, NR, LANES):
                    p = builder.bitcast(builder.gep(crow, [ir.Constant(i64, j)]), i8p)
                    builder.call(prefetch, [p, *(ir.Constant(i32, v) for v in (1, 3, 1))])
            entry = builder.basic_block
            loop = builder.append_basic_block("mk.loop")
            done = builder.append_basic_block("mk.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            k = builder.phi(i64)
            k.add_incoming(ir.Constant(i64, 0), entry)
            accs = []
            for _ in range(MR * NV):
                phi = builder.phi(vec)
                phi.add_incoming(zero, entry)
                accs.append(phi)
            brow = builder.gep(bp, [builder.mul(k, ir.Constant(i64, NR))])
            bvs = [
                builder.load(
                    builder.bitcast(builder.gep(brow, [ir.Constant(i64, j * LANES)]), vptr), align=4
                )
                for j in range(NV)
            ]
            arow = builder.gep(ap, [builder.mul(k, ir.Constant(i64, MR))])
            new = []
            for i in range(MR):
                s = builder.load(builder.gep(arow, [ir.Constant(i64, i)]))
                av = builder.shuffle_vector(builder.insert_element(undef, s, ir.Constant(i64, 0)),
                                            undef, splat)
                for j in range(NV):
                    new.append(builder.call(fma, [av, bvs[j], accs[i * NV + j]]))
            k1 = builder.add(k, ir.Constant(i64, 1))
            tail = builder.basic_block
            k.add_incoming(k1, tail)
            for phi, val in zip(accs, new, strict=True):
                phi.add_incoming(val, tail)
            builder.cbranch(builder.icmp_signed("<", k1, kc_v), loop, done)

            builder.position_at_end(done)
            use_c = builder.icmp_signed("!=", acc_v, ir.Constant(acc_v.type, 0))
            for i in range(MR):
                crow = builder.gep(cp, [builder.mul(ldc_v, ir.Constant(i64, i))])
                for j in range(NV):
                    p = builder.bitcast(builder.gep(crow, [ir.Constant(i64, j * LANES)]), vptr)
                    old = builder.select(use_c, builder.load(p, align=4), zero)
                    builder.store(builder.fadd(old, new[i * NV + j]), p, align=4)
            return context.get_dummy_value()

        return types.void(kc, a, aoff, b, boff, c, coff, ldc, accumulate), codegen

    return micro


_micro = _make_micro(MR, NR)
_micro_w = _make_micro(MR_W, NR_W)


_u = np.uint64


@njit(cache=True, boundscheck=False, error_model="numpy")
def _pack_b(b, pc, kc, jc, nc, nr, out):
    """Pack ``b[pc:pc+kc, jc:jc+nc]`` into strips of nr columns, ``[strip][k][nr]``, zero-padded."""
    # a few rows of b at a time: walking down a whole strip would touch one page per row, and
    # walking along whole rows would scatter the writes kc * nr apart
    strips = (nc + nr - 1) // nr
    if b.strides[0] < b.strides[1]:  # column-major b (a transposed operand): walk down columns
        for s in range(strips):
            j0 = jc + s * nr
            w = min(nr, jc + nc - j0)
            for j in range(nr):
                for k in range(kc):
                    out[_u(s * kc * nr + k * nr + j)] = b[_u(pc + k), _u(j0 + j)] if j < w else 0.0
        return
    for k0 in range(0, kc, KB):
        for s in range(strips):
            j0 = jc + s * nr
            w = min(nr, jc + nc - j0)
            for k in range(k0, min(k0 + KB, kc)):
                row = s * kc * nr + k * nr
                # unsigned indices: no negative-index wraparound, so the copies vectorise
                if w == nr:
                    for j in range(nr):
                        out[_u(row + j)] = b[_u(pc + k), _u(j0 + j)]
                else:
                    for j in range(w):
                        out[_u(row + j)] = b[_u(pc + k), _u(j0 + j)]
                    for j in range(w, nr):
                        out[_u(row + j)] = 0.0


@njit(cache=True, boundscheck=False, error_model="numpy")
def _pack_a(a, ic, mc, pc, kc, mr, out):
    """Pack ``a[ic:ic+mc, pc:pc+kc]`` into strips of mr rows, ``[strip][k][mr]``, zero-padded."""
    by_rows = a.strides[1] <= a.strides[0]  # walk a along its contiguous axis
    for s in range((mc + mr - 1) // mr):
        base = s * kc * mr
        i0 = ic + s * mr
        h = min(mr, ic + mc - i0)
        if by_rows:
            for i in range(h):
                for k in range(kc):
                    out[_u(base + k * mr + i)] = a[_u(i0 + i), _u(pc + k)]
        else:
            for k in range(kc):
                for i in range(h):
                    out[_u(base + k * mr + i)] = a[_u(i0 + i), _u(pc + k)]
        for i in range(h, mr):
            for k in range(kc):
                out[_u(base + k * mr + i)] = 0.0


@njit(cache=True, boundscheck=False, error_model="numpy", nogil=True)
def _gemm_block(a, b, c, m0, m1, n0, n1, wide):
    """``c[m0:m1, n0:n1] = a[m0:m1] @ b[:, n0:n1]`` on one thread; ``c`` is C-contiguous; ``wide``
    picks the MR_W x NR_W micro-kernel."""
    mr, nr = (MR_W, NR_W) if wide else (MR, NR)
    k_total = a.shape[1]
    ldc = c.shape[1]
    cflat = c.reshape(-1)
    bpack = np.empty(min(KC, k_total) * (min(NC, n1 - n0) + nr), np.float32)
    apack = np.empty(min(KC, k_total) * (min(MC, m1 - m0) + mr), np.float32)
    tile = np.empty(mr * nr, np.float32)
    for jc in range(n0, n1, NC):
        nc = min(NC, n1 - jc)
        for pc in range(0, k_total, KC):
            kc = min(KC, k_total - pc)
            more = pc > 0
            _pack_b(b, pc, kc, jc, nc, nr, bpack)
            for ic in range(m0, m1, MC):
                mc = min(MC, m1 - ic)
                _pack_a(a, ic, mc, pc, kc, mr, apack)
                for jr in range(0, nc, nr):
                    w = min(nr, nc - jr)
                    for i_r in range(0, mc, mr):
                        h = min(mr, mc - i_r)
                        aoff = (i_r // mr) * kc * mr
                        boff = (jr // nr) * kc * nr
                        full = h == mr and w == nr
                        dst = cflat if full else tile
                        off = (ic + i_r) * ldc + jc + jr if full else 0
                        step = ldc if full else nr
                        if wide:
                            _micro_w(kc, apack, aoff, bpack, boff, dst, off, step, more and full)
                        else:
                            _micro(kc, apack, aoff, bpack, boff, dst, off, step, more and full)
                        if not full:
                            for i in range(h):
                                for j in range(w):
                                    v = tile[i * nr + j]
                                    if more:
                                        v += c[ic + i_r + i, jc + jr + j]
                                    c[ic + i_r + i, jc + jr + j] = v


_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sgemm")


def _gemm(a: np.ndarray, b: np.ndarray, c: np.ndarray, parts: int, wide: bool) -> None:
    """``c = a @ b`` in one or two slabs (along M or N, whichever has more strips), the second on
    a worker thread: the compiled block releases the GIL, and unlike a numba ``prange`` nothing
    keeps spinning between calls to fight BLAS threads for the cores."""
    m, n = c.shape
    mr, nr = (MR_W, NR_W) if wide else (MR, NR)
    split_m = -(-m // mr) >= -(-n // nr)
    strips = -(-m // mr) if split_m else -(-n // nr)
    if parts == 1 or strips < 2:
        _gemm_block(a, b, c, 0, m, 0, n, wide)
        return
    half = strips // 2
    if split_m:
        fut = _POOL.submit(_gemm_block, a, b, c, half * mr, m, 0, n, wide)
        _gemm_block(a, b, c, 0, half * mr, 0, n, wide)
    else:
        fut = _POOL.submit(_gemm_block, a, b, c, 0, m, half * nr, n, wide)
        _gemm_block(a, b, c, 0, m, 0, half * nr, wide)
    fut.result()



def _fill(m: int, n: int, mr: int, nr: int) -> float:
    """Fraction of the work of ``mr x nr`` micro-kernels that is real for an ``m x n`` output."""
    return m / (-(-m // mr) * mr) * n / (-(-n // nr) * nr)


def sgemm(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, parts: int = 2
) -> np.ndarray:
    """``a @ b`` for 2-D float32 ``a`` (M, K) and ``b`` (K, N), K >= 1, into ``out`` if given.

    Runs on ``parts`` (1 or 2) threads. Inputs of any strides are accepted (copied to
    C order first if they are not).
    """
    m, k = a.shape
    n = b.shape[1]
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    if out is None:
        out = np.empty((m, n), np.float32)
    if n < 2 * NR <= m and _fill(n, m, MR_W, NR_W) > _fill(m, n, MR, NR):
        # C^T = B^T A^T on the wide kernel fills the registers better (e.g. N = 49 pixels,
        # M = 2048 channels); for wider N the transposed packing and copy cost more than it saves
        ct = np.empty((n, m), np.float32)
        _gemm(b.T, a.T, ct, parts, True)
        out[...] = ct.T
    elif out.flags.c_contiguous:
        _gemm(a, b, out, parts, False)
    else:
        tmp = np.empty((m, n), np.float32)
        _gemm(a, b, tmp, parts, False)
        out[...] = tmp
    return out


#: Smallest ``min(M, N)`` and ``M * K * N`` that :func:`matmul` sends to :func:`sgemm`.
MIN_SIDE = 8
MIN_MACS = 1 << 20


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` for 2-D operands, through :func:`sgemm` when both are
    float32 and the product is large enough for it to pay (else numpy's BLAS)."""
    m, k = a.shape
    n = b.shape[1]
    if (
        a.dtype == np.float32
        and b.dtype == np.float32
        and (out is None or out.dtype == np.float32)
        and min(m, n) >= MIN_SIDE
        and m * k * n >= MIN_MACS
    ):
        return sgemm(a, b, out)
    return np.matmul(a, b, out=out)
