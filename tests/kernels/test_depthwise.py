"""The depthwise convolution's two loops (channels-last and planar) against onnxruntime.

:func:`npu_sim.kernels.depthwise.channels_last` picks a loop by shape; these tests force each
loop in turn on generated shapes (channel multipliers, strides, dilations, pads, 1-3 spatial
dims) and check both the onnxruntime match and that the two loops give the same bits (they do
the same multiply-adds in the same order). Large cases run split over the kernels' thread pool.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import check_against_ort, random_array, seeds
from npu_sim.kernels import depthwise


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
    shapes = [(draw(st.integers(1, 2)), c, *spatial), (c * mult, 1, *kernel)]
    if draw(st.booleans()):
        shapes.append((c * mult,))
    return shapes, attrs


def _loop(mp: pytest.MonkeyPatch, last: bool) -> None:
    mp.setattr(depthwise, "channels_last", lambda channels, width: last)


@settings(max_examples=30, deadline=None)
@given(case=depthwise_case(), seed=seeds)
def test_both_loops_match_onnxruntime_and_each_other(case, seed):
    shapes, attrs = case
    inputs = [random_array(seed + i, s, np.float32, -1, 1) for i, s in enumerate(shapes)]
    outputs = []
    with pytest.MonkeyPatch.context() as mp:
        for last in (True, False):
            _loop(mp, last)
            outputs.append(check_against_ort("Conv", inputs, attrs)[0])
    np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize("shape, kernel, stride", [
    ((1, 96, 112, 112), 3, 2),  # planar, split over channels
    ((1, 240, 28, 28), 5, 1),   # channels-last, split over rows
    ((1, 16, 40, 40), 3, 1),    # channels-last, whole
])
def test_mobile_net_layers_match_onnxruntime(shape, kernel, stride):
    c = shape[1]
    x = random_array(1, shape, np.float32, -1, 1)
    w = random_array(2, (c, 1, kernel, kernel), np.float32, -1, 1)
    b = random_array(3, (c,), np.float32, -1, 1)
    attrs = {"group": c, "strides": [stride, stride], "pads": [kernel // 2] * 4}
    check_against_ort("Conv", [x, w, b], attrs)
