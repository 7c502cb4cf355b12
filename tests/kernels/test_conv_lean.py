"""A prepared Conv's lean closures (conv_lean): the bits of the general path, for 1x1
convolutions (scaled by a squeeze-excite gate or not, with a fused epilogue or a residual) and
depthwise ones (on phase-split planes or channels-last), and the general path whenever they do
not apply."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.epilogue import Step, encode
from npu_sim.kernels import conv_lean, conv_parts
from npu_sim.kernels.conv import prepare_conv
from tests.kernels import (
    non_finite_depthwise_case,
    random_array,
    resnet_block_end,
    seeds,
    unprepared_conv,
    with_specials,
)

EPILOGUES = [{}, {"activation": "Relu"}, encode([Step("Sigmoid", gate=True)]),
             encode([Step("HardSigmoid", gate=True, params=(1 / 6, 0.5))]),
             {"activation": "HardSigmoid", "activation_params": (0.2, 0.5)}]
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30]


@pytest.fixture(autouse=True)
def no_split(monkeypatch):
    """conv_parts takes large launches first; these tests are about the ones it leaves."""
    monkeypatch.setattr(conv_parts, "plan", lambda *a: None)


def launches(inputs, attrs, out_shape):
    """The launch prepared with the lean closures off and on, each with its own output buffer,
    and whether a lean closure was planned."""
    outs = [np.full(out_shape, np.nan, np.float32) for _ in range(2)]
    planned = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_lean, "plan", lambda *a: None)
        general = prepare_conv(inputs, attrs, [outs[0]])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(conv_lean, "plan", lambda *a, p=conv_lean.plan:
                   planned.append(p(*a)) or planned[-1])
        lean = prepare_conv(inputs, attrs, [outs[1]])
    return general, lean, outs, planned[0] is not None


def assert_lean_equals_general(inputs, attrs, out_shape, *, planned: bool) -> None:
    general, lean, (want, got), was = launches(inputs, attrs, out_shape)
    assert was == planned
    with np.errstate(all="ignore"):
        general()
        for _ in range(2):  # a second run reads the same views again
            got.fill(np.nan)
            assert lean()[0] is got
    np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 40), m=st.integers(1, 40), pixels=st.integers(1, 80),
       bias=st.booleans(), epilogue=st.sampled_from(EPILOGUES), seed=seeds)
def test_a_lean_1x1_conv_gives_the_bits_of_the_general_path(n, c, m, pixels, bias, epilogue,
                                                           seed):
    x = with_specials(random_array(seed, (n, c, pixels, 1), np.float32, -4, 4), seed, SPECIALS)
    w = random_array(seed + 1, (m, c, 1, 1), np.float32, -1, 1)
    b = random_array(seed + 2, (m,), np.float32) if bias else None
    attrs = {"group": 1, "kernel_shape": (1, 1), **epilogue}
    # an activation or gate without a bias has no fused loop: the general path
    lean = bias or not epilogue
    assert_lean_equals_general([x, w] + ([b] if bias else []), attrs, (n, m, pixels, 1),
                               planned=lean)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 60), m=st.integers(1, 40), pixels=st.integers(1, 60),
       bias=st.booleans(), residual=st.sampled_from([None, "Add", "Mul"]), seed=seeds)
def test_a_lean_squeeze_excite_projection_gives_the_bits_of_the_general_path(
        n, c, m, pixels, bias, residual, seed):
    """Weights scaled per input channel (a squeeze-excite gate), then the bias and a residual."""
    x = random_array(seed, (n, c, pixels, 1), np.float32, -4, 4)
    w = with_specials(random_array(seed + 1, (m, c, 1, 1), np.float32, -1, 1), seed, SPECIALS)
    b = random_array(seed + 2, (m,), np.float32)
    scale = random_array(seed + 3, (1, c, 1, 1), np.float32, 0, 1)
    r = with_specials(random_array(seed + 4, (n, m, pixels, 1), np.float32), seed, SPECIALS)
    attrs = {"group": 1, "kernel_shape": (1, 1), "input_scale": 3,
             **(encode([Step(residual, operand=4)]) if residual else {})}
    assert_lean_equals_general([x, w, b if bias else None, scale, r], attrs, (n, m, pixels, 1),
                               planned=True)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 12), mult=st.integers(1, 2),
       k=st.sampled_from([3, 5]), s=st.integers(1, 2), size=st.integers(0, 10),
       epilogue=st.sampled_from(EPILOGUES), seed=seeds)
def test_a_lean_depthwise_conv_gives_the_bits_of_the_general_path(n, c, mult, k, s, size,
                                                                  epilogue, seed):
    """Output planes of 14x14 and more (28x28 at stride 2) run on phase-split planes; one input
    channel is group 1, an ordinary convolution (an image stem), which this does not take."""
    size += 14 * s
    x = with_specials(random_array(seed, (n, c, size * s, size * s), np.float32, -4, 4), seed,
                      SPECIALS)
    w = random_array(seed + 1, (c * mult, 1, k, k), np.float32, -1, 1)
    b = random_array(seed + 2, (c * mult,), np.float32)
    attrs = {"group": c, "kernel_shape": (k, k), "strides": (s, s), "pads": (k // 2,) * 4,
             **epilogue}
    out = (size * s + 2 * (k // 2) - k) // s + 1
    assert_lean_equals_general([x, w, b], attrs, (n, c * mult, out, out), planned=c > 1)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(2, 40), k=st.sampled_from([1, 3, 5]),
       s=st.integers(1, 2), size=st.integers(3, 13), epilogue=st.sampled_from(EPILOGUES),
       special=st.sampled_from([None, np.inf, np.nan]), seed=seeds)
def test_a_lean_channels_last_depthwise_conv_gives_the_bits_of_the_general_path(
        n, c, k, s, size, epilogue, special, seed):
    """Planes below 14x14 outputs (28x28 at stride 2) run channels-last, whatever the weights
    (that loop skips padded taps, so non-finite weights stay on it)."""
    x = with_specials(random_array(seed, (n, c, size, size), np.float32, -4, 4), seed, SPECIALS)
    w = random_array(seed + 1, (c, 1, k, k), np.float32, -1, 1)
    if special is not None:
        w[seed % c, 0, 0, 0] = special
    b = random_array(seed + 2, (c,), np.float32)
    attrs = {"group": c, "kernel_shape": (k, k), "strides": (s, s), "pads": (k // 2,) * 4,
             **epilogue}
    out = (size + 2 * (k // 2) - k) // s + 1
    assert_lean_equals_general([x, w, b], attrs, (n, c, out, out), planned=True)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 40), m=st.integers(1, 40), h=st.integers(1, 20),
       stride=st.integers(1, 3), relu=st.booleans(), seed=seeds)
def test_a_lean_resnet_block_end_gives_the_bits_of_the_unprepared_conv(n, c, m, h, stride, relu,
                                                                       seed):
    """A ResNet block's last 1x1 convolution, strided (its pixels gathered each run into a
    buffer made once) or not, with its bias, the residual Add and perhaps the Relu: what the
    general path's pieces give one after another, run after run."""
    inputs, attrs, out = resnet_block_end(seed, n, c, m, h, stride, relu, SPECIALS)
    x = inputs[0]
    _, lean, (_, got), was = launches(inputs, attrs, out)
    assert was
    for _ in range(2):
        got.fill(np.nan)
        with np.errstate(all="ignore"):
            lean()
        np.testing.assert_array_equal(got, unprepared_conv(inputs, attrs))
        x *= -1  # new contents, the same arrays


