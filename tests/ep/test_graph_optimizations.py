"""onnxruntime's basic graph optimizations run before partitioning, as in ONNX Runtime.

The graph the providers see is what onnxruntime's own level-1 optimizer makes of the model
(shape arithmetic folded, redundant nodes gone), weights excepted: they are never folded or
copied, so no weight is stored twice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework.optimizer import WEIGHT_BYTES, optimize
from ep.npusim.binary import ContextBinary

NPU, CPU = "NpuSimExecutionProvider", "CPUExecutionProvider"
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def shape_chain_model() -> onnx.ModelProto:
    """What exporters emit for ``x.view(x.size(0), -1)``: Shape -> Gather -> Unsqueeze ->
    Concat -> Reshape, then a MatMul with a weight."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((12, 4))
                                .astype(np.float32), "W")
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("Identity", ["flat"], ["flat2"]),
        helper.make_node("MatMul", ["flat2", "W"], ["y"]),
    ]
    inits = [w, numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", F, [2, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def optimized_by_onnxruntime(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), so, providers=[CPU])
    return onnx.load(str(path))


def test_the_partitioned_graph_is_onnxruntimes_basic_optimization(tmp_path: Path) -> None:
    model = shape_chain_model()
    theirs = optimized_by_onnxruntime(model, tmp_path / "ort.onnx")
    ours = optimize(model, ep.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert [n.op_type for n in ours.graph.node] == [n.op_type for n in theirs.graph.node]
    assert "Shape" not in {n.op_type for n in ours.graph.node}
    assert optimize(model, ep.GraphOptimizationLevel.ORT_DISABLE_ALL) is model


@pytest.mark.parametrize("level", [ep.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   ep.GraphOptimizationLevel.ORT_ENABLE_BASIC])
def test_sessions_partition_the_graph_of_their_level(level) -> None:
    so = ep.SessionOptions()
    so.graph_optimization_level = level
    model = shape_chain_model().SerializeToString()
    session = ep.InferenceSession(model, so, providers=[NPU])
    ops = {n.split("_")[0] for n in session.get_node_assignment()}
    assert ("Shape" in ops) == (level == ep.GraphOptimizationLevel.ORT_DISABLE_ALL)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    want = ort.InferenceSession(model, providers=[CPU]).run(None, {"x": x})
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-5)


def tied_model(vocab: int = 300, dim: int = 16) -> onnx.ModelProto:
    """A tied embedding: Gather reads W, the output projection reads Transpose(W)."""
    w = np.random.default_rng(2).standard_normal((vocab, dim)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["W", "ids"], ["h"]),
             helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "Wt"], ["logits"])]
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("ids", I64, [1, 4])],
                              [helper.make_tensor_value_info("logits", F, [1, 4, vocab])],
                              [numpy_helper.from_array(w, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_folding_never_stores_a_weight_twice(tmp_path: Path) -> None:
    model = tied_model()
    theirs = optimized_by_onnxruntime(model, tmp_path / "ort.onnx")
    weight_bytes = sum(t.ByteSize() for t in model.graph.initializer)
    # onnxruntime alone keeps W and its folded transpose: twice the weights.
    assert sum(t.ByteSize() for t in theirs.graph.initializer) > 1.9 * weight_bytes
    ours = optimize(model, ep.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert [t.name for t in ours.graph.initializer] == ["W"]
    assert ours.graph.initializer[0].raw_data == model.graph.initializer[0].raw_data
    ids = np.array([[1, 5, 7, 299]], np.int64)
    session = ep.InferenceSession(ours.SerializeToString(), providers=[CPU])
    want = ort.InferenceSession(model.SerializeToString(), providers=[CPU]).run(None,
                                                                                 {"ids": ids})
    np.testing.assert_array_equal(session.run(None, {"ids": ids})[0], want[0])


def test_weights_come_back_as_the_same_initializers() -> None:
    model = tied_model(vocab=64)  # W: 64 x 16 float32 = 4 KiB, a weight
    assert model.graph.initializer[0].ByteSize() >= WEIGHT_BYTES
    ours = optimize(model, ep.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert [i.name for i in ours.graph.input] == ["ids"]
    assert ours.graph.initializer[0] == model.graph.initializer[0]
    assert {n.op_type for n in ours.graph.node} == {"Gather", "Transpose", "MatMul"}


def no_cpu_kernel_model() -> onnx.ModelProto:
    """``Tan`` of doubles, which onnxruntime's CPU provider has no kernel for."""
    graph = helper.make_graph(
        [helper.make_node("Tan", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_onnxruntime_cannot_load_is_partitioned_as_given() -> None:
    """onnxruntime cannot load it (``NOT_IMPLEMENTED``), but another provider may take the
    node: the model is partitioned as it is."""
    model = no_cpu_kernel_model()
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.NotImplemented):
        ort.InferenceSession(model.SerializeToString(), providers=[CPU])
    assert optimize(model, ep.GraphOptimizationLevel.ORT_ENABLE_ALL) is model


def test_a_model_onnxruntime_finds_invalid_is_refused_with_its_words() -> None:
    """An operator no schema has: onnxruntime refuses the graph before any provider sees it."""
    model = shape_chain_model()
    model.graph.node[-1].op_type = "NoSuchOp"
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(model.SerializeToString(), providers=[CPU])
    with pytest.raises(ep.InvalidGraph) as ours:
        optimize(model, ep.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert str(ours.value) == str(theirs.value)


def test_the_context_binary_stores_a_tied_weight_once(tmp_path: Path) -> None:
    """Gather reads W and the projection reads Transpose(W): the NPU multiplies by W with
    transB instead of folding the transpose into a second weight."""
    model = tied_model(vocab=512, dim=64)
    onnx.save(model, tmp_path / "tied.onnx")
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    session = ep.InferenceSession(str(tmp_path / "tied.onnx"), so, providers=[NPU])
    assert set(session.get_node_assignment().values()) == {NPU}
    w_bytes = 512 * 64 * 4
    with ContextBinary.open(tmp_path / "tied_npusim.bin") as binary:
        assert binary.weights_summary.distinct_bytes == w_bytes
    ids = np.array([[3, 1, 511, 0]], np.int64)
    want = ort.InferenceSession(str(tmp_path / "tied.onnx"), providers=[CPU]).run(
        None, {"ids": ids})
    for path in (tmp_path / "tied.onnx", tmp_path / "tied_ctx.onnx"):
        got = ep.InferenceSession(str(path), providers=[NPU]).run(None, {"ids": ids})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_a_transposed_weight_costs_what_the_weight_costs() -> None:
    from npu_sim import DeviceConfig
    from npu_sim.cost import op_cost
    from npu_sim.dtypes import TensorSpec

    config = DeviceConfig.preset("npu-m")
    a, out = TensorSpec((1, 8, 64), "float32"), TensorSpec((1, 8, 512), "float32")
    plain = op_cost(config, "MatMul", [a, TensorSpec((64, 512), "float32")], [out], {}, 4)
    stored = op_cost(config, "MatMul", [a, TensorSpec((512, 64), "float32")], [out],
                     {"transB": 1}, 4)
    assert stored.total_cycles == plain.total_cycles


@pytest.mark.parametrize("in_memory", [True, False])
def test_the_optimizer_leaves_no_file_behind(in_memory, tmp_path: Path, monkeypatch) -> None:
    """onnxruntime writes the optimized graph to a scratch file (/dev/shm when it has room,
    else the temporary folder); the graph is the same either way and the file is removed."""
    from ep.framework import optimizer
    from ep.framework.optimized_graphs import OptimizedGraphs

    monkeypatch.setattr(optimizer, "GRAPHS", OptimizedGraphs())  # onnxruntime runs
    monkeypatch.setattr(optimizer.tempfile, "tempdir", str(tmp_path))
    if not in_memory:
        monkeypatch.setattr(optimizer, "_scratch_folder", lambda size: None)
    scratch = optimizer._scratch_folder(0) or str(tmp_path)
    before = {p.name for p in Path(scratch).glob("npusim-opt-*")}
    model = shape_chain_model()
    got = optimize(model, int(ort.GraphOptimizationLevel.ORT_ENABLE_BASIC))
    assert {p.name for p in Path(scratch).glob("npusim-opt-*")} == before
    theirs = optimized_by_onnxruntime(model, tmp_path / "ort.onnx")
    assert [n.op_type for n in got.graph.node] == [n.op_type for n in theirs.graph.node]


def test_no_room_for_the_scratch_file_is_fail_naming_the_folder(monkeypatch) -> None:
    import errno
    import os

    from ep.framework import optimizer
    from ep.framework.optimized_graphs import OptimizedGraphs

    monkeypatch.setattr(optimizer, "GRAPHS", OptimizedGraphs())  # onnxruntime runs

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(optimizer.tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(ep.Fail, match="scratch file for onnxruntime's graph optimization in "
                       ".*No space left on device"):
        ep.InferenceSession(shape_chain_model().SerializeToString())


@pytest.mark.parametrize("ir_version", [onnx.IR_VERSION, 99])
def test_an_ir_version_onnxruntime_cannot_read_is_refused_with_its_words(ir_version) -> None:
    """A model from a newer exporter: onnxruntime refuses an IR version above the one it reads
    (``FAIL``, naming both); the session ran it. One it reads loads in both."""
    model = shape_chain_model()
    model.ir_version = ir_version
    data = model.SerializeToString()
    try:
        ort.InferenceSession(data, providers=[CPU])
    except Exception as exc:  # noqa: BLE001 - compared below
        theirs: Exception | None = exc
    else:
        theirs = None
    if theirs is None:
        ep.InferenceSession(data)
        return
    with pytest.raises(ep.OrtError) as ours:
        ep.InferenceSession(data)
    assert (type(ours.value).__name__, str(ours.value)) == (type(theirs).__name__, str(theirs))
