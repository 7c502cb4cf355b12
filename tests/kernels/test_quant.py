"""Quantization kernels against onnxruntime: every integer result must match exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import check_against_ort, random_array, run_kernel, seeds, shapes
from npu_sim.errors import KernelError

F = np.float32
INT8S = st.sampled_from([np.dtype(np.int8), np.dtype(np.uint8)])


def _zero_point(seed: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return random_array(seed, shape, dtype, -20, 150)


def _scale(seed: int, shape: tuple[int, ...], high: float = 0.2) -> np.ndarray:
    return np.asarray(np.random.default_rng(seed).uniform(0.005, high, size=shape), F)


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


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 40), n=st.integers(1, 6), batch=st.integers(0, 2),
       seed=seeds, a_dtype=INT8S, b_dtype=INT8S, zp_kind=st.sampled_from(["none", "scalar",
                                                                         "per_col"]))
def test_matmul_integer_matches_ort(m, k, n, batch, seed, a_dtype, b_dtype, zp_kind):
    a = random_array(seed, (batch, m, k) if batch else (m, k), a_dtype, -128, 255)
    b = random_array(seed + 1, (k, n), b_dtype, -128, 255)
    inputs: list = [a, b]
    if zp_kind != "none":
        inputs.append(_zero_point(seed + 2, (), a_dtype))
        inputs.append(_zero_point(seed + 3, (n,) if zp_kind == "per_col" else (), b_dtype))
    check_against_ort("MatMulInteger", inputs)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 40), n=st.integers(1, 6), seed=seeds,
       a_dtype=INT8S, b_dtype=INT8S, per_column=st.booleans())
def test_qlinear_matmul_matches_ort(m, k, n, seed, a_dtype, b_dtype, per_column):
    # onnxruntime implements QLinearMatMul only with y in a's dtype, and int8 a with int8 b
    if a_dtype == np.int8:
        b_dtype = a_dtype
    b_params = (n,) if per_column else ()  # per-column b scales and zero points: opset 21
    inputs = [random_array(seed, (2, m, k), a_dtype, -128, 255), _scale(seed + 1, ()),
              _zero_point(seed + 2, (), a_dtype),
              random_array(seed + 3, (k, n), b_dtype, -128, 255), _scale(seed + 4, b_params),
              _zero_point(seed + 5, b_params, b_dtype), _scale(seed + 6, (), 4.0),
              _zero_point(seed + 7, (), a_dtype)]
    check_against_ort("QLinearMatMul", inputs, opset=21 if per_column else 17)


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


@settings(max_examples=30, deadline=None)
@given(case=qconv_case(), seed=seeds, x_dtype=INT8S, w_dtype=INT8S, w_zp_kind=st.sampled_from(
    ["none", "scalar", "per_channel"]))
def test_conv_integer_matches_ort(case, seed, x_dtype, w_dtype, w_zp_kind):
    (xs, ws), attrs = case
    if w_dtype == np.int8:  # onnxruntime's ConvInteger kernel takes uint8 weights only
        w_dtype = np.dtype(np.uint8)
    inputs: list = [random_array(seed, xs, np.uint8, 0, 255),
                    random_array(seed + 1, ws, w_dtype, 0, 255)]
    if w_zp_kind != "none":
        inputs.append(_zero_point(seed + 2, (), np.dtype(np.uint8)))
        inputs.append(_zero_point(seed + 3, (), w_dtype))
    check_against_ort("ConvInteger", inputs, attrs)


@settings(max_examples=30, deadline=None)
@given(case=qconv_case(), seed=seeds, x_dtype=INT8S, per_channel=st.booleans(),
       with_bias=st.booleans())
def test_qlinear_conv_matches_ort(case, seed, x_dtype, per_channel, with_bias):
    (xs, ws), attrs = case
    m = ws[0]
    wshape = (m,) if per_channel else ()
    inputs = [random_array(seed, xs, x_dtype, -128, 255), _scale(seed + 1, ()),
              _zero_point(seed + 2, (), x_dtype),
              random_array(seed + 3, ws, np.int8, -128, 127), _scale(seed + 4, wshape),
              np.zeros(wshape, np.int8), _scale(seed + 5, (), 2.0),
              _zero_point(seed + 6, (), x_dtype)]
    if with_bias:
        inputs.append(random_array(seed + 7, (m,), np.int32, -5000, 5000))
    check_against_ort("QLinearConv", inputs, attrs)


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
