"""Shared helpers for kernel tests: run a kernel, get onnxruntime's answer, compare them.

Half-precision kernels compute in float32 and round once, so their reference is onnxruntime's
float32 result on the same (upcast) inputs, rounded to the half dtype: the two may then differ by
at most one unit in the last place of the half dtype, which is the tolerance used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime
from hypothesis import strategies as st
from onnx.reference import ReferenceEvaluator

from npu_sim.errors import KernelError
from npu_sim.kernels import lookup
from tests.ortref import run_ort, single_node_model

# Old opsets make onnxruntime log warnings per session; only errors matter to these tests.
onnxruntime.set_default_logger_severity(3)

_STATE = onnxruntime.capi.onnxruntime_pybind11_state
ORT_ERRORS = tuple(getattr(_STATE, name) for name in (
    "Fail", "InvalidArgument", "RuntimeException", "InvalidGraph", "NotImplemented", "EPFail")
    if hasattr(_STATE, name))
"""The errors onnxruntime raises for a node it refuses (releases differ in which one)."""

BF16 = np.dtype(ml_dtypes.bfloat16)
HALF = (np.dtype(np.float16), BF16)
FLOATS = (np.dtype(np.float32), np.dtype(np.float16), BF16)

# (rtol, atol) per float dtype: float32 per the project contract. A half result is a float32
# result (within float32's tolerance of the reference) rounded once, so one more half ulp.
_F32 = (1e-4, 1e-5)
TOLERANCE = {
    np.dtype(np.float32): _F32,
    np.dtype(np.float64): (1e-7, 1e-9),
    np.dtype(np.float16): (_F32[0] + 2.0**-10, _F32[1]),
    BF16: (_F32[0] + 2.0**-7, _F32[1]),
}


def run_kernel(op: str, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any] | None = None
               ) -> list[np.ndarray]:
    """Run the registered kernel ``op``, as a KERNEL command would: on read-only C-contiguous
    inputs (the device hands kernels views of HBM a kernel must not write)."""
    return lookup(op).values([None if x is None else _read_only(x) for x in inputs],
                             dict(attrs or {}))


def _read_only(x: np.ndarray) -> np.ndarray:
    array = np.asarray(x)
    # A view when possible, so "no copy" tests still see the caller's memory.
    array = (array if array.flags.c_contiguous else np.array(array, order="C")).view()
    array.flags.writeable = False
    return array


def ort_reference(
    op: str,
    inputs: Sequence[np.ndarray | None],
    attrs: Mapping[str, Any] | None = None,
    n_outputs: int = 1,
    opset: int = 17,
    constant_inputs: Sequence[int] = (),
    upcast_halves: bool = True,
    keep_float32: Sequence[int] = (),
) -> list[np.ndarray]:
    """onnxruntime's outputs.

    With ``upcast_halves``, half-precision float inputs run as float32 and the float32 outputs
    (except those listed in ``keep_float32``, float32 by definition) round back once:
    onnxruntime's CPU provider lacks most half kernels, and has none for bfloat16.
    """
    half = next((a.dtype for a in inputs if a is not None and a.dtype in HALF), None)
    if half is None or not upcast_halves:
        return run_ort(op, inputs, attrs, n_outputs, opset, constant_inputs=constant_inputs)
    up = [a.astype(np.float32) if a is not None and a.dtype in HALF else a for a in inputs]
    outs = run_ort(op, up, attrs, n_outputs, opset, constant_inputs=constant_inputs)
    return [o.astype(half) if o.dtype == np.float32 and i not in keep_float32 else o
            for i, o in enumerate(outs)]


def assert_matches(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                   count: int | None = None) -> None:
    """Same dtype and shape; floats within the dtype's tolerance, everything else exactly.

    ``count`` compares only the first ``count`` outputs (a kernel may return optional outputs
    the reference node did not request).
    """
    count = len(expected) if count is None else count
    assert len(actual) >= count, f"kernel returned {len(actual)} outputs, expected {count}"
    for i, (a, e) in enumerate(zip(actual[:count], expected[:count], strict=True)):
        assert isinstance(a, np.ndarray), f"output {i} is {type(a).__name__}"
        assert a.dtype == e.dtype, f"output {i}: dtype {a.dtype} != reference {e.dtype}"
        assert a.shape == e.shape, f"output {i}: shape {a.shape} != reference {e.shape}"
        if e.dtype in TOLERANCE:
            rtol, atol = TOLERANCE[e.dtype]
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=f"output {i}")
        else:
            np.testing.assert_array_equal(a, e, err_msg=f"output {i}")


def check_against_ort(op: str, inputs: Sequence[np.ndarray | None],
                      attrs: Mapping[str, Any] | None = None, *, n_outputs: int = 1,
                      opset: int = 17, constant_inputs: Sequence[int] = (),
                      kernel_attrs: Mapping[str, Any] | None = None,
                      upcast_halves: bool = True, keep_float32: Sequence[int] = ()
                      ) -> list[np.ndarray]:
    """Run kernel and onnxruntime on the same node and assert they agree; return the outputs.

    ``kernel_attrs`` are extra attributes only the kernel sees (``_opset``); ``upcast_halves``
    and ``keep_float32`` as in :func:`ort_reference`.
    """
    expected = ort_reference(op, inputs, attrs, n_outputs, opset, constant_inputs, upcast_halves,
                             keep_float32)
    actual = run_kernel(op, inputs, {**(attrs or {}), **(kernel_attrs or {})})
    assert_matches(actual, expected)
    return actual


def check_like_ort(op: str, inputs: Sequence[np.ndarray | None],
                   attrs: Mapping[str, Any] | None = None, *, n_outputs: int = 1,
                   opset: int = 17, constant_inputs: Sequence[int] = ()
                   ) -> list[np.ndarray] | None:
    """Judge the kernel by what the *installed* onnxruntime does on the same node.

    Where onnxruntime runs the node, the kernel must give its outputs. Where onnxruntime refuses
    it, the kernel may fail no worse: refuse with a ``KernelError``, or give what the ONNX
    specification defines (onnx's reference evaluator). Returns the kernel's outputs, or None when
    it refused. Releases of onnxruntime change what they accept; this keeps the test true to both.
    """
    try:
        expected = run_ort(op, inputs, attrs, n_outputs, opset, constant_inputs=constant_inputs)
    except ORT_ERRORS:
        try:
            actual = run_kernel(op, inputs, attrs)
        except KernelError:
            return None
        model = single_node_model(op, inputs, attrs, n_outputs, opset,
                                  constant_inputs=constant_inputs)
        feeds = {f"in{i}": a for i, a in enumerate(inputs)
                 if a is not None and i not in constant_inputs}
        assert_matches(actual, ReferenceEvaluator(model).run(None, feeds))
        return actual
    actual = run_kernel(op, inputs, attrs)
    assert_matches(actual, expected)
    return actual


@st.composite
def shapes(draw: st.DrawFn, min_dims: int = 0, max_dims: int = 4, max_side: int = 5
           ) -> tuple[int, ...]:
    """A small tensor shape."""
    rank = draw(st.integers(min_dims, max_dims))
    return tuple(draw(st.lists(st.integers(1, max_side), min_size=rank, max_size=rank)))


@st.composite
def broadcastable(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts against ``shape``: a suffix of it with some sides set to 1."""
    rank = draw(st.integers(0, len(shape)))
    suffix = shape[len(shape) - rank:]
    return tuple(1 if draw(st.booleans()) else d for d in suffix)


def random_array(seed: int, shape: Sequence[int], dtype: Any, low: float = -4.0,
                 high: float = 4.0) -> np.ndarray:
    """Deterministic test data of ``dtype``: uniform floats, or integers in [low, high]."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(int(low), int(info.min)), min(int(high), int(info.max))
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(np.float32).astype(dtype)


seeds = st.integers(0, 2**32 - 1)


def with_specials(x: np.ndarray, seed: int, specials: Sequence[float]) -> np.ndarray:
    """``x`` (float dtypes) with about 30% of its elements replaced by ``specials`` (NaN,
    infinities, signed zeros, ties), so operands often hold equal or unordered values."""
    if x.dtype.kind != "f" or x.size == 0:
        return x
    rng = np.random.default_rng(seed)
    x = x.copy()
    picks = rng.random(x.shape) < 0.3
    x[picks] = rng.choice(np.asarray(specials, np.float32), size=int(picks.sum())).astype(x.dtype)
    return x


def unprepared_conv(inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]) -> np.ndarray:
    """A float32 Conv computed the long way, step by step as the general path's pieces do it
    (the products from fresh arrays, the bias in its own pass, then the fused activation and
    epilogue), for comparing prepared launches' bits with."""
    from npu_sim.kernels.conv import add_bias, conv_nd, geometry
    from npu_sim.kernels.gemm import finish

    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    group, win = geometry(x.shape, w.shape, attrs)
    with np.errstate(all="ignore"):
        y = conv_nd(x, w, group, win)
        if b is not None:
            add_bias(y, b)
        return finish(y, attrs, np.dtype(np.float32), "Conv", inputs)


def resnet_block_end(seed: int, n: int, c: int, m: int, h: int, stride: int, relu: bool,
                     specials: Sequence[float]) -> tuple[list[np.ndarray], dict[str, Any],
                                                         tuple[int, ...]]:
    """A ResNet block's last 1x1 convolution: its inputs (X with ``specials``, W, B and the
    residual with them too), attributes (the stride, the residual ``Add`` and, if ``relu``,
    the Relu as its epilogue) and output shape."""
    from npu_sim.epilogue import Step, encode

    x = with_specials(random_array(seed, (n, c, h, h), np.float32, -4, 4), seed, specials)
    w = random_array(seed + 1, (m, c, 1, 1), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32)
    out = (n, m, (h - 1) // stride + 1, (h - 1) // stride + 1)
    r = with_specials(random_array(seed + 3, out, np.float32, -4, 4), seed + 3, specials)
    attrs = {"group": 1, "kernel_shape": (1, 1), "strides": (stride, stride),
             **encode([Step("Add", operand=3)] + ([Step("Relu")] if relu else []))}
    return [x, w, b, r], attrs, out


def non_finite_depthwise_case() -> tuple[list[np.ndarray], dict[str, Any], tuple[int, ...]]:
    """A 3x3 depthwise convolution on phase-split planes with a SiLU gate: its inputs (X, W,
    B), attributes and output shape, for the tests that then set a weight to inf after
    planning."""
    from npu_sim.epilogue import Step, encode

    x = random_array(1, (1, 4, 16, 16), np.float32)
    w = random_array(2, (4, 1, 3, 3), np.float32)
    b = random_array(3, (4,), np.float32)
    attrs = {"group": 4, "pads": (1, 1, 1, 1), **encode([Step("Sigmoid", gate=True)])}
    return [x, w, b], attrs, (1, 4, 16, 16)
