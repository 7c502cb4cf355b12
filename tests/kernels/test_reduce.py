"""Reduction kernels against onnxruntime: axes as input or attribute, keepdims, noop, dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import FLOATS, check_against_ort, random_array, run_kernel, seeds, shapes

# op -> first opset with axes as an input
OPS = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceL2": 18}
INTS = (np.dtype(np.int32), np.dtype(np.int64))


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=30)
@given(data=st.data(), shape=shapes(max_side=4), seed=seeds, dtype=st.sampled_from(FLOATS + INTS),
       form=st.sampled_from(["input", "attribute", "none"]), keepdims=st.sampled_from([0, 1]))
def test_reduction_matches_ort(op, data, shape, seed, dtype, form, keepdims):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                              unique_by=lambda a: a % rank)) if rank else []
    x = random_array(seed, shape, dtype, -20, 20)
    attrs = {"keepdims": keepdims}
    if form == "input" and axes:
        check_against_ort(op, [x, np.array(axes, np.int64)], attrs, opset=OPS[op],
                          constant_inputs=[1])
    elif form == "attribute" and axes:
        check_against_ort(op, [x], {**attrs, "axes": axes}, opset=OPS[op] - 1)
    else:
        check_against_ort(op, [x], attrs, opset=OPS[op])


@pytest.mark.parametrize("op", sorted(OPS))
def test_noop_with_empty_axes_reduces_nothing(op):
    x = random_array(4, (2, 3), np.float32)
    out = check_against_ort(op, [x], {"noop_with_empty_axes": 1}, opset=18)[0]
    # Nothing is reduced; ReduceL2 still takes sqrt(x * x) per element.
    np.testing.assert_allclose(out, np.abs(x) if op == "ReduceL2" else x, rtol=1e-6)


@pytest.mark.parametrize("op", sorted(OPS))
def test_reducing_an_empty_axis_gives_the_identity_like_ort(op):
    x = np.zeros((0, 3), np.float32)
    check_against_ort(op, [x, np.array([0], np.int64)], opset=18, constant_inputs=[1])


def test_integer_mean_and_l2_truncate_like_ort():
    x = np.array([[1, 2], [-1, -2], [4, 4], [-7, 0]], np.int32)
    mean = check_against_ort("ReduceMean", [x], {"axes": [1]}, opset=13)[0]
    np.testing.assert_array_equal(mean.reshape(-1), [1, -1, 4, -3])
    l2 = check_against_ort("ReduceL2", [x], {"axes": [1]}, opset=13)[0]
    np.testing.assert_array_equal(l2.reshape(-1), [2, 2, 5, 7])


@pytest.mark.parametrize(("inputs", "attrs", "match"), [
    ([np.zeros((2, 3), np.float32), np.array([2], np.int64)], {}, "axes=2 is out of range"),
    ([np.zeros((2, 3), np.float32), np.array([0, -2], np.int64)], {}, "repeats an axis"),
    ([np.zeros((2, 3), np.float32), np.array([0.0])], {}, "axes must be a 1-D integer"),
    ([np.zeros((2, 3), np.bool_)], {}, "data dtype bool is not supported"),
    ([], {}, "takes 1 to 2 inputs, got 0"),
])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceL2"])
def test_bad_reduction_input_raises_kernel_error(op, inputs, attrs, match):
    with pytest.raises(KernelError, match=match) as info:
        run_kernel(op, inputs, attrs)
    assert info.value.op == op
