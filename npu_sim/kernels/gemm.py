"""Kernels: MatMul and Gemm, and the float conventions every compute kernel shares.

An NPU's systolic array multiplies in the input precision and accumulates in float32, then
rounds once when it writes the result. The float kernels here do the same: float16 and bfloat16
inputs are widened to float32, the product is taken through BLAS (numpy's ``matmul``), a fused
activation (the compiler's ``activation`` / ``activation_params`` attributes) is applied in
float32, and the result is rounded once to the input dtype.

:func:`to_compute`, :func:`finish` and :func:`fused_activation` are the shared helpers the conv
kernels use for the same conventions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ..epilogue import Step, decode
from ..errors import KernelError
from . import blas, native
from .registry import kernel

#: Float dtypes the compute kernels take; all are computed in float32.
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))


def to_compute(op: str, what: str, array: np.ndarray) -> np.ndarray:
    """``array`` widened to the float32 compute type; other dtypes raise :class:`KernelError`."""
    if array.dtype not in FLOAT_DTYPES:
        raise KernelError(
            op, "", f"{what} has dtype {array.dtype}; expected one of float32, float16, bfloat16"
        )
    return array.astype(np.float32, copy=False)


def same_dtype(op: str, arrays: Mapping[str, np.ndarray | None]) -> np.dtype:
    """The dtype shared by all non-``None`` ``arrays``; a mismatch names both dtypes."""
    dtype = None
    for name, arr in arrays.items():
        if arr is None:
            continue
        if dtype is None:
            dtype, first = arr.dtype, name
        elif arr.dtype != dtype:
            raise KernelError(
                op, "", f"{name} has dtype {arr.dtype} but {first} has {dtype}; they must match"
            )
    assert dtype is not None
    return dtype


def fused_activation(y: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """Apply the compiler-fused activation named by ``attrs["activation"]``, if any.

    ``y`` must be the kernel's own fresh buffer: the activation overwrites it in place.
    """
    name = attrs.get("activation")
    if not name:
        return y
    from .activations import apply_activation  # lazy: the activations module is independent

    params = tuple(float(p) for p in attrs.get("activation_params", ()))
    return apply_activation(y, str(name), params, inplace=True)


def finish(y: np.ndarray, attrs: Mapping[str, Any], dtype: np.dtype, op: str = "",
           inputs: Sequence[np.ndarray | None] = (), steps: Sequence[Step] | None = None,
           ) -> np.ndarray:
    """Fused activation and fused epilogue (:mod:`.epilogue`, reading ``inputs``; ``steps``:
    the epilogue already decoded from ``attrs``) in float32, then one rounding to the output
    ``dtype``."""
    y = np.asarray(fused_activation(y, attrs))
    if "epilogue" in attrs:
        from .epilogue import apply_epilogue  # lazy: it imports the activations module

        y = apply_epilogue(op, y, attrs, inputs, steps)
    return rounded(y, dtype)


def computes_into(out: Sequence[np.ndarray | None] | None, shape: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray | None:
    """The first ``out=`` array (:attr:`.registry.Kernel.writes_into`) if a float32 result of
    ``shape`` can be computed in it: the output is float32 (so rounding copies nothing) and the
    array is writable, C-contiguous, of that shape and dtype; else None."""
    target = out[0] if out else None
    if target is None or dtype != np.float32 or target.dtype != np.float32 or \
            target.shape != shape or not target.flags.c_contiguous or \
            not target.flags.writeable:
        return None
    return target


def landed(into: np.ndarray | None, result: np.ndarray) -> np.ndarray:
    """``into`` itself when ``result`` is its bytes (a same-shaped view of it: the caller then
    copies nothing), else ``result``."""
    if result is into:
        return into
    if into is not None and result.shape == into.shape and result.dtype == into.dtype and \
            result.ctypes.data == into.ctypes.data:
        return into
    return result


def rounded(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The float32 result ``y`` rounded once to the output ``dtype``, C-contiguous."""
    out = y.astype(dtype, copy=False)
    # (np.ascontiguousarray would turn a 0-d result, 1-D @ 1-D, into shape (1,))
    return out if out.flags.c_contiguous else out.copy(order="C")


