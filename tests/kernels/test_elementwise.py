"""Elementwise kernels against onnxruntime: arithmetic, variadic, Where, Cast, identities."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import (
    BF16,
    FLOATS,
    broadcastable,
    check_against_ort,
    random_array,
    run_kernel,
    seeds,
    shapes,
)

INTS = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64))


@st.composite
def broadcast_pair(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast, either one possibly the smaller."""
    big = draw(shapes())
    small = draw(broadcastable(big))
    return (big, small) if draw(st.booleans()) else (small, big)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@settings(max_examples=30)
@given(pair=broadcast_pair(), seed=seeds, dtype=st.sampled_from(FLOATS + INTS))
def test_binary_arithmetic_matches_ort(op, pair, seed, dtype):
    a = random_array(seed, pair[0], dtype, -100, 100)
    b = random_array(seed + 1, pair[1], dtype, -100, 100)
    if op == "Div" and dtype.kind in "iu":
        b[b == 0] = 3  # integer division by zero is tested as an error below
    check_against_ort(op, [a, b], opset=14)


@settings(max_examples=30)
@given(pair=broadcast_pair(), seed=seeds,
       types=st.sampled_from([(np.float32, np.float32), (np.float32, np.int64),
                              (np.float32, np.int32), (np.int32, np.int32),
                              (np.int64, np.float32), (np.float16, np.float32)]))
def test_pow_matches_ort(pair, seed, types):
    x = random_array(seed, pair[0], types[0], -5, 5)
    y = random_array(seed + 1, pair[1], types[1], -3, 3)
    if np.dtype(types[0]).kind == "f" and np.dtype(types[1]).kind == "f":
        x = np.asarray(np.abs(x))  # a negative base to a fractional power is NaN on both sides
    check_against_ort("Pow", [x, y], opset=15)


UNARY = {
    "Sqrt": (FLOATS, 0, 10),
    "Exp": (FLOATS, -10, 10),
    "Log": (FLOATS, 0.01, 10),
    "Reciprocal": (FLOATS, 0.1, 10),
    "Neg": (FLOATS + (np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)), -50, 50),
    "Abs": (FLOATS + INTS, -50, 50),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@settings(max_examples=20)
@given(data=st.data(), shape=shapes(), seed=seeds)
def test_unary_math_matches_ort(op, data, shape, seed):
    allowed, low, high = UNARY[op]
    dtype = data.draw(st.sampled_from(allowed))
    x = random_array(seed, shape, dtype, low, high)
    check_against_ort(op, [x], opset=13)


@pytest.mark.parametrize("op", ["Sum", "Mean", "Min", "Max"])
@settings(max_examples=25)
@given(data=st.data(), base=shapes(), seed=seeds, n=st.integers(1, 4))
def test_variadic_matches_ort(op, data, base, seed, n):
    # ONNX Sum and Mean take floats only.
    dtype = data.draw(st.sampled_from(FLOATS if op in ("Sum", "Mean") else FLOATS + INTS))
    arrays = [random_array(seed + i, data.draw(broadcastable(base)) if i else base, dtype)
              for i in range(n)]
    check_against_ort(op, arrays, opset=13)


def test_integer_div_truncates_toward_zero_like_ort():
    a = np.array([7, -7, 7, -7, -128, 5], np.int8)
    b = np.array([2, 2, -2, 3, 3, -7], np.int8)
    out = check_against_ort("Div", [a, b], opset=14)[0]
    np.testing.assert_array_equal(out, [3, -3, -3, -2, -42, 0])


def test_integer_add_wraps_like_ort():
    a = np.array([120, -120], np.int8)
    check_against_ort("Add", [a, np.array([10, -10], np.int8)], opset=14)


def test_zero_dim_inputs_give_zero_dim_outputs():
    a = np.array(2.5, np.float32)
    for op in ("Add", "Mul", "Max", "Sum"):
        out = run_kernel(op, [a, a])[0]
        assert isinstance(out, np.ndarray) and out.shape == ()


@settings(max_examples=30)
@given(shape=shapes(), seed=seeds, data=st.data(),
       dtype=st.sampled_from([np.float32, np.int32, np.int64, np.uint8]))
