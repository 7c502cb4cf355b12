"""Quantization kernels against onnxruntime: every integer result must match exactly.

The integer ops are held to the exact ONNX result too, computed here in int64: where
:data:`npu_sim.kernels.host.U8S8_SATURATES` (x86-64 without VNNI), onnxruntime's uint8 x int8
GEMM sums each pair of products in int16 with saturation, while the NPU accumulates exactly, as
ONNX defines (docs/conformance.md). There onnxruntime is compared on the results no pair of whose
products can pass 32767, its matmuls must give the pair-saturated sums, and uint8 operands below
128 are compared everywhere.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from npu_sim.errors import KernelError
from npu_sim.kernels import host
from tests.kernels import (
    assert_matches,
    check_against_ort,
    ort_reference,
    random_array,
    run_kernel,
    seeds,
    shapes,
)

F = np.float32
INT8S = st.sampled_from([np.dtype(np.int8), np.dtype(np.uint8)])
INT8, UINT8 = st.just(np.dtype(np.int8)), st.just(np.dtype(np.uint8))
INT16_MAX = 2**15 - 1


def _zero_point(seed: int, shape: tuple[int, ...], dtype: np.dtype, below_128: bool = False
                ) -> np.ndarray:
    return random_array(seed, shape, dtype, -20, 127 if below_128 else 150)


def _scale(seed: int, shape: tuple[int, ...], high: float = 0.2) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).uniform(0.005, high, size=shape), F)


def _operand(seed: int, shape: tuple[int, ...], dtype: np.dtype, below_128: bool = False
             ) -> np.ndarray:
    """Values over the dtype's whole range; ``below_128`` keeps uint8 ones below 128, so no two of
    their products with int8 values sum past 32767."""
    return random_array(seed, shape, dtype, -128, 127 if below_128 else 255)


@settings(max_examples=40, deadline=None)
@given(shape=shapes(min_dims=1), seed=seeds, dtype=INT8S, per_axis=st.booleans(),
       with_zp=st.booleans(), data=st.data())
def test_quantize_linear_matches_ort(shape, seed, dtype, per_axis, with_zp, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    pshape = (shape[axis],) if per_axis else ()
    # wide range: exercises saturation; multiples of the scale / 2 exercise ties
    x = random_array(seed, shape, F, -30, 30)
    scale = _scale(seed + 1, pshape)
    if data.draw(st.booleans()):
        x = (np.round(x / 0.05) * 0.05 + 0.025).astype(F)
        scale = np.full(pshape, 0.05, F)
    inputs = [x, scale] + ([_zero_point(seed + 2, pshape, dtype)] if with_zp else [])
    check_against_ort("QuantizeLinear", inputs, {"axis": axis})


def test_quantize_rounds_half_to_even_and_saturates():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, 300.0, -300.0], F)
    (q,) = check_against_ort("QuantizeLinear", [x, np.array(1.0, F), np.array(0, np.int8)])
    np.testing.assert_array_equal(q, [0, 2, 2, 0, -2, -2, 126, 127, 127, -128])


@settings(max_examples=40, deadline=None)
@given(shape=shapes(min_dims=1), seed=seeds, dtype=st.sampled_from(
    [np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32)]), per_axis=st.booleans(),
    with_zp=st.booleans(), data=st.data())
def test_dequantize_linear_matches_ort(shape, seed, dtype, per_axis, with_zp, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    pshape = (shape[axis],) if per_axis and dtype != np.int32 else ()
    x = random_array(seed, shape, dtype, -1000, 1000)
    inputs = [x, _scale(seed + 1, pshape)]
    if with_zp:
        zp = np.zeros(pshape, dtype) if dtype == np.int32 else _zero_point(seed + 2, pshape, dtype)
        inputs.append(zp)
    check_against_ort("DequantizeLinear", inputs, {"axis": axis})


class Case(NamedTuple):
    """A node's inputs and attributes, and the opset its model is built at."""

    inputs: list[np.ndarray]
    attrs: dict[str, Any]
    opset: int = 17