def test_what_the_lean_closures_leave_to_the_general_path() -> None:
    """A broadcast residual, a depthwise
    convolution with a channel multiplier on small planes, planar or with a scaled input,
    float16, and no output buffer."""
    x, w1 = np.zeros((1, 8, 28, 28), np.float32), np.zeros((4, 8, 1, 1), np.float32)
    wd, b = np.zeros((8, 1, 3, 3), np.float32), np.zeros(8, np.float32)
    one, dw = {"group": 1, "kernel_shape": (1, 1)}, {"group": 8, "pads": (1, 1, 1, 1)}

    def lean(inputs, attrs, shape, dtype=np.float32, *, into=True):
        planned = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(conv_lean, "plan", lambda *a, p=conv_lean.plan:
                       planned.append(p(*a)) or planned[-1])
            prepare_conv(inputs, attrs, [np.zeros(shape, dtype)] if into else None)
        return planned[0] is not None

    assert lean([x, w1, b[:4]], one, (1, 4, 28, 28))
    assert lean([x, wd, b], dw, (1, 8, 28, 28))
    assert lean([x, w1, b[:4]], {**one, "strides": (2, 2)}, (1, 4, 14, 14))  # gathered pixels
    assert not lean([x, w1, b[:4], np.zeros((1, 4, 1, 1), np.float32)],
                    {**one, **encode([Step("Add", operand=3)])}, (1, 4, 28, 28))
    small = np.zeros((1, 8, 13, 13), np.float32)
    assert lean([small, wd, b], dw, (1, 8, 13, 13))  # channels-last
    assert not lean([small, np.zeros((16, 1, 3, 3), np.float32), np.zeros(16, np.float32)], dw,
                    (1, 16, 13, 13))  # a channel multiplier
    large = np.zeros((1, 8, 56, 56), np.float32)
    assert not lean([large, np.zeros((8, 1, 7, 7), np.float32), b], {**dw, "pads": (3,) * 4},
                    (1, 8, 56, 56))  # planar
    assert not lean([x, wd, b, np.ones((1, 8, 1, 1), np.float32)], {**dw, "input_scale": 3},
                    (1, 8, 28, 28))
    assert not lean([x.astype(np.float16), w1.astype(np.float16), b[:4].astype(np.float16)],
                    one, (1, 4, 28, 28), np.float16)
    assert not lean([x, w1, b[:4]], one, (1, 4, 28, 28), into=False)


def test_non_finite_depthwise_weights_take_the_general_path() -> None:
    """Phase-split planes multiply the padding by the weights; with an inf weight the run goes
    the general way (the loop skipping padded taps), whose bits the lean launch then gives."""
    inputs, attrs, shape = non_finite_depthwise_case()
    w = inputs[1]
    general, lean, (want, got), was = launches(inputs, attrs, shape)
    assert was
    w[2, 0, 0, 0] = np.inf  # a value of this run, after planning
    with np.errstate(all="ignore"):
        general()
        lean()
    np.testing.assert_array_equal(got, want)
    assert np.isinf(got[0, 2]).any()
