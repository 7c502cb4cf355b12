"""Comparison, logic and float-class kernels against onnxruntime, with NaN, infinities,
broadcasting and every dtype onnxruntime's CPU provider runs them on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import (
    broadcastable,
    check_like_ort,
    random_array,
    run_kernel,
    seeds,
    shapes,
    with_specials,
)

COMPARE = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")
DTYPES = (np.float32, np.float16, np.int8, np.uint8, np.int32, np.int64)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)


@settings(max_examples=40)
@given(op=st.sampled_from(COMPARE), dtype=st.sampled_from(DTYPES), shape=shapes(),
       data=st.data(), seed=seeds)
def test_comparisons_match_ort(op, dtype, shape, data, seed):
    other = data.draw(broadcastable(shape))
    a = with_specials(random_array(seed, shape, dtype), seed, SPECIAL)
    b = with_specials(random_array(seed + 1, other, dtype), seed + 1, SPECIAL)
    out = check_like_ort(op, [a, b], opset=16)
    assert out is not None and out[0].dtype == np.bool_


@settings(max_examples=30)
@given(op=st.sampled_from(["And", "Or", "Xor", "Equal"]), shape=shapes(), data=st.data(),
       seed=seeds)
def test_logic_on_bools_matches_ort(op, shape, data, seed):
    other = data.draw(broadcastable(shape))
    a = random_array(seed, shape, np.bool_)
    b = random_array(seed + 1, other, np.bool_)
    assert check_like_ort(op, [a, b], opset=16) is not None


@settings(max_examples=30)
@given(shape=shapes(), dtype=st.sampled_from([np.float32, np.float16]), seed=seeds,
       positive=st.sampled_from([0, 1]), negative=st.sampled_from([0, 1]))
def test_float_class_tests_match_ort(shape, dtype, seed, positive, negative):
    x = with_specials(random_array(seed, shape, dtype), seed, SPECIAL)
    assert check_like_ort("IsNaN", [x], opset=16) is not None
    attrs = {"detect_positive": positive, "detect_negative": negative}
    assert check_like_ort("IsInf", [x], attrs, opset=20) is not None  # float16 since IsInf-20
    assert check_like_ort("Not", [np.asarray(x < 0)], opset=16) is not None


@pytest.mark.parametrize(("op", "inputs", "text"), [
    ("Less", [np.zeros(2, np.float32), np.zeros(2, np.int32)], "share one dtype"),
    ("And", [np.zeros(2, np.float32), np.zeros(2, np.float32)], "float32"),
    ("Greater", [np.zeros((2, 3), np.int64), np.zeros((4,), np.int64)], "do not broadcast"),
    ("IsNaN", [np.zeros(2, np.int32)], "int32"),
    ("Not", [np.zeros(2, np.int8)], "int8"),
])
def test_bad_operands_are_typed_errors(op, inputs, text):
    with pytest.raises(KernelError, match=text):
        run_kernel(op, inputs)