@st.composite
def matmul_integer_case(draw: st.DrawFn, a_dtypes: st.SearchStrategy = INT8S,
                        b_dtypes: st.SearchStrategy = INT8S, below_128: bool = False) -> Case:
    """A (m, k), maybe batched, times B (k, n); zero points none, scalar or per column of B.
    ``below_128`` as in :func:`_operand`, for A."""
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
    batch, seed = draw(st.integers(0, 2)), draw(seeds)
    a_dtype, b_dtype = draw(a_dtypes), draw(b_dtypes)
    zp_kind = draw(st.sampled_from(["none", "scalar", "per_col"]))
    inputs = [_operand(seed, (batch, m, k) if batch else (m, k), a_dtype, below_128),
              _operand(seed + 1, (k, n), b_dtype)]
    if zp_kind != "none":
        inputs.append(_zero_point(seed + 2, (), a_dtype))
        inputs.append(_zero_point(seed + 3, (n,) if zp_kind == "per_col" else (), b_dtype))
    return Case(inputs, {})


@st.composite
def qlinear_matmul_case(draw: st.DrawFn, a_dtypes: st.SearchStrategy = INT8S,
                        b_dtypes: st.SearchStrategy = INT8S, below_128: bool = False) -> Case:
    """a (2, m, k) times b (k, n), b's scales and zero points per tensor or per column (opset 21).
    ``below_128`` as in :func:`_operand`, for a."""
    m, k, n = draw(st.integers(1, 6)), draw(st.integers(1, 40)), draw(st.integers(1, 6))
    seed, per_column = draw(seeds), draw(st.booleans())
    a_dtype, b_dtype = draw(a_dtypes), draw(b_dtypes)
    # onnxruntime implements QLinearMatMul only with y in a's dtype, and int8 a with int8 b
    if a_dtype == np.int8:
        b_dtype = a_dtype
    b_params = (n,) if per_column else ()
    inputs = [_operand(seed, (2, m, k), a_dtype, below_128), _scale(seed + 1, ()),
              _zero_point(seed + 2, (), a_dtype),
              _operand(seed + 3, (k, n), b_dtype), _scale(seed + 4, b_params),
              _zero_point(seed + 5, b_params, b_dtype), _scale(seed + 6, (), 4.0),
              _zero_point(seed + 7, (), a_dtype)]
    return Case(inputs, {}, 21 if per_column else 17)


@st.composite
def qconv_case(draw: st.DrawFn) -> tuple[list, dict]:
    rank = draw(st.sampled_from([1, 2, 2]))
    group = draw(st.integers(1, 2))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    spatial = [draw(st.integers(k, 6)) for k in kernel]
    attrs = {"group": group,
             "pads": draw(st.lists(st.integers(0, 1), min_size=2 * rank, max_size=2 * rank)),
             "strides": draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank))}
    return [(draw(st.integers(1, 2)), cg * group, *spatial), (mg * group, cg, *kernel)], attrs


@st.composite
def conv_integer_case(draw: st.DrawFn, x_dtypes: st.SearchStrategy = INT8S,
                      w_dtypes: st.SearchStrategy = INT8S, below_128: bool = False) -> Case:
    """x and w of any 8-bit dtypes, with or without per-tensor zero points (onnxruntime refuses
    per-channel ones). ``below_128`` as in :func:`_operand`, for w."""
    (xs, ws), attrs = draw(qconv_case())
    seed, with_zp = draw(seeds), draw(st.booleans())
    x_dtype, w_dtype = draw(x_dtypes), draw(w_dtypes)
    inputs = [_operand(seed, xs, x_dtype), _operand(seed + 1, ws, w_dtype, below_128)]
    if with_zp:
        inputs += [_zero_point(seed + 2, (), x_dtype), _zero_point(seed + 3, (), w_dtype)]
    return Case(inputs, attrs)


@st.composite
def qlinear_conv_case(draw: st.DrawFn, x_dtypes: st.SearchStrategy = INT8S,
                      below_128: bool = False) -> Case:
    """int8 weights with scales per tensor or per output channel, maybe a bias. ``below_128`` as
    in :func:`_operand`, for x and its zero point (the padding's value)."""
    (xs, ws), attrs = draw(qconv_case())
    seed, x_dtype = draw(seeds), draw(x_dtypes)
    per_channel, with_bias = draw(st.booleans()), draw(st.booleans())
    m = ws[0]
    wshape = (m,) if per_channel else ()
    inputs = [_operand(seed, xs, x_dtype, below_128), _scale(seed + 1, ()),
              _zero_point(seed + 2, (), x_dtype, below_128),
              _operand(seed + 3, ws, np.dtype(np.int8)), _scale(seed + 4, wshape),
              np.zeros(wshape, np.int8), _scale(seed + 5, (), 2.0),
              _zero_point(seed + 6, (), x_dtype)]
    if with_bias:
        inputs.append(random_array(seed + 7, (m,), np.int32, -5000, 5000))
    return Case(inputs, attrs)


