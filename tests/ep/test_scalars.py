"""Rank-0 tensors keep rank 0 through the NPU: compile-time scalars (Constant nodes, Identity of
a scalar initializer, all-constant ops), scalar graph outputs, and Unsqueeze of a scalar.

numpy's ``ascontiguousarray`` turns a 0-d array into shape (1,); a folded scalar used to come
out that way and fault kernels ("expected shape () got (1,)") or reach onnxruntime's CPU
partitions with the wrong rank. Each case runs with optimizations off (the NPU folds the raw
graph itself) and on, against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep

F = TensorProto.FLOAT


def scalar_model() -> bytes:
    two = helper.make_tensor("two", F, [], [2.0])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=two),
        helper.make_node("Identity", ["s"], ["s_copy"]),
        helper.make_node("Add", ["c", "s_copy"], ["k"]),            # folds to a scalar, 5.0
        helper.make_node("Div", ["x", "k"], ["scaled"]),
        helper.make_node("Equal", ["k", "c"], ["same"]),            # scalar bool output
        helper.make_node("Unsqueeze", ["k", "axes"], ["k1"]),       # rank 1, shape (1,)
        helper.make_node("Max", ["x", "k"], ["top"]),
        helper.make_node("Where", ["same", "x", "k"], ["picked"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),  # rank-0 output
    ]
    graph = helper.make_graph(
        nodes, "scalars", [helper.make_tensor_value_info("x", F, [2, 3])],
        [helper.make_tensor_value_info(n, t, None) for n, t in (
            ("scaled", F), ("same", TensorProto.BOOL), ("k1", F), ("top", F), ("picked", F),
            ("k", F), ("total", F))],
        [numpy_helper.from_array(np.array(3.0, np.float32), "s"),
         numpy_helper.from_array(np.array([0], np.int64), "axes")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


@pytest.mark.parametrize("level", [ep.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   ep.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_scalars_keep_rank_zero_like_onnxruntime(level) -> None:
    model = scalar_model()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    so = ep.SessionOptions()
    so.graph_optimization_level = level
    session = ep.InferenceSession(model, so, providers=["NpuSimExecutionProvider"])
    assert "NpuSimExecutionProvider" in set(session.get_node_assignment().values())
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = session.run(None, {"x": x})
    for name, g, w in zip([o.name for o in session.get_outputs()], got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=name)
