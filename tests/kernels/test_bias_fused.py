"""A convolution's bias fused with its Relu or hard-sigmoid gate, or with a residual and a Relu:
the same bits as adding the bias and running the activation or epilogue as separate passes,
specials included, and onnxruntime's unfused Conv then Relu or HardSwish within float32
tolerance."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.epilogue import Step, encode
from npu_sim.kernels.activations import apply_activation
from npu_sim.kernels.bias_fused import bias_residual, fused_bias_loop
from npu_sim.kernels.conv import add_bias
from npu_sim.kernels.gemm import finish
from tests.kernels import random_array, run_kernel, seeds, with_specials
from tests.ortref import run_ort

SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 1e30, -1e30]
FUSED = [{"activation": "Relu"}, {"activation": "Sigmoid"}, {"activation": "HardSigmoid"},
         {"activation": "HardSigmoid", "activation_params": (1 / 6, 0.5)},
         {"activation": "HardSigmoid", "activation_params": (0.3,)},
         encode([Step("HardSigmoid", gate=True, params=(1 / 6, 0.5))]),
         encode([Step("HardSigmoid", gate=True)]), encode([Step("Sigmoid", gate=True)])]


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=2, max_size=5),
       attrs=st.sampled_from(FUSED), seed=seeds)
def test_fused_pass_gives_the_separate_passes_bits(shape, attrs, seed):
    y = with_specials(random_array(seed, shape, np.float32, -8, 8), seed, SPECIALS)
    bias = with_specials(random_array(seed + 1, shape[1:2], np.float32), seed + 1, SPECIALS)
    want = y.copy()
    with np.errstate(all="ignore"):  # inf + -inf: NaN, as in the fused loop
        add_bias(want, bias)
    want = finish(want, attrs, np.dtype(np.float32), "Conv")
    got = y.copy()
    loop = fused_bias_loop("Conv", attrs)
    assert loop is not None and loop(got, bias)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [
    {},  # nothing to fuse
    {"activation": "Clip", "activation_params": (0.0, 6.0)},
    {"activation": "Tanh"},
    {"activation": "Relu", **encode([Step("HardSigmoid", gate=True)])},
    encode([Step("Sigmoid", gate=True), Step("Relu")]),
    encode([Step("Add", operand=1)]),
])
def test_other_launches_are_left_to_the_separate_passes(attrs):
    assert fused_bias_loop("Conv", attrs) is None


@pytest.mark.parametrize("y, bias", [
    (np.zeros((1, 4, 3, 3), np.float16), np.ones(4, np.float32)),  # not float32
    (np.zeros((1, 4, 3, 3), np.float32), np.ones(4, np.float64)),
    (np.zeros((1, 3, 4, 3), np.float32).transpose(0, 2, 1, 3), np.ones(4, np.float32)),
    (np.zeros(4, np.float32), np.ones(4, np.float32)),  # no channel axis
])
def test_the_fused_loop_leaves_operands_it_cannot_take(y, bias):
    before = y.copy()
    assert not fused_bias_loop("Conv", FUSED[0])(y, bias)
    np.testing.assert_array_equal(y, before)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3), m=st.integers(1, 9), pixels=st.integers(1, 70), relu=st.booleans(),
       seed=seeds)
def test_the_residual_pass_gives_the_separate_passes_bits(n, m, pixels, relu, seed):
    """Bias, residual Add and Relu in one pass: what the bias pass, the epilogue's Add and the
    Relu kernel give one after another, with NaN, infinities and signed zeros in all three."""
    y = with_specials(random_array(seed, (n, m, pixels), np.float32, -8, 8), seed, SPECIALS)
    bias = with_specials(random_array(seed + 1, (m,), np.float32), seed + 1, SPECIALS)
    residual = with_specials(random_array(seed + 2, y.shape, np.float32, -8, 8), seed + 2,
                             SPECIALS)
    want, got = y.copy(), y.copy()
    with np.errstate(all="ignore"):
        add_bias(want, bias)
        np.add(want, residual, out=want)
        if relu:
            want = apply_activation(want, "Relu")
        assert bias_residual(got, bias, residual, relu)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("y, bias, residual", [
    (np.zeros((1, 4, 9), np.float32), np.ones(4, np.float32), np.ones((1, 4, 9), np.float16)),
    (np.zeros((1, 4, 9), np.float32), np.ones(4, np.float64), np.ones((1, 4, 9), np.float32)),
    (np.zeros((1, 4, 9), np.float32), np.ones(4, np.float32), np.ones((1, 4, 1), np.float32)),
    (np.zeros((1, 4, 9), np.float32), np.ones(4, np.float32),
     np.ones((1, 9, 4), np.float32).transpose(0, 2, 1)),  # not contiguous
    (np.zeros((1, 9, 4), np.float32).transpose(0, 2, 1), np.ones(4, np.float32),
     np.ones((1, 4, 9), np.float32)),
    (np.zeros((4, 9), np.float32), np.ones(4, np.float32), np.ones((4, 9), np.float32)),
])
def test_the_residual_pass_leaves_operands_it_cannot_take(y, bias, residual):
    before = y.copy()
    assert not bias_residual(y, bias, residual, True)
    np.testing.assert_array_equal(y, before)


@pytest.mark.parametrize("activation", ["Relu", "HardSwish", "SiLU"])
@pytest.mark.parametrize("shape, weight, group", [
    ((1, 16, 14, 14), (24, 16, 1, 1), 1), ((1, 24, 9, 9), (24, 1, 3, 3), 24),
    ((2, 3, 12, 12), (8, 3, 3, 3), 1)])
def test_conv_with_bias_and_activation_matches_onnxruntime(activation, shape, weight, group):
    x = random_array(1, shape, np.float32)
    w = random_array(2, weight, np.float32, -1, 1)
    b = random_array(3, weight[:1], np.float32)
    conv = {"group": group, "kernel_shape": weight[2:], "pads": (weight[2] // 2,) * 4}
    fused = {"Relu": {"activation": "Relu"},
             "HardSwish": encode([Step("HardSigmoid", gate=True, params=(1 / 6, 0.5))]),
             "SiLU": encode([Step("Sigmoid", gate=True)])}[activation]
    got = run_kernel("Conv", [x, w, b], {**conv, **fused})[0]
    y = run_ort("Conv", [x, w, b], conv)[0]
    want = run_ort("Mul", [y, run_ort("Sigmoid", [y])[0]])[0] if activation == "SiLU" else \
        run_ort(activation, [y])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
