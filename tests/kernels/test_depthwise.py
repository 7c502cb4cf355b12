"""The depthwise convolution, channels-last and planar, against onnxruntime: generated shapes
(channel multipliers, strides, dilations, pads, 1-3 spatial dims), the mobile nets' layer shapes,
whole and split over the kernels' thread pool, and both sides of the planar rule's boundary."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.kernels import check_against_ort, random_array, seeds


@st.composite
def depthwise_case(draw: st.DrawFn) -> tuple[list, dict]:
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    c = draw(st.integers(1, 20))
    mult = draw(st.integers(1, 3))
    spatial = draw(st.lists(st.integers(3, 9 if rank < 3 else 5), min_size=rank, max_size=rank))
    kernel = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
    attrs = {"group": c,
             "strides": draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank)),
             "dilations": draw(st.lists(st.integers(1, 2), min_size=rank, max_size=rank)),
             "pads": draw(st.lists(st.integers(0, 2), min_size=2 * rank, max_size=2 * rank))}
    for i in range(rank):  # the dilated window fits in the padded input
        assume((kernel[i] - 1) * attrs["dilations"][i] + 1
               <= spatial[i] + attrs["pads"][i] + attrs["pads"][i + rank])
    shapes = [(draw(st.integers(1, 2)), c, *spatial), (c * mult, 1, *kernel)]
    if draw(st.booleans()):
        shapes.append((c * mult,))
    return shapes, attrs


@settings(max_examples=30, deadline=None)
@given(case=depthwise_case(), seed=seeds)
def test_depthwise_matches_onnxruntime(case, seed):
    shapes, attrs = case
    inputs = [random_array(seed + i, s, np.float32, -1, 1) for i, s in enumerate(shapes)]
    check_against_ort("Conv", inputs, attrs)


@settings(max_examples=30, deadline=None)
@given(case=depthwise_case(), seed=seeds)
def test_planar_loop_matches_onnxruntime(case, seed):
    """The planar loop on every generated shape (the rule picks it only for large planes)."""
    from npu_sim.kernels import depthwise
    shapes, attrs = case
    inputs = [random_array(seed + i, s, np.float32, -1, 1) for i, s in enumerate(shapes)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(depthwise, "planar", lambda c, pixels, stride_w: True)
        check_against_ort("Conv", inputs, attrs)


@pytest.mark.parametrize("shape, kernel, stride", [
    ((1, 96, 112, 112), 3, 2),  # split over rows
    ((1, 240, 28, 28), 5, 1),   # split over rows
    ((1, 16, 40, 40), 3, 1),    # whole
])
def test_mobile_net_layers_match_onnxruntime(shape, kernel, stride):
    c = shape[1]
    x = random_array(1, shape, np.float32, -1, 1)
    w = random_array(2, (c, 1, kernel, kernel), np.float32, -1, 1)
    b = random_array(3, (c,), np.float32, -1, 1)
    attrs = {"group": c, "strides": [stride, stride], "pads": [kernel // 2] * 4}
    check_against_ort("Conv", [x, w, b], attrs)


@pytest.mark.parametrize("channels, mult, size, stride, kernel, planar", [
    (32, 1, 56, 1, 3, True),    # at the channel and plane limits: planar
    (16, 2, 112, 1, 3, True),   # large plane, channel multiplier, split over rows: planar
    (33, 1, 56, 1, 3, False),   # one channel too many: channels-last
    (32, 1, 55, 1, 3, False),   # one row and column too few: channels-last
    (16, 1, 112, 2, 3, False),  # strided rows: channels-last
    (24, 1, 60, 1, 5, True),    # 5x5, wider than the plane limit: planar
])
def test_planar_rule_matches_onnxruntime_and_channels_last_bits(
        channels, mult, size, stride, kernel, planar, monkeypatch):
    """Both sides of :func:`depthwise.planar`'s boundary agree with onnxruntime, and the planar
    loop gives the channels-last loop's bits (bias and all) where the rule picks it."""
    from npu_sim.kernels import depthwise
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    assert depthwise.planar(channels, out * out, stride) is planar
    x = random_array(4, (1, channels, size, size), np.float32, -1, 1)
    w = random_array(5, (channels * mult, 1, kernel, kernel), np.float32, -1, 1)
    b = random_array(6, (channels * mult,), np.float32, -1, 1)
    attrs = {"group": channels, "strides": [stride, stride], "pads": [kernel // 2] * 4}
    chosen = check_against_ort("Conv", [x, w, b], attrs)[0]
    monkeypatch.setattr(depthwise, "planar", lambda c, pixels, stride_w: not planar)
    other = check_against_ort("Conv", [x, w, b], attrs)[0]
    np.testing.assert_array_equal(chosen, other)


@st.composite
def tapped_case(draw: st.DrawFn) -> tuple[list, dict]:
    """2-D square 3x3 or 5x5 kernels at equal strides 1-3 (3 exercises the split's general
    path), asymmetric pads, odd and even sizes, channel multipliers, N up to 2, with bias."""
    k = draw(st.sampled_from([3, 5]))
    s = draw(st.integers(1, 3))
    c, mult = draw(st.integers(1, 6)), draw(st.integers(1, 2))
    pads = draw(st.lists(st.integers(0, k), min_size=4, max_size=4))
    h = draw(st.integers(max(1, k - pads[0] - pads[2]), 23))
    w = draw(st.integers(max(1, k - pads[1] - pads[3]), 23))
    shapes = [(draw(st.integers(1, 2)), c, h, w), (c * mult, 1, k, k), (c * mult,)]
    return shapes, {"group": c, "strides": [s, s], "pads": pads}


@settings(max_examples=40, deadline=None)
@given(case=tapped_case(), seed=seeds)
def test_tapped_planes_match_onnxruntime_and_channels_last_bits(case, seed):
    """The phase-split loop on every generated shape (the rule picks it only for large planes)
    agrees with onnxruntime and gives the channels-last loop's bits."""
    from npu_sim.kernels import depthwise
    shapes, attrs = case
    inputs = [random_array(seed + i, s, np.float32, -1, 1) for i, s in enumerate(shapes)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(depthwise, "TAPPED_PIXELS", 0)
        chosen = check_against_ort("Conv", inputs, attrs)[0]
        patch.setattr(depthwise, "tapped", lambda *args: False)
        patch.setattr(depthwise, "planar", lambda c, pixels, stride_w: False)
        other = check_against_ort("Conv", inputs, attrs)[0]
    np.testing.assert_array_equal(chosen, other)


@pytest.mark.parametrize("channels, size, kernel, stride, tapped", [
    (8, 14, 5, 1, True),     # 14x14 output at stride 1: at the limit
    (8, 13, 5, 1, False),    # 13x13: channels-last
    (6, 56, 3, 2, True),     # 28x28 output at stride 2: at the limit
    (6, 54, 3, 2, False),    # 27x27: channels-last
    (16, 111, 3, 2, True),   # odd size, 56x56 output
    (4, 57, 5, 2, True),     # odd size, 5x5, 29x29 output
])
def test_tapped_rule_matches_onnxruntime_and_channels_last_bits(
        channels, size, kernel, stride, tapped, monkeypatch):
    """Both sides of :func:`depthwise.tapped`'s boundary agree with onnxruntime, and the other
    loop gives the same bits."""
    from npu_sim.kernels import depthwise
    out = (size + 2 * (kernel // 2) - kernel) // stride + 1
    x = random_array(7, (2, channels, size, size), np.float32, -1, 1)
    w = random_array(8, (channels, 1, kernel, kernel), np.float32, -1, 1)
    b = random_array(9, (channels,), np.float32, -1, 1)
    st3, di3 = np.array([1, stride, stride]), np.ones(3, np.int64)
    pb3 = np.array([0, kernel // 2, kernel // 2])
    assert depthwise.tapped(x[:, :, None], w[:, :, None], st3, di3, pb3, (1, out, out)) is tapped
    attrs = {"group": channels, "strides": [stride, stride], "pads": [kernel // 2] * 4}
    chosen = check_against_ort("Conv", [x, w, b], attrs)[0]
    monkeypatch.setattr(depthwise, "tapped", lambda *args: not tapped)
    other = check_against_ort("Conv", [x, w, b], attrs)[0]
    np.testing.assert_array_equal(chosen, other)


@pytest.mark.parametrize("special", [np.inf, -np.inf, np.nan])
def test_non_finite_weights_keep_the_loops_that_skip_padding(special):
    """The phase-split loop multiplies padding by the weights (``inf * 0`` is NaN), so a plane
    with a non-finite weight runs the loops that skip padded taps, as before: the planar loop
    here, whose bits the channels-last loop gives too; the finite channels agree with
    onnxruntime."""
    from npu_sim.kernels import depthwise
    from npu_sim.kernels.conv import conv
    x = random_array(10, (1, 4, 56, 56), np.float32, -1, 1)
    w = random_array(11, (4, 1, 3, 3), np.float32, -1, 1)
    st3, di3, pb3 = np.array([1, 1, 1]), np.ones(3, np.int64), np.array([0, 1, 1])
    assert depthwise.tapped(x[:, :, None], w[:, :, None], st3, di3, pb3, (1, 56, 56))
    w[1, 0, 0, 0] = special
    assert not depthwise.tapped(x[:, :, None], w[:, :, None], st3, di3, pb3, (1, 56, 56))
    assert depthwise.planar(4, 56 * 56, 1)
    attrs = {"group": 4, "pads": [1, 1, 1, 1]}
    got = conv([x, w], attrs)[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(depthwise, "planar", lambda c, pixels, stride_w: False)
        want = conv([x, w], attrs)[0]
    np.testing.assert_array_equal(got, want)
    finite = [0, 2, 3]
    check_against_ort("Conv", [x[:, finite], w[finite]], {"group": 3, "pads": [1, 1, 1, 1]})
    np.testing.assert_array_equal(got[:, finite], conv([x[:, finite], w[finite]],
                                                       {"group": 3, "pads": [1, 1, 1, 1]})[0])


@pytest.mark.parametrize("pads, strides", [
    ([1, 1, 1, 0, 1, 1], [1, 1, 1]),  # depth padding: three output slices, two of padding
    ([1, 1, 1, 0, 1, 1], [2, 1, 1]),  # one output slice, which reads only the depth padding
])
def test_one_deep_3d_convolutions_with_depth_padding_match_onnxruntime(pads, strides):
    """A 3-D convolution of one depth slice with a depth-1 kernel looks 2-D to the phase-split
    loop's rule, but its depth padding makes output slices of padding only: the general loops
    run it."""
    from npu_sim.kernels import depthwise
    x = random_array(12, (1, 4, 1, 16, 16), np.float32, -1, 1)
    w = random_array(13, (4, 1, 1, 3, 3), np.float32, -1, 1)
    b = random_array(14, (4,), np.float32, -1, 1)
    out_d = (1 + pads[0] + pads[3] - 1) // strides[0] + 1
    assert not depthwise.tapped(x, w, np.array(strides), np.ones(3, np.int64),
                                np.array(pads[:3]), (out_d, 16, 16))
    check_against_ort("Conv", [x, w, b], {"group": 4, "pads": pads, "strides": strides})