def matmul_shape(op: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of numpy-style ``matmul`` (ONNX MatMul), or :class:`KernelError`."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise KernelError(op, "", f"inputs must have rank >= 1, got shapes {a_shape} and {b_shape}")
    a2 = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b2 = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise KernelError(
            op,
            "",
            f"inner dimensions differ: A {a_shape} has K={a2[-1]}, B {b_shape} has K={b2[-2]}",
        )
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise KernelError(
            op, "", f"batch dimensions {a2[:-2]} and {b2[:-2]} do not broadcast"
        ) from None
    out = (*batch, a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return out


@kernel("MatMul", writes_into=True)
def matmul(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
           out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """ONNX MatMul: numpy ``matmul`` semantics (broadcast batch dims, 1-D operands); ``out``:
    see :attr:`.registry.Kernel.writes_into`.

    The compiler's ``transB=1`` (a 2-D B stored transposed, see
    ``ep.npusim.compiler.rewrite.transposed_weights``) multiplies by ``B.T``.
    """
    a, b = _require(inputs, 2, "MatMul")
    if int(attrs.get("transB", 0)):
        if b.ndim != 2:
            raise KernelError("MatMul", "", f"transB=1 needs a 2-D B, got shape {b.shape}")
        b = b.T
    dtype = same_dtype("MatMul", {"A": a, "B": b})
    shape = matmul_shape("MatMul", a.shape, b.shape)
    a32, b32 = to_compute("MatMul", "A", a), to_compute("MatMul", "B", b)
    into = None
    with np.errstate(all="ignore"):  # inf/NaN operands give inf/NaN results, not warnings
        if a.ndim >= 2 and b.ndim >= 2:
            into = computes_into(out, shape, dtype)
            y = blas.matmul(a32, b32, out=into)
        else:
            with blas.threads_for(math.prod(shape) * a.shape[-1]):
                y = np.matmul(a32, b32)
    return [landed(into, finish(np.asarray(y), attrs, dtype, "MatMul", inputs))]


def prepare_gemm(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                 out: Sequence[np.ndarray | None] | None = None) -> Callable[[], list[np.ndarray]]:
    """Gemm for these operands (:attr:`.registry.Kernel.prepare`): float32 operands are
    checked, transposed (as views) and their epilogue decoded once, and each call only
    multiplies, adds C and finishes, as :func:`gemm` does (a classifier head's Gemm spent 90-160
    us of a run around its product); other dtypes run :func:`gemm` each call, widening them."""
    if any(a is not None and a.dtype != np.float32 for a in inputs[:3]):
        return lambda: gemm(inputs, attrs, out)
    a32, b32, c, alpha, beta, into = _gemm_operands(inputs, attrs, out)
    steps = decode("Gemm", attrs)
    dtype = np.dtype(np.float32)
    native = _native_row_product(inputs, attrs, alpha, beta, into)
    if native is not None:
        return native

    def run() -> list[np.ndarray]:  # C read each call: it may be any tensor of the program
        y = _product(a32, b32, c, alpha, beta, into)
        return [landed(into, finish(y, attrs, dtype, "Gemm", inputs, steps))]

    return run


#: A classifier's Gemm (one row times a transposed weight matrix) splits over the cores as
#: native parts from this many multiply-adds (4 bytes of weights each): it streams its
#: weights from memory once a run (MobileNet-V3's two, 2.4 and 4 MB, took 195-295 us each in
#: a run, 46-65 us in a loop that kept them in cache), and two cores stream them faster.
NATIVE_ROW_WORK = 1 << 18
#: The outputs of a split row product are cut at multiples of this: there numpy's sgemv
#: (OpenBLAS's transposed kernel) gives each piece the whole product's bits (300 random shapes,
#: none differing at multiples of 8; at any cut, most did).
ROW_ALIGN = 16


def _native_row_product(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                        alpha: np.float32, beta: np.float32, into: np.ndarray | None,
                        ) -> Callable[[], list[np.ndarray]] | None:
    """A classifier's Gemm, ``A (1, K) @ B.T + C`` with B (N, K) (``transB``, as torch exports
    a Linear layer), alpha and beta 1 and C one bias per output, split by outputs into
    native parts (:func:`.native.gemv_part`) with C's add and the fused activation in one
    loop (:func:`.bias_fused.fused_bias_loop`, or the bias alone), or None when it is not
    that launch, is below :data:`NATIVE_ROW_WORK` or has no native loop. Each part is the
    sgemv numpy's ``matmul`` runs for those outputs and the loop of the separate passes, so
    the same bits."""
    # lazy, as activations above: bias_fused imports the activations module
    from .bias_fused import fused_bias_loop, native_form, native_loops

    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    if into is None or c is None or alpha != 1 or beta != 1 or a.shape[0] != 1 or \
            int(attrs.get("transA", 0)) or not int(attrs.get("transB", 0)) or \
            c.size != b.shape[0] or b.size < NATIVE_ROW_WORK:
        return None
    if "activation" in attrs or "epilogue" in attrs:
        fused = fused_bias_loop("Gemm", attrs)
        form = None if fused is None else native_form(fused)
    else:
        form = native_loops()["bias"], None
    edges = blas.edges(b.shape[0], 0, ROW_ALIGN)
    if form is None or len(edges) < 3:
        return None
    loop, params = form
    record = native.gemv_record(b, a, into, c, loop, params, edges)
    if record is None:
        return None
    split = native.launch(record, native.gemv_part(), len(edges) - 1, (a, b, c, into, params),
                          blas_call=True)

    def run() -> list[np.ndarray]:
        split()
        return [into]

    run.arrays = split.arrays  # type: ignore[attr-defined]
    return run


@kernel("Gemm", writes_into=True, prepare=prepare_gemm)
def gemm(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
         out: Sequence[np.ndarray | None] | None = None) -> list[np.ndarray]:
    """ONNX Gemm: ``alpha * A' @ B' + beta * C`` with optional transposes and broadcast C;
    ``out``: see :attr:`.registry.Kernel.writes_into`."""
    a32, b32, c, alpha, beta, into = _gemm_operands(inputs, attrs, out)
    c32 = None if c is None else to_compute("Gemm", "C", c)
    y = _product(a32, b32, c32, alpha, beta, into)
    return [landed(into, finish(y, attrs, np.dtype(inputs[0].dtype), "Gemm", inputs))]


def _product(a32: np.ndarray, b32: np.ndarray, c32: np.ndarray | None, alpha: np.float32,
             beta: np.float32, into: np.ndarray | None) -> np.ndarray:
    """``alpha * a32 @ b32 + beta * c32`` in float32, into ``into`` when given."""
    y = blas.matmul(a32, b32, out=into)
    if alpha != 1.0:
        y *= alpha
    if c32 is not None:
        y += c32 if beta == 1.0 else beta * c32
    return y


def _gemm_operands(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any],
                   out: Sequence[np.ndarray | None] | None):
    """Gemm's operands checked: A' and B' (widened, transposed), C, alpha, beta and the ``out=``
    buffer the product may be computed into."""
    if len(inputs) < 2 or inputs[0] is None or inputs[1] is None:
        raise KernelError("Gemm", "", f"needs inputs A and B, got {len(inputs)} inputs")
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    dtype = same_dtype("Gemm", {"A": a, "B": b, "C": c})
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError("Gemm", "", f"A and B must be 2-D, got shapes {a.shape} and {b.shape}")
    a32 = to_compute("Gemm", "A", a)
    b32 = to_compute("Gemm", "B", b)
    if int(attrs.get("transA", 0)):
        a32 = a32.T
    if int(attrs.get("transB", 0)):
        b32 = b32.T
    if a32.shape[1] != b32.shape[0]:
        raise KernelError(
            "Gemm",
            "",
            f"inner dimensions differ after transposes: A' is {a32.shape}, B' is {b32.shape}",
        )
    alpha = np.float32(attrs.get("alpha", 1.0))
    beta = np.float32(attrs.get("beta", 1.0))
    out_shape = (a32.shape[0], b32.shape[1])
    if c is not None and (c.ndim > 2 or not broadcasts_to(c.shape, out_shape)):
        raise KernelError(
            "Gemm", "", f"C of shape {c.shape} does not broadcast to the output {out_shape}"
        )
    return a32, b32, c, alpha, beta, computes_into(out, out_shape, dtype)


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts unidirectionally to ``target``."""
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _require(inputs: Sequence[np.ndarray | None], n: int, op: str) -> list[np.ndarray]:
    """The first ``n`` inputs, all present; otherwise :class:`KernelError`."""
    if len(inputs) < n or any(x is None for x in inputs[:n]):
        raise KernelError(op, "", f"needs {n} inputs, got {len(inputs)}")
    return list(inputs[:n])  # type: ignore[arg-type]
