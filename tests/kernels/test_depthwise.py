"""The channels-last depthwise convolution against onnxruntime: generated shapes (channel
multipliers, strides, dilations, pads, 1-3 spatial dims), and the mobile nets' layer shapes,
whole and split over the kernels' thread pool."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kernels import check_against_ort, random_array, seeds


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
