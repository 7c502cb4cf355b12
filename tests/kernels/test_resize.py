"""Resize and Upsample kernels against onnxruntime, over generated scales, sizes and modes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim.errors import KernelError
from tests.kernels import FLOATS, check_against_ort, random_array, run_kernel, seeds

F = np.float32
EMPTY = np.zeros(0, F)
TRANSFORMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
              "asymmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [0.25, 0.5, 0.6, 0.75, 1.0, 1.5, 1.7, 2.0, 3.0]


@st.composite
def resize_case(draw: st.DrawFn, mode: str) -> tuple[tuple[int, ...], list, dict]:
    """A 4-D NCHW input shape, Resize inputs after X (roi, scales, sizes) and attributes."""
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 7)),
             draw(st.integers(1, 7)))
    attrs = {"mode": mode, "coordinate_transformation_mode": draw(st.sampled_from(TRANSFORMS))}
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(NEAREST))
    if draw(st.booleans()):
        hw = [draw(st.sampled_from(SCALES)) for _ in range(2)]
        if any(int(np.float32(s) * np.float32(d)) < 1 for s, d in zip(hw, shape[2:],
                                                                     strict=True)):
            hw = [1.0, 1.0]
        return shape, [EMPTY, np.array([1, 1, *hw], F)], attrs
    sizes = [shape[0], shape[1], draw(st.integers(1, 12)), draw(st.integers(1, 12))]
    return shape, [EMPTY, None, np.array(sizes, np.int64)], attrs


@settings(max_examples=40, deadline=None)
@given(case=resize_case("nearest"), seed=seeds, dtype=st.sampled_from(
    FLOATS + (np.dtype(np.int8), np.dtype(np.uint8))))
def test_nearest_matches_ort(case, seed, dtype):
    shape, rest, attrs = case
    x = random_array(seed, shape, dtype, -100, 100)
    check_against_ort("Resize", [x, *rest], attrs, opset=19)


def _ort_nearest(transform: str, nearest: str):
    """onnxruntime's Resize of a (1, 1, 1, W) input by ``sizes``, both given per run: one
    session for every length and size."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode=transform, nearest_mode=nearest)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, "w"]),
                      helper.make_tensor_value_info("sizes", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda x, sizes: session.run(None, {"x": x, "sizes": sizes})[0]


@pytest.mark.parametrize("nearest", ["round_prefer_ceil", "round_prefer_floor"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_nearest_halves_match_ort_for_every_length_and_size(transform, nearest):
    """Coordinates that are a half in exact arithmetic come out of float32 a little off it
    (7 / (2/7) is 3.4999998): onnxruntime still rounds them as halves, and so must we. Every
    input length and output size up to 32, the input's values its indices."""
    theirs = _ort_nearest(transform, nearest)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": transform,
             "nearest_mode": nearest}
    for w in range(1, 33):
        x = np.arange(w, dtype=F).reshape(1, 1, 1, w)
        for out in range(1, 33):
            sizes = np.array([1, 1, 1, out], np.int64)
            ours = run_kernel("Resize", [x, EMPTY, None, sizes], attrs)[0]
            np.testing.assert_array_equal(ours, theirs(x, sizes), err_msg=f"{w} -> {out}")


@settings(max_examples=40, deadline=None)
@given(case=resize_case("linear"), seed=seeds, dtype=st.sampled_from(FLOATS))
def test_linear_matches_ort(case, seed, dtype):
    shape, rest, attrs = case
    check_against_ort("Resize", [random_array(seed, shape, dtype), *rest], attrs, opset=19)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("roi", [[0, 0, 0.2, 0.1, 1, 1, 0.9, 1.2], [0, 0, 0, 0, 1, 1, 1, 1]])
def test_crop_and_resize_matches_ort(mode, roi):
    x = random_array(3, (1, 2, 5, 7), F)
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": -3.0}
    check_against_ort("Resize", [x, np.array(roi, F), np.array([1, 1, 2, 1.5], F)], attrs,
                      opset=19)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
@pytest.mark.parametrize("axes", [[2, 3], [3, 2]])
def test_keep_aspect_ratio_with_axes_matches_ort(policy, axes):
    x = random_array(4, (1, 2, 5, 7), F)
    attrs = {"mode": "linear", "axes": axes, "keep_aspect_ratio_policy": policy}
    check_against_ort("Resize", [x, EMPTY, None, np.array([9, 4], np.int64)], attrs, opset=19)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 0.5, 0.6], [1, 1, 2.5, 1.5]])
def test_opset10_scales_input_matches_ort(mode, scales):
    """Resize-10 takes (X, scales): asymmetric coordinates, the old nearest rounding."""
    x = random_array(5, (1, 2, 5, 7), F)
    check_against_ort("Resize", [x, np.array(scales, F)], {"mode": mode}, opset=10)


def test_upsample_takes_scales_as_input_and_attribute():
    x = random_array(6, (1, 2, 3, 4), F)
    (by_input,) = check_against_ort("Upsample", [x, np.array([1, 1, 2, 3], F)], {}, opset=9)
    (by_attr,) = run_kernel("Upsample", [x], {"scales": (1.0, 1.0, 2.0, 3.0)})
    np.testing.assert_array_equal(by_input, by_attr)


X = np.zeros((1, 2, 4, 4), F)
BAD = [
    ([X, EMPTY, np.array([1, 1, 2, 2], F)], {"mode": "cubic"}, "mode=cubic not supported"),
    ([X, EMPTY, np.array([1, 1, 2], F)], {}, "scales"),
    ([X, EMPTY, np.array([1, 1, -2, 2], F)], {}, "positive"),
    ([X, EMPTY, None, np.array([1, 2, 0, 3], np.int64)], {}, "sizes"),
    ([X, EMPTY], {}, "scales or sizes"),
    ([X, EMPTY, None, None], {}, "scales or sizes"),
    ([X, EMPTY, np.array([1, 1, 2, 2], F)], {"coordinate_transformation_mode": "bogus"},
     "coordinate_transformation_mode"),
    ([X, EMPTY, np.array([1, 1, 2, 2], F)], {"nearest_mode": "round"}, "nearest_mode"),
    ([X, EMPTY, np.array([1, 1, 2, 2], F)], {"antialias": 1}, "antialias"),
    ([X, EMPTY, np.array([1, 1, 2, 2], F)], {"mode": "linear",
                                             "coordinate_transformation_mode":
                                             "tf_crop_and_resize"}, "roi"),
    ([X, EMPTY, np.array([1, 2], F)], {"axes": [2, 2]}, "axes"),
    ([X.astype(np.int8), EMPTY, np.array([1, 1, 2, 2], F)], {"mode": "linear"}, "float"),
]


@pytest.mark.parametrize("inputs, attrs, words", BAD, ids=[b[2] for b in BAD])
def test_rejects_bad_input(inputs, attrs, words):
    with pytest.raises(KernelError, match=words):
        run_kernel("Resize", inputs, attrs)
