"""Sin, Cos, Floor, Ceil, Round, ArgMax, ArgMin and Shape against onnxruntime, with NaN,
infinities, ties and negative axes; and the NPU taking them in a session."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ep
from tests.kernels import check_like_ort, random_array, seeds, shapes, with_specials

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.5, 1.5, 2.5, -0.5, -2.5, 0.0], np.float32)


@settings(max_examples=30)
@given(op=st.sampled_from(["Sin", "Cos", "Floor", "Ceil", "Round"]), shape=shapes(),
       dtype=st.sampled_from([np.float32, np.float16]), seed=seeds)
def test_unary_math_matches_ort(op, shape, dtype, seed):
    x = with_specials(random_array(seed, shape, dtype, -50, 50), seed, SPECIAL)
    assert check_like_ort(op, [x], opset=13) is not None


@settings(max_examples=40)
@given(op=st.sampled_from(["ArgMax", "ArgMin"]), shape=shapes(min_dims=1), data=st.data(),
       dtype=st.sampled_from([np.float32, np.int32, np.int64, np.uint8]), seed=seeds,
       keepdims=st.sampled_from([0, 1]), last=st.sampled_from([0, 1]))
def test_arg_extremes_match_ort(op, shape, data, dtype, seed, keepdims, last):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = random_array(seed, shape, dtype, 0, 3)  # small range: many ties
    if x.dtype.kind == "f":
        x = with_specials(x, seed, SPECIAL)  # NaN never wins unless first, as onnxruntime scans
    attrs = {"axis": axis, "keepdims": keepdims, "select_last_index": last}
    assert check_like_ort(op, [x], attrs, opset=13) is not None


@pytest.mark.parametrize(("start", "end"), [(None, None), (1, None), (-2, None), (0, -1),
                                            (5, 9), (-9, 1)])
def test_shape_matches_ort(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    assert check_like_ort("Shape", [np.zeros((2, 3, 0, 4), np.float32)], attrs,
                          opset=15) is not None


def test_the_npu_takes_them_and_matches_onnxruntime():
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Floor", ["s"], ["f"]),
             helper.make_node("Round", ["x"], ["r"]), helper.make_node("Add", ["f", "r"], ["y"]),
             helper.make_node("ArgMax", ["y"], ["i"], axis=1, keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [3, 5])],
                              [helper.make_tensor_value_info("y", f, [3, 5]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8).SerializeToString()
    x = (np.random.default_rng(0).standard_normal((3, 5)) * 3).astype(np.float32)
    session = ep.InferenceSession(model, providers=["NpuSimExecutionProvider"])
    assert set(session.get_node_assignment().values()) == {"NpuSimExecutionProvider"}
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, ref in zip(session.run(None, {"x": x}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)

