"""Softmax, LogSoftmax, LayerNormalization and BatchNormalization against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import (
    FLOATS,
    broadcastable,
    check_against_ort,
    random_array,
    run_kernel,
    seeds,
    shapes,
)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@settings(max_examples=30)
@given(data=st.data(), shape=shapes(min_dims=1), seed=seeds, dtype=st.sampled_from(FLOATS),
       opset=st.sampled_from([11, 13]))
def test_softmax_matches_ort(op, data, shape, seed, dtype, opset):
    rank = len(shape)
    attrs = {}
    # Before opset 13 the default axis is 1, which a rank-1 tensor lacks.
    if data.draw(st.booleans()) or (opset < 13 and rank < 2):
        attrs["axis"] = data.draw(st.integers(-rank, rank - 1))
    x = random_array(seed, shape, dtype, -30, 30)
    check_against_ort(op, [x], attrs, opset=opset, kernel_attrs={"_opset": opset})


def test_softmax_of_large_logits_does_not_overflow():
    x = np.array([[1000.0, 999.0, -1000.0]], np.float32)
    out = check_against_ort("Softmax", [x], opset=13)[0]
    assert np.isfinite(out).all()


@settings(max_examples=40)
@given(data=st.data(), shape=shapes(min_dims=1), seed=seeds, dtype=st.sampled_from(FLOATS),
       with_bias=st.booleans(), epsilon=st.sampled_from([1e-5, 1e-3, 0.1]))
def test_layer_normalization_matches_ort(data, shape, seed, dtype, with_bias, epsilon):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    norm_shape = shape[axis:]
    x = random_array(seed, shape, dtype, -5, 5) + np.asarray(3, dtype)  # a nonzero mean
    scale = random_array(seed + 1, data.draw(broadcastable(norm_shape)), dtype, 0.5, 2)
    inputs = [x, scale]
    if with_bias:
        inputs.append(random_array(seed + 2, data.draw(broadcastable(norm_shape)), dtype))
    check_against_ort("LayerNormalization", inputs, {"axis": axis, "epsilon": epsilon},
                      n_outputs=3, opset=17, keep_float32=(1, 2))


@settings(max_examples=30)
@given(shape=shapes(min_dims=2), seed=seeds, dtype=st.sampled_from(FLOATS),
       epsilon=st.sampled_from([1e-5, 1e-3]), opset=st.sampled_from([9, 15]))
def test_batch_normalization_matches_ort(shape, seed, dtype, epsilon, opset):
    channels = shape[1]
    x = random_array(seed, shape, dtype, -5, 5)
    scale, bias, mean = (random_array(seed + i, (channels,), dtype, -2, 2) for i in (1, 2, 3))
    var = random_array(seed + 4, (channels,), dtype, 0.1, 3)
    check_against_ort("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": epsilon},
                      opset=opset)


def test_batch_normalization_on_strided_nchw_input():
    x = random_array(1, (2, 4, 6, 6), np.float32)[:, :, ::2, 1:]
    params = [random_array(i, (4,), np.float32, 0.1, 2) for i in range(4)]
    check_against_ort("BatchNormalization", [x, *params], opset=15)


@pytest.mark.parametrize(("op", "inputs", "attrs", "match"), [
    ("Softmax", [np.zeros((2, 3), np.int32)], {}, "dtype int32 is not supported"),
    ("Softmax", [np.zeros((2, 3), np.float32)], {"axis": 2}, "axis=2 is out of range for rank 2"),
    ("LayerNormalization", [np.zeros((2, 3), np.float32), np.ones(4, np.float32)], {},
     r"Scale shape \(4,\) does not broadcast to the normalized shape \(3,\)"),
    ("LayerNormalization", [np.zeros((2, 3), np.float32), np.ones(3, np.float16)], {},
     "Scale dtype float16 differs from X dtype float32"),
    ("LayerNormalization", [np.zeros((2, 3), np.float32), np.ones(3, np.float32)],
     {"stash_type": 10}, "stash_type=10 is not supported"),
    ("LayerNormalization", [np.zeros((2, 3), np.float32)], {}, "takes 2 to 3 inputs, got 1"),
    ("BatchNormalization", [np.zeros((2, 3, 4), np.float32)] + [np.ones(3, np.float32)] * 4,
     {"training_mode": 1}, "training_mode=1 is not supported"),
    ("BatchNormalization", [np.zeros((2, 3, 4), np.float32)] + [np.ones(2, np.float32)] * 4,
     {}, r"scale shape \(2,\) must be \(3,\)"),
    ("BatchNormalization", [np.zeros(3, np.float32)] + [np.ones(3, np.float32)] * 4,
     {}, r"X must have shape \(N, C, ...\), got shape \(3,\)"),
    ("BatchNormalization", [np.zeros((2, 3), np.float32)] + [np.ones(3, np.float32)] * 3 + [None],
     {}, r"required input 4 \(input_var\) is missing"),
])
def test_bad_norm_input_raises_kernel_error(op, inputs, attrs, match):
    with pytest.raises(KernelError, match=match) as info:
        run_kernel(op, inputs, attrs)
    assert info.value.op == op
