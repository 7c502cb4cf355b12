"""Activation kernels against onnxruntime, and apply_activation as the fused code path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from npu_sim.errors import KernelError
from npu_sim.kernels.activations import (
    ACTIVATIONS,
    activation_params,
    apply_activation,
    clamp01,
)
from tests.kernels import (
    FLOATS,
    assert_matches,
    broadcastable,
    check_against_ort,
    ort_reference,
    random_array,
    run_kernel,
    seeds,
    shapes,
)
from tests.ortref import run_ort

# op -> (opset, strategy of attributes)
UNARY = {
    "Relu": (17, st.just({})),
    "LeakyRelu": (17, st.one_of(st.just({}), st.fixed_dictionaries(
        {"alpha": st.floats(-2, 2, width=32)}))),
    "Sigmoid": (17, st.just({})),
    "HardSigmoid": (17, st.fixed_dictionaries({}, optional={
        "alpha": st.floats(-1, 1, width=32), "beta": st.floats(-1, 1, width=32)})),
    "HardSwish": (17, st.just({})),
    "Tanh": (17, st.just({})),
    "Erf": (17, st.just({})),
    "Gelu": (20, st.fixed_dictionaries({}, optional={"approximate": st.sampled_from(
        ["none", "tanh"])})),
}


@pytest.mark.parametrize("op", sorted(UNARY))
@settings(max_examples=20)
@given(data=st.data(), shape=shapes(), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_unary_activation_matches_ort(op, data, shape, seed, dtype):
    opset, attrs_strategy = UNARY[op]
    attrs = data.draw(attrs_strategy)
    x = random_array(seed, shape, dtype, -6, 6)
    check_against_ort(op, [x], attrs, opset=opset)


@pytest.mark.parametrize(("op", "attrs"), [
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}),
    ("HardSigmoid", {"alpha": 0.37, "beta": -0.2}), ("HardSwish", {})])
def test_hard_sigmoid_and_hard_swish_are_onnxruntimes_bits(op, attrs):
    """onnxruntime multiplies by the float alpha (HardSwish: by 1/6 as a float), then adds, in
    float32; in float64 10-15% of the results differed by an ulp."""
    rng = np.random.default_rng(0)
    x = np.concatenate([(rng.standard_normal(200_000) * 4).astype(np.float32),
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0], np.float32)])
    want = run_ort(op, [x], attrs, opset=14 if op == "HardSwish" else 17)[0]
    got = apply_activation(x, op, activation_params(op, attrs))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@settings(max_examples=30)
@given(shape=shapes(), seed=seeds, dtype=st.sampled_from(FLOATS + (np.dtype(np.int8),
                                                                   np.dtype(np.int32))),
       lo=st.one_of(st.none(), st.integers(-5, 5)), hi=st.one_of(st.none(), st.integers(-5, 5)))
def test_clip_inputs_match_ort(shape, seed, dtype, lo, hi):
    x = random_array(seed, shape, dtype, -8, 8)
    bounds = [None if b is None else np.array(b, dtype=dtype) for b in (lo, hi)]
    while bounds and bounds[-1] is None:
        bounds.pop()
    check_against_ort("Clip", [x, *bounds], opset=13)


@settings(max_examples=15)
@given(shape=shapes(), seed=seeds, lo=st.floats(-3, 3, width=32), hi=st.floats(-3, 3, width=32))
def test_clip_opset6_attributes_match_ort(shape, seed, lo, hi):
    x = random_array(seed, shape, np.float32)
    lo, hi = sorted((lo, hi))  # onnxruntime's Clip-6 requires min <= max
    check_against_ort("Clip", [x], {"min": lo, "max": hi}, opset=6)


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
def test_relu_integers_match_ort(dtype):
    x = random_array(3, (4, 5), dtype, -100, 100)
    check_against_ort("Relu", [x], opset=14)


@settings(max_examples=30)
@given(data=st.data(), shape=shapes(min_dims=1), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_prelu_broadcast_slope_matches_ort(data, shape, seed, dtype):
    slope_shape = data.draw(broadcastable(shape))
    x = random_array(seed, shape, dtype)
    slope = random_array(seed + 1, slope_shape, dtype, -1, 1)
    check_against_ort("PRelu", [x, slope], opset=16)


# --- apply_activation: the entry point fused producers call -----------------------------------

FUSED_CASES = [
    ("Relu", {}, []),
    ("LeakyRelu", {"alpha": 0.3}, []),
    ("Clip", {}, [np.array(0.0, np.float32), np.array(6.0, np.float32)]),
    ("Sigmoid", {}, []),
    ("HardSigmoid", {"alpha": 0.4, "beta": 0.1}, []),
    ("HardSwish", {}, []),
    ("Tanh", {}, []),
    ("Gelu", {"approximate": "tanh"}, []),
    ("Gelu", {}, []),
]


@pytest.mark.parametrize(("op", "attrs", "extra"), FUSED_CASES)
def test_apply_activation_equals_onnx_node(op, attrs, extra):
    x = random_array(11, (2, 3, 4, 5), np.float32, -8, 8)
    params = activation_params(op, attrs, [x, *extra])
    expected = ort_reference(op, [x, *extra], attrs, opset=20)
    assert_matches([apply_activation(x, op, params)], expected)


@pytest.mark.parametrize("op", ACTIVATIONS)
def test_apply_activation_inplace_writes_the_callers_buffer(op):
    x = random_array(5, (3, 7), np.float32)
    expected = apply_activation(x, op)
    y = apply_activation(x, op, inplace=True)
    assert y is x
    np.testing.assert_array_equal(y, expected)


def test_apply_activation_default_params_are_onnx_defaults():
    x = random_array(7, (50,), np.float32)
    for op in ("LeakyRelu", "HardSigmoid", "Gelu"):
        np.testing.assert_array_equal(apply_activation(x, op),
                                      apply_activation(x, op, activation_params(op, {})))
    np.testing.assert_array_equal(apply_activation(x, "HardSigmoid", (0.2,)),
                                  apply_activation(x, "HardSigmoid", (0.2, 0.5)))


def test_apply_activation_on_strided_input_leaves_input_alone():
    base = random_array(9, (6, 8), np.float32)
    view = base[:, ::2]
    before = base.copy()
    y = apply_activation(view, "Relu", inplace=True)
    np.testing.assert_array_equal(y, np.maximum(view, 0))
    # A strided view is copied, not written through.
    np.testing.assert_array_equal(base, before)


# --- bad input ---------------------------------------------------------------------------------


def test_unknown_activation_lists_supported():
    with pytest.raises(KernelError, match="Swish.*supported: Relu, LeakyRelu, Clip") as info:
        apply_activation(np.zeros(3, np.float32), "Swish")
    assert info.value.op == "Swish"


@pytest.mark.parametrize(("call", "match"), [
    (lambda: apply_activation(np.zeros(3, np.int32), "Sigmoid"), "Sigmoid.*dtype int32"),
    (lambda: apply_activation(np.zeros(3, np.float32), "Relu", (1.0,)), "at most 0 params"),
    (lambda: apply_activation(np.zeros(3, np.float32), "Gelu", (0.5,)), "approximate.*0.5"),
    (lambda: apply_activation([1.0, 2.0], "Relu"), "numpy array, got list"),
    (lambda: activation_params("Gelu", {"approximate": "fast"}), "approximate='fast'"),
    (lambda: run_kernel("Clip", [np.zeros(3, np.float32), np.zeros(2, np.float32)]),
     r"min must be a scalar, got shape \(2,\)"),
    (lambda: run_kernel("Relu", []), "takes 1 inputs, got 0"),
    (lambda: run_kernel("PRelu", [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]),
     r"slope shape \(4,\) does not broadcast to X shape \(2, 3\)"),
    (lambda: run_kernel("PRelu", [np.zeros(3, np.float32), np.zeros(3, np.float16)]),
     "slope dtype float16 differs"),
])
def test_bad_activation_input_raises_kernel_error(call, match):
    with pytest.raises(KernelError, match=match):
        call()


def test_integer_clip_saturates_bounds_to_dtype():
    x = np.array([-128, 0, 127], np.int8)
    y = apply_activation(x, "Clip", (-math.inf, 1e9))
    np.testing.assert_array_equal(y, x)
    assert y.dtype == np.int8


def test_clamp01_keeps_the_min_max_formulation_bits_on_a_sweep_of_every_float32() -> None:
    """:func:`clamp01` (three selects the vectoriser takes) against the formulation the
    HardSigmoid loops used before, ``v if v != v else min(1.0, max(0.0, v))``: every 997th bit
    pattern of float32 (NaNs with payloads, subnormals, both zeros) and the edges of [0, 1]."""
    @njit
    def both(x, ours, builtins):
        for i in range(x.size):
            v = x[i]
            ours[i] = clamp01(v)
            builtins[i] = v if v != v else min(1.0, max(0.0, v))

    sweep = np.arange(0, 2**32, 997, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, -0.0, 1.0, -1.0, np.nextafter(1, 2), np.nextafter(1, 0), np.inf,
                      -np.inf, np.nan, -np.nan, 1e-45, -1e-45], np.float32)
    x = np.concatenate([sweep, edges])
    ours, builtins = np.empty_like(x), np.empty_like(x)
    both(x, ours, builtins)
    np.testing.assert_array_equal(ours.view(np.uint32), builtins.view(np.uint32))
