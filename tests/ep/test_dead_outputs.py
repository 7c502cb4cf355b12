"""Optional outputs nobody reads: accepted by the capability check, not materialized.

A dead output has no consumer and is not a graph output. The NPU takes the node anyway (its
shape need not be known), the compiler drops a dead *tail* from the launch, a dead output
before a used one still gets a tensor, and outputs that are read stay declined where the NPU
does not produce them (MaxPool Indices, LayerNormalization statistics, BatchNormalization's
training outputs).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ep
from ep import errors
from ep.framework.graph import GraphView
from ep.npusim.capability import check_node
from ep.npusim.compiler import compile_partition
from ep.npusim.compiler.ir import Node, SubGraph
from ep.npusim.compiler.lower import lower
from npu_sim.config import DeviceConfig
from tests.ep.npusim_graphs import F, as_fused, model, ort_run

NPU = "NpuSimExecutionProvider"
CONFIG = DeviceConfig.preset("npu-m")
X = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)


def run_both(m) -> tuple[ep.InferenceSession, list[np.ndarray], list[np.ndarray]]:
    session = ep.InferenceSession(m.SerializeToString(), providers=[NPU])
    return session, session.run(None, {"x": X}), ort_run(m, {"x": X})


def on_npu_only(session: ep.InferenceSession) -> bool:
    return {p["provider"] for p in session.get_partitions()} == {NPU}


def dropout7(mask_out: bool):
    """Opset 9 Dropout (version 7) then Relu; ONNX shape inference leaves the mask untyped."""
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"], ratio=0.5),
             helper.make_node("Relu", ["d"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", F, X.shape)]
    if mask_out:  # a graph output of unknown shape (the checker would insist on one)
        outputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, X.shape)],
                              outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=8)


def test_dropout7_dead_mask_runs_on_the_npu_and_matches_onnxruntime():
    m = dropout7(mask_out=False)
    view = GraphView.from_model(m)
    assert view.tensor_type("mask") == (None, None)  # the case: shape inference gives nothing
    assert check_node(view, 0) is None
    session, got, want = run_both(m)
    assert on_npu_only(session) and session.get_decline_reasons() == {}
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=0)


def test_dropout7_read_mask_without_shape_is_declined_with_the_reason():
    reason = check_node(GraphView.from_model(dropout7(mask_out=True)), 0)
    assert reason == ("Dropout: unknown shape of output 'mask': ONNX shape inference could not "
                      "determine it; the NPU needs static shapes")


def test_dropout_dead_data_before_read_mask_still_gets_a_tensor():
    # Output 0 is dead but output 1 is a graph output: output 0 cannot be dropped.
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"])]
    m = model(nodes, [("x", F, X.shape)], [("mask", TensorProto.BOOL, X.shape)], opset=13)
    compiled = compile_partition(as_fused(m), CONFIG)
    (launch,) = compiled.program.launches
    assert [compiled.program.tensors[t].name for t in launch.outputs] == ["d", "mask"]
    session, got, want = run_both(m)
    assert on_npu_only(session)
    assert got[0].dtype == np.bool_ and np.array_equal(got[0], want[0])


def maxpool(indices_out: bool):
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Relu", ["p"], ["y"])]
    pooled = (1, 2, 3, 3)
    outputs = [("y", F, pooled)] + ([("idx", TensorProto.INT64, pooled)] if indices_out else [])
    return model(nodes, [("x", F, X.shape)], outputs, opset=12)


def test_maxpool_dead_indices_are_not_materialized():
    m = maxpool(indices_out=False)
    compiled = compile_partition(as_fused(m), CONFIG)
    assert "idx" not in [t.name for t in compiled.program.tensors]
    session, got, want = run_both(m)
    assert on_npu_only(session)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=0)


def test_maxpool_read_indices_are_declined():
    assert check_node(GraphView.from_model(maxpool(indices_out=True)), 0) == (
        "MaxPool: the Indices output is not supported (only when nothing reads it)")


def layernorm(outputs: list[str], graph_outputs: list[tuple]):
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], outputs, axis=-1)]
    inits = {"scale": np.linspace(0.5, 1.5, 6, dtype=np.float32),
             "bias": np.linspace(-1, 1, 6, dtype=np.float32)}
    return model(nodes, [("x", F, X.shape)], graph_outputs, inits=inits, opset=17)


@pytest.mark.parametrize("outputs", [["y", "mean", "inv"], ["y", "", "inv"], ["y", "mean"]])
def test_layernorm_dead_statistics_run_on_the_npu(outputs: list[str]):
    m = layernorm(outputs, [("y", F, X.shape)])
    compiled = compile_partition(as_fused(m), CONFIG)
    (launch,) = compiled.program.launches
    assert [compiled.program.tensors[t].name for t in launch.outputs] == ["y"]
    session, got, want = run_both(m)
    assert on_npu_only(session)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_layernorm_read_statistics_are_declined():
    m = layernorm(["y", "", "inv"], [("y", F, X.shape), ("inv", F, (1, 2, 6, 1))])
    assert check_node(GraphView.from_model(m), 0) == (
        "LayerNormalization: Mean/InvStdDev outputs not supported (only when nothing reads them)")


def test_batchnorm_training_outputs_are_declined_even_when_dead():
    # Before opset 14 the extra outputs mean training mode: Y from batch statistics.
    c = X.shape[1]
    inits = {k: np.ones(c, np.float32) for k in ("s", "b", "m", "v")}
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                              ["y", "rm", "rv", "sm", "sv"])]
    m = model(nodes, [("x", F, X.shape)], [("y", F, X.shape)], inits=inits, opset=9)
    assert check_node(GraphView.from_model(m), 0) == (
        "BatchNormalization: running mean/var outputs not supported; only inference")


def test_lowering_refuses_an_omitted_output_before_a_used_one():
    # The capability check never offers this; lowering must not shift 'inv' into Mean's slot.
    graph = SubGraph(
        nodes=[Node("LayerNormalization", ["x", "s"], ["y", "", "inv"], {}, "ln")],
        inputs=["x"], outputs=["y", "inv"], consts={"s": np.ones(4, np.float32)},
        types={"x": ("float32", (2, 4)), "s": ("float32", (4,)), "y": ("float32", (2, 4)),
               "inv": ("float32", (2, 1))}, opset=17)
    with pytest.raises(errors.NotImplemented, match=r"'ln' \(LayerNormalization\) omits "
                                                    r"output 1 but a later output is used"):
        lower(graph)


@pytest.mark.parametrize("read", [("a",), ("b",), ("c",), ("a", "c")])
def test_split_dead_pieces(read: tuple[str, ...]):
    # Equal split into three along H: the dead tail is dropped, a dead middle piece kept.
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=2)]
    nodes += [helper.make_node("Relu", [piece], [f"y_{piece}"]) for piece in read]
    m = model(nodes, [("x", F, X.shape)], [(f"y_{p}", F, (1, 2, 2, 6)) for p in read])
    compiled = compile_partition(as_fused(m), CONFIG)
    split = compiled.program.launches[0]
    last = max("abc".index(p) for p in read)
    assert [compiled.program.tensors[t].name for t in split.outputs] == list("abc"[:last + 1])
    session, got, want = run_both(m)
    assert on_npu_only(session)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