def _wide(x: Any) -> np.ndarray:
    return np.asarray(x, np.int64)


def _ort_saturates(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the installed onnxruntime's GEMM of ``a`` by ``b`` (its A and B operands) may
    saturate pairs of products: uint8 by int8 where :data:`host.U8S8_SATURATES`."""
    return host.U8S8_SATURATES and a.dtype == np.uint8 and b.dtype == np.int8


def _below_pair_saturation(products: np.ndarray, axis: int) -> np.ndarray:
    """Where no two raw products (before zero points) summed along ``axis`` can pass int16,
    however onnxruntime pairs them: the two largest magnitudes sum to at most 32767."""
    magnitudes = np.sort(np.abs(products), axis=axis)
    second = magnitudes.take(-2, axis) if magnitudes.shape[axis] > 1 else 0
    return magnitudes.take(-1, axis) + second <= INT16_MAX


def _matmul_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The raw products ``a[..., i, k] * b[k, j]`` as int64, shape (..., m, k, n)."""
    return _wide(a)[..., None] * _wide(b)


def _pair_saturated_matmul(a: np.ndarray, b: np.ndarray, a_zp: np.ndarray, b_zp: np.ndarray
                           ) -> np.ndarray:
    """onnxruntime's ``(a - a_zp) @ (b - b_zp)`` where its uint8 x int8 GEMM saturates: raw
    products summed in pairs along K (0 and 1, 2 and 3, ...; an odd K's last one alone), each pair
    clipped to int16, the pairs summed exactly, then the zero-point terms, exactly."""
    products = _matmul_products(a, b)
    if products.shape[-2] % 2:
        products = np.concatenate([products, np.zeros_like(products[..., :1, :])], axis=-2)
    pairs = np.clip(products[..., 0::2, :] + products[..., 1::2, :], -INT16_MAX - 1, INT16_MAX)
    k = a.shape[-1]
    return (pairs.sum(-2) - b_zp * _wide(a).sum(-1, keepdims=True) - a_zp * _wide(b).sum(0)
            + k * a_zp * b_zp)


def _conv_reference(x: np.ndarray, x_zp: Any, w: np.ndarray, w_zp: Any, attrs: dict[str, Any]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The exact convolution of ``x - x_zp`` with ``w - w_zp`` (w_zp per tensor or per output
    channel) as int64 of shape (N, M, *out), and :func:`_below_pair_saturation` of each output's
    raw products. Both from x's receptive fields padded with x's zero point, as onnxruntime's
    im2col pads (qconv_case draws no dilations)."""
    rank, group, pads = x.ndim - 2, attrs["group"], attrs["pads"]
    (n, c), m = x.shape[:2], w.shape[0]
    padded = np.pad(_wide(x), [(0, 0)] * 2 + list(zip(pads[:rank], pads[rank:], strict=True)),
                    constant_values=int(x_zp))
    fields = sliding_window_view(padded, w.shape[2:], axis=tuple(range(2, x.ndim)))
    fields = fields[(slice(None),) * 2 + tuple(slice(None, None, s) for s in attrs["strides"])]
    out = fields.shape[2:x.ndim]
    # a tap is an input channel of the group and a kernel position: the receptive fields as
    # (N, group, 1, pixels, taps) against the weights as (group, M / group, 1, taps)
    cols = (fields.reshape(n, group, c // group, -1, math.prod(w.shape[2:]))
            .transpose(0, 1, 3, 2, 4).reshape(n, group, 1, -1, w[0].size))
    taps = _wide(w).reshape(group, m // group, 1, -1)
    taps_zp = np.broadcast_to(_wide(w_zp), (m,)).reshape(group, m // group, 1, 1)
    acc = ((cols - _wide(x_zp)) * (taps - taps_zp)).sum(-1)
    safe = _below_pair_saturation(cols * taps, -1)
    return acc.reshape(n, m, *out), safe.reshape(n, m, *out)


def _requantize(acc: np.ndarray, multiplier: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """onnxruntime's requantization of an int32 accumulator to ``zero_point``'s dtype:
    ``float32(acc) * multiplier`` in float32, rounded half to even, plus the zero point,
    saturated."""
    info = np.iinfo(zero_point.dtype)
    y = np.rint(acc.astype(F) * multiplier.astype(F)) + zero_point.astype(F)
    return np.clip(y, info.min, info.max).astype(zero_point.dtype)


def _check_exact_and_ort(op: str, case: Case, expected: np.ndarray, safe: np.ndarray,
                         saturates: bool) -> np.ndarray:
    """The kernel gives ``expected`` (the exact ONNX result, computed here) and onnxruntime's
    result: everywhere, or only where ``safe`` if onnxruntime's GEMM ``saturates`` pairs of
    products. Returns onnxruntime's result."""
    (ours,) = run_kernel(op, case.inputs, case.attrs)
    assert_matches([ours], [expected])
    (ort,) = ort_reference(op, case.inputs, case.attrs, opset=case.opset)
    if saturates:
        assert ort.shape == safe.shape, f"onnxruntime's shape {ort.shape} != {safe.shape}"
        assert_matches([ours[safe]], [ort[safe]])
    else:
        assert_matches([ours], [ort])
    return ort


# A @ B is exactly [[0, -510], [0, -125]], but where U8S8_SATURATES onnxruntime's pairs of
# 255 * 127 and 255 * -127 saturate to 32767 and -32768, and its first result is -1; the other
# three cannot saturate. Each integer op's test has them as an example (with multiplier 1 where
# it requantizes, so a result 1 off shows): on every host, one result that may saturate beside
# three that are compared with onnxruntime whatever the host.
PAIRS_A = np.array([[255, 255, 255, 255], [50, 60, 55, 55]], np.uint8)
PAIRS_B = np.array([[127, 1], [127, -2], [-127, 3], [-127, -4]], np.int8)
ONE = np.array(1.0, F)
POINTWISE = {"group": 1, "pads": [0, 0, 0, 0], "strides": [1, 1]}  # a 1x1 conv is a matmul


@settings(max_examples=30, deadline=None)
@given(case=matmul_integer_case())
@example(case=Case([PAIRS_A, PAIRS_B], {}))
def test_matmul_integer_matches_ort(case):
    a, b, *zero_points = case.inputs
    a_zp, b_zp = (_wide(z) for z in zero_points or (0, 0))
    acc = (_wide(a) - a_zp) @ (_wide(b) - b_zp)
    saturates = _ort_saturates(a, b)
    ort = _check_exact_and_ort("MatMulInteger", case, acc.astype(np.int32),
                               _below_pair_saturation(_matmul_products(a, b), -2), saturates)
    if saturates:  # all of onnxruntime's difference is its saturation
        np.testing.assert_array_equal(ort, _pair_saturated_matmul(a, b, a_zp, b_zp))


@settings(max_examples=30, deadline=None)
@given(case=qlinear_matmul_case())
@example(case=Case([PAIRS_A, ONE, np.array(0, np.uint8), PAIRS_B, ONE, np.array(0, np.int8), ONE,
                    np.array(128, np.uint8)], {}))
def test_qlinear_matmul_matches_ort(case):
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = case.inputs
    a_zp, b_zp = _wide(a_zp), _wide(b_zp)
    multiplier = a_scale * b_scale / y_scale
    acc = (_wide(a) - a_zp) @ (_wide(b) - b_zp)
    saturates = _ort_saturates(a, b)
    ort = _check_exact_and_ort("QLinearMatMul", case, _requantize(acc, multiplier, y_zp),
                               _below_pair_saturation(_matmul_products(a, b), -2), saturates)
    if saturates:  # all of onnxruntime's difference is its saturation
        saturated = _pair_saturated_matmul(a, b, a_zp, b_zp)
        np.testing.assert_array_equal(ort, _requantize(saturated, multiplier, y_zp))


@settings(max_examples=30, deadline=None)
@given(case=conv_integer_case())
@example(case=Case([PAIRS_B[None, :, None, :], PAIRS_A[:, :, None, None]], POINTWISE))
def test_conv_integer_matches_ort(case):
    x, w, *zero_points = case.inputs
    x_zp, w_zp = zero_points or (0, 0)
    acc, safe = _conv_reference(x, x_zp, w, w_zp, case.attrs)
    # onnxruntime's GEMM here takes the weights as A, x's receptive fields as B
    _check_exact_and_ort("ConvInteger", case, acc.astype(np.int32), safe, _ort_saturates(w, x))


@settings(max_examples=30, deadline=None)
@given(case=qlinear_conv_case())
@example(case=Case([PAIRS_A.T[None, :, None, :], ONE, np.array(0, np.uint8),
                    PAIRS_B.T[:, :, None, None], ONE, np.array(0, np.int8), ONE,
                    np.array(128, np.uint8)], POINTWISE))
def test_qlinear_conv_matches_ort(case):
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, *bias = case.inputs
    acc, safe = _conv_reference(x, x_zp, w, w_zp, case.attrs)
    per_channel = (-1,) + (1,) * (x.ndim - 2)  # (M,) against (N, M, *out)
    if bias:
        acc += _wide(bias[0]).reshape(per_channel)
    multiplier = x_scale * w_scale.reshape(per_channel) / y_scale
    _check_exact_and_ort("QLinearConv", case, _requantize(acc, multiplier, y_zp), safe,
                         _ort_saturates(x, w))


BELOW_128 = [
    ("MatMulInteger", matmul_integer_case(UINT8, INT8, below_128=True)),
    ("QLinearMatMul", qlinear_matmul_case(UINT8, INT8, below_128=True)),
    ("QLinearConv", qlinear_conv_case(UINT8, below_128=True)),
    ("ConvInteger", conv_integer_case(INT8, UINT8, below_128=True)),  # w is onnxruntime's A
]


@pytest.mark.parametrize("op, cases", BELOW_128, ids=[op for op, _ in BELOW_128])
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_uint8_below_128_by_int8_matches_ort_everywhere(op, cases, data):
    """No two products of a uint8 value below 128 and an int8 one pass 32767: onnxruntime is exact
    on every host, so every element is compared, also where U8S8_SATURATES."""
    case = data.draw(cases, label="case")
    check_against_ort(op, case.inputs, case.attrs, opset=case.opset)


I8, U8 = np.int8, np.uint8
S = np.array(0.1, F)
BAD = [
    ("QuantizeLinear", [np.zeros(4, np.int32), S], {}, "dtype"),
    ("QuantizeLinear", [np.zeros((2, 3), F), np.ones(4, F)], {}, "length 3"),
    ("QuantizeLinear", [np.zeros((2, 3), F), np.ones(3, F), np.zeros(2, I8)], {}, "shape"),
    ("QuantizeLinear", [np.zeros((2, 3), F), np.ones(3, F)], {"axis": 5}, "axis=5"),
    ("QuantizeLinear", [np.zeros((2, 4), F), np.ones((2, 2), F)], {"block_size": 2},
     "block_size"),
    ("DequantizeLinear", [np.zeros(4, F), S], {}, "dtype"),
    ("DequantizeLinear", [np.zeros(4, I8), S, np.array(0, U8)], {}, "dtype"),
    ("MatMulInteger", [np.zeros((2, 3), I8), np.zeros((4, 2), I8)], {}, "inner"),
    ("MatMulInteger", [np.zeros((2, 3), F), np.zeros((3, 2), I8)], {}, "dtype"),
    ("MatMulInteger", [np.zeros((2, 3), I8), np.zeros((3, 2), I8), np.zeros(5, I8)], {},
     "a_zero_point"),
    ("QLinearMatMul", [np.zeros((2, 3), U8), S, np.array(0, U8)], {}, "8 inputs"),
    ("QLinearMatMul", [np.zeros((2, 3), U8), np.ones(2, F), np.array(0, U8),
                       np.zeros((3, 2), U8), S, np.array(0, U8), S, np.array(0, U8)], {},
     "a_scale"),
    ("ConvInteger", [np.zeros((1, 4, 5, 5), U8), np.zeros((2, 3, 3, 3), U8)], {}, "channels"),
    ("ConvInteger", [np.zeros((1, 4, 5, 5), U8), np.zeros((2, 4, 3, 3), U8), None,
                     np.zeros(3, U8)], {}, "w_zero_point"),
    ("QLinearConv", [np.zeros((1, 2, 5, 5), U8), S, np.array(0, U8), np.zeros((2, 2, 3, 3), I8),
                     np.ones(3, F), np.array(0, I8), S, np.array(0, U8)], {}, "w_scale"),
    ("QLinearConv", [np.zeros((1, 2, 5, 5), U8), S, np.array(0, U8), np.zeros((2, 2, 3, 3), I8),
                     S, np.array(0, I8), S, np.array(0, U8), np.zeros(2, F)], {}, "int32"),
    ("QLinearConv", [np.zeros((1, 2, 5, 5), U8), S, np.array(0, U8), np.zeros((2, 2, 3, 3), I8),
                     S, np.array(0, I8), S, np.array(0, U8)], {"group": 3}, "group=3"),
]


@pytest.mark.parametrize("op, inputs, attrs, words", BAD, ids=[f"{b[0]}-{b[3]}" for b in BAD])
def test_rejects_bad_input(op, inputs, attrs, words):
    with pytest.raises(KernelError, match=words):
        run_kernel(op, inputs, attrs)
