"""The direct convolution of few input channels (image stems, :func:`npu_sim.kernels.taps.direct`)
against onnxruntime: generated shapes (1-4 channels, 3x3 and 5x5, strides 1-3, asymmetric pads,
odd sizes, N up to 3, bias), both sides of the dispatch rule and non-finite weights. Its sums
run in (channel, j, l) order, the im2col row order, but not the GEMM's blocking, so the unfold
path is a tolerance away, not the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.kernels import conv
from tests.kernels import check_against_ort, random_array, seeds


@st.composite
def stem_case(draw: st.DrawFn) -> tuple[list, dict]:
    k = draw(st.sampled_from([3, 5]))
    s = draw(st.integers(1, 3))
    c, m = draw(st.integers(1, conv.DIRECT_CHANNELS)), draw(st.integers(1, 8))
    pads = draw(st.lists(st.integers(0, k), min_size=4, max_size=4))
    h = draw(st.integers(max(1, k - pads[0] - pads[2]), 30))
    w = draw(st.integers(max(1, k - pads[1] - pads[3]), 30))
    shapes = [(draw(st.integers(1, 3)), c, h, w), (m, c, k, k)]
    if draw(st.booleans()):
        shapes.append((m,))
    return shapes, {"strides": [s, s], "pads": pads}


@settings(max_examples=40, deadline=None)
@given(case=stem_case(), seed=seeds)
def test_direct_conv_matches_onnxruntime(case, seed):
    shapes, attrs = case
    inputs = [random_array(seed + i, s, np.float32, -1, 1) for i, s in enumerate(shapes)]
    _, win = conv.geometry(shapes[0], shapes[1], attrs)
    assert conv.direct_fits(shapes[0][1], shapes[1], win, np.dtype(np.float32))
    check_against_ort("Conv", inputs, attrs)


@pytest.mark.parametrize("c, kernel, attrs, direct", [
    (3, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, True),    # MobileNet-V3's stem
    (4, 5, {"strides": [1, 1], "pads": [2, 2, 2, 2]}, True),    # at the channel limit
    (5, 3, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, False),   # one channel too many
    (3, 7, {"strides": [2, 2], "pads": [3, 3, 3, 3]}, False),   # 7x7 (ResNet's stem)
    (3, 3, {"strides": [2, 1], "pads": [1, 1, 1, 1]}, False),   # unequal strides
    (3, 3, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}, False),  # dilated
])
def test_direct_rule_matches_onnxruntime_on_both_sides(c, kernel, attrs, direct, monkeypatch):
    """Where the rule picks the direct loop, the unfold and GEMM give the same values within
    float32's tolerance."""
    x = random_array(1, (2, c, 57, 57), np.float32, -1, 1)
    w = random_array(2, (16, c, kernel, kernel), np.float32, -1, 1)
    b = random_array(3, (16,), np.float32, -1, 1)
    _, win = conv.geometry(x.shape, w.shape, attrs)
    assert conv.direct_fits(c, w.shape, win, np.dtype(np.float32)) is direct
    chosen = check_against_ort("Conv", [x, w, b], attrs)[0]
    if direct:
        monkeypatch.setattr(conv, "direct_fits", lambda *args: False)
        other = check_against_ort("Conv", [x, w, b], attrs)[0]
        np.testing.assert_allclose(chosen, other, rtol=1e-4, atol=1e-5)


def test_conv_integer_stem_is_exact_in_float64():
    """ConvInteger computes in float64 (exact integer sums), which the direct loop takes too."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (2, 3, 33, 31), dtype=np.uint8)
    w = rng.integers(0, 256, (8, 3, 3, 3), dtype=np.uint8)
    zx, zw = np.array(128, np.uint8), np.array(120, np.uint8)
    attrs = {"strides": [2, 2], "pads": [1, 0, 1, 2]}
    _, win = conv.geometry(x.shape, w.shape, attrs)
    assert conv.direct_fits(3, w.shape, win, np.dtype(np.float64))
    check_against_ort("ConvInteger", [x, w, zx, zw], attrs)


@pytest.mark.parametrize("special", [np.inf, np.nan])
def test_non_finite_weights_match_onnxruntime(special):
    """Padding is multiplied as zeros, as onnxruntime does: ``inf * 0`` is NaN at the border."""
    from tests.kernels import assert_matches, ort_reference, run_kernel
    x = random_array(9, (1, 3, 20, 20), np.float32, -1, 1)
    w = random_array(10, (4, 3, 3, 3), np.float32, -1, 1)
    w[1, 2, 0, 0] = special
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    expected = ort_reference("Conv", [x, w], attrs, 1, 17, (), True, ())
    actual = run_kernel("Conv", [x, w], attrs)
    np.testing.assert_array_equal(np.isnan(actual[0]), np.isnan(expected[0]))
    assert_matches(actual, expected)


def test_four_output_channels_at_once_give_each_channels_bits():
    """A 3x3 kernel's output channels run four at a time (:func:`.taps.acc3x4`), the rest one
    at a time: every channel gets the bits it gets alone."""
    x = random_array(11, (2, 3, 31, 29), np.float32, -1, 1)
    w = random_array(12, (7, 3, 3, 3), np.float32, -1, 1)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1]}
    together = check_against_ort("Conv", [x, w], attrs)[0]
    for m in range(7):
        alone = conv.conv([x, w[m:m + 1]], attrs)[0]
        np.testing.assert_array_equal(together[:, m:m + 1], alone)
