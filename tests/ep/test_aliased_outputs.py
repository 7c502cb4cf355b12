"""Partitions whose outputs alias each other, an input or an initializer load and run.

Exporters emit these: ``Identity`` of an initializer (tied weights), ``Dropout`` in inference,
``Reshape``/``Unsqueeze`` of a tensor that is itself a graph output. onnxruntime runs them; so
must the NPU, whether the alias is a graph output or crosses into a CPU partition.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ep
from tests.ep.npusim_graphs import model

F = TensorProto.FLOAT
W = np.arange(6, dtype=np.float32).reshape(2, 3)


def aliasing_model(cpu_consumer: bool):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["y"]),
        helper.make_node("Identity", ["W"], ["w_out"]),
        helper.make_node("Dropout", ["r"], ["d"]),
        helper.make_node("Unsqueeze", ["d", "axes"], ["u"]),
        helper.make_node("Add", ["r", "W"], ["z"]),
    ]
    outputs = [("r", F, [2, 3]), ("y", F, [3, 2]), ("w_out", F, [2, 3]), ("d", F, [2, 3]),
               ("u", F, [1, 2, 3]), ("z", F, [2, 3])]
    if cpu_consumer:  # TopK stays on the CPU: the aliased tensors cross a partition boundary
        nodes.append(helper.make_node("TopK", ["y", "k"], ["top", "top_i"], axis=1))
        outputs += [("top", F, [3, 1]), ("top_i", TensorProto.INT64, [3, 1])]
    inits = {"W": W, "shape": np.array([3, 2], np.int64), "axes": np.array([0], np.int64),
             "k": np.array([1], np.int64)}
    return model(nodes, [("x", F, [2, 3])], outputs, inits)


@pytest.mark.parametrize("level", [ep.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   ep.GraphOptimizationLevel.ORT_ENABLE_ALL])
@pytest.mark.parametrize("cpu_consumer", [False, True])
def test_aliased_partition_outputs_match_onnxruntime(cpu_consumer, level):
    """With optimizations off the aliases reach the NPU as written; with them on, onnxruntime's
    basic optimizations remove what they can first (a Dropout feeding only an Unsqueeze)."""
    m = aliasing_model(cpu_consumer).SerializeToString()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    so = ep.SessionOptions()
    so.graph_optimization_level = level
    session = ep.InferenceSession(m, so, providers=["NpuSimExecutionProvider"])
    placed = {n: p for n, p in session.get_node_assignment().items() if not n.startswith("TopK")}
    assert set(placed.values()) == {"NpuSimExecutionProvider"}, placed
    expected = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, want in zip(session.run(None, {"x": x}), expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