def test_where_matches_ort(shape, seed, data, dtype):
    cond = random_array(seed, data.draw(broadcastable(shape)), np.bool_)
    x = random_array(seed + 1, data.draw(broadcastable(shape)), dtype)
    y = random_array(seed + 2, shape, dtype)
    check_against_ort("Where", [cond, x, y], opset=16)


CAST_TARGETS = {1: np.float32, 10: np.float16, 3: np.int8, 2: np.uint8, 6: np.int32, 7: np.int64,
                9: np.bool_}


@settings(max_examples=40)
@given(shape=shapes(), seed=seeds, to=st.sampled_from(sorted(CAST_TARGETS)),
       src=st.sampled_from([np.float32, np.float16, np.int8, np.uint8, np.int32, np.int64,
                            np.bool_]))
def test_cast_matches_ort(shape, seed, to, src):
    x = random_array(seed, shape, src, -300, 300)
    check_against_ort("Cast", [x], {"to": to}, opset=19, upcast_halves=False)


def test_cast_out_of_range_and_nan_follow_ort():
    x = np.array([1.7, -1.7, 200.5, -200.5, 3e9, -3e9, np.nan, np.inf, -np.inf, -0.5], np.float32)
    for to in (3, 2, 6, 7, 9):
        check_against_ort("Cast", [x], {"to": to}, opset=19)


def test_cast_to_bfloat16_rounds_to_nearest_even():
    # bf16 has 8 significant bits: 1 + 2**-8 is a tie between 1 and 1 + 2**-7 and goes to even.
    x = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20], np.float32)
    out = run_kernel("Cast", [x], {"to": 16})[0]
    assert out.dtype == BF16
    np.testing.assert_array_equal(out.astype(np.float32), [1.0, 1 + 2**-6, 1 + 2**-7])


def test_bfloat16_arithmetic_rounds_once():
    a = np.array([1.0, 3.0], ml_dtypes.bfloat16)
    b = np.array([2**-8 + 2**-12, 2**-9], ml_dtypes.bfloat16)
    # Exact sums round up once; rounding b first, or the sum twice, would give 1.0 / 3.0.
    out = run_kernel("Add", [a, b])[0]
    np.testing.assert_array_equal(out.astype(np.float32), [1 + 2**-7, 3.0])


def test_identity_and_dropout_return_input_and_true_mask():
    x = random_array(1, (2, 3), np.float32)
    check_against_ort("Identity", [x], opset=16)
    check_against_ort("Dropout", [x], n_outputs=2, opset=13)
    check_against_ort("Dropout", [x, np.array(0.5, np.float32), np.array(False)], n_outputs=2,
                      opset=13)


@pytest.mark.parametrize(("op", "inputs", "attrs", "match"), [
    ("Add", [np.zeros(3, np.float32), np.zeros(3, np.int32)], {},
     "inputs must share one dtype, got float32, int32"),
    ("Mul", [np.zeros((2, 3), np.float32), np.zeros((4,), np.float32)], {},
     r"input shapes \(2, 3\), \(4,\) do not broadcast"),
    ("Div", [np.ones(3, np.int32), np.array([1, 0, 2], np.int32)], {},
     "integer division by zero"),
    ("Sqrt", [np.ones(3, np.int32)], {}, "dtype int32 is not supported"),
    ("Neg", [np.ones(3, np.uint8)], {}, "dtype uint8 is not supported"),
    ("Sub", [np.ones(3, np.float32)], {}, "takes 2 inputs, got 1"),
    ("Sum", [], {}, "at least 1 input"),
    ("Sum", [np.ones(3, np.int32)], {}, "dtype int32 is not supported"),
    ("Max", [np.ones(3, np.float32), None], {}, r"required input 1 \(input 1\) is missing"),
    ("Where", [np.ones(3, np.float32)] * 3, {}, "condition dtype float32"),
    ("Cast", [np.ones(3, np.float32)], {}, "attribute 'to' is required"),
    ("Cast", [np.ones(3, np.float32)], {"to": 8}, "to=8 is not a supported"),
    ("Dropout", [np.ones(3, np.float32), None, np.array(True)], {}, "training_mode=True"),
])
def test_bad_elementwise_input_raises_kernel_error(op, inputs, attrs, match):
    with pytest.raises(KernelError, match=match) as info:
        run_kernel(op, inputs, attrs)
    assert info.value.op == op
