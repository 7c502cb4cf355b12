"""Partial runs inside one NPU partition: ``run(output_names=[...])`` launches only the kernels
the requested outputs need (firmware_model/prune.py), and their values are the full run's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ep
from tests.ep.graphgen import random_dags, random_feeds

NPU = "NpuSimExecutionProvider"


def fan_out_model() -> onnx.ModelProto:
    """x -> Relu(r) -> a; a -> Tanh(t) -> y; a -> Neg(n) -> z: one NPU partition."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"),
             helper.make_node("Tanh", ["a"], ["y"], name="t"),
             helper.make_node("Neg", ["a"], ["z"], name="n")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "fan_out", [helper.make_tensor_value_info("x", f, [4, 8])],
                              [helper.make_tensor_value_info("y", f, [4, 8]),
                               helper.make_tensor_value_info("z", f, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def kernels(session: ep.InferenceSession) -> int:
    return session.get_run_stats()[NPU]["counters"]["compute.kernels"]


@pytest.mark.parametrize(("names", "launched"), [(["y"], 2), (["z"], 2), (None, 3)])
def test_a_partial_run_launches_only_the_kernels_its_outputs_need(names, launched) -> None:
    model = fan_out_model().SerializeToString()
    session = ep.InferenceSession(model, providers=[NPU])
    assert len(session.get_partitions()) == 1
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    got = session.run(names, {"x": x})
    assert kernels(session) == launched
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(names, {"x": x})
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_partial_run_does_not_download_unrequested_outputs() -> None:
    session = ep.InferenceSession(fan_out_model().SerializeToString(), providers=[NPU])
    x = np.ones((4, 8), np.float32)
    session.run(None, {"x": x})
    full = session.get_run_stats()[NPU]["counters"]
    session.run(["y"], {"x": x})
    partial = session.get_run_stats()[NPU]["counters"]
    assert full["dma.d2h.bytes"] - partial["dma.d2h.bytes"] == 4 * 8 * 4  # z is not copied
    assert full["dma.transfers"] - partial["dma.transfers"] == 1
    assert partial["device.cycles"] < full["device.cycles"]


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags(max_nodes=8), st.data())
def test_partial_runs_equal_the_full_run_on_random_graphs(model: onnx.ModelProto,
                                                           data: st.DataObject) -> None:
    outputs = [o.name for o in model.graph.output]
    names = data.draw(st.lists(st.sampled_from(outputs), min_size=1, unique=True))
    session = ep.InferenceSession(model.SerializeToString(), providers=[NPU])
    feeds = random_feeds(model)
    full = dict(zip(outputs, session.run(None, feeds), strict=True))
    full_kernels = kernels(session) if NPU in session.get_run_stats() else 0
    for name, value in zip(names, session.run(names, feeds), strict=True):
        np.testing.assert_array_equal(value, full[name])
    stats = session.get_run_stats().get(NPU)
    assert (stats["counters"]["compute.kernels"] if stats else 0) <= full_kernels
    for name, value in zip(outputs, session.run(None, feeds), strict=True):
        np.testing.assert_array_equal(value, full[name])
    assert (kernels(session) if NPU in session.get_run_stats() else 0) == full_kernels


def test_an_output_that_is_a_view_keeps_the_kernel_that_writes_its_bytes() -> None:
    """y = Reshape(Relu(x)) aliases Relu's output (no kernel of its own): asking for y alone
    still runs Relu, and not Neg."""
    f = TensorProto.FLOAT
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [32])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r"),
             helper.make_node("Reshape", ["a", "shape"], ["y"], name="v"),
             helper.make_node("Neg", ["a"], ["z"], name="n")]
    graph = helper.make_graph(nodes, "view", [helper.make_tensor_value_info("x", f, [4, 8])],
                              [helper.make_tensor_value_info("y", f, [32]),
                               helper.make_tensor_value_info("z", f, [4, 8])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8).SerializeToString()
    session = ep.InferenceSession(model, providers=[NPU])
    assert len(session.get_partitions()) == 1
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    session.run(None, {"x": x})
    full = kernels(session)
    (y,) = session.run(["y"], {"x": x})
    assert kernels(session) == full - 1
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(["y"],
                                                                                  {"x": x})
    np.testing.assert_array_equal(y, want)


def test_partial_runs_leave_later_full_runs_as_they_would_have_been() -> None:
    """Twin sessions on one model: one runs a partial run between every two full runs. Its
    full runs take exactly the cycles (and give the values) of the other's."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.random((256, 256), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["a"], name="m"),
         helper.make_node("Tanh", ["a"], ["y"], name="t"),
         helper.make_node("Neg", ["a"], ["z"], name="n")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 256]) for n in "yz"], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    plain, mixed = (ep.InferenceSession(data, providers=[NPU]) for _ in range(2))
    x = rng.random((64, 256), dtype=np.float32)

    def cycles(session: ep.InferenceSession) -> int:
        return session.get_run_stats()[NPU]["cycles"]

    for _ in range(3):
        want = plain.run(None, {"x": x})
        got = mixed.run(None, {"x": x})
        assert cycles(mixed) == cycles(plain)
        for g, w_ in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w_)
        (y,) = mixed.run(["y"], {"x": x})
        np.testing.assert_array_equal(y, want[0])
        assert cycles(mixed) < cycles(plain)


def test_a_partial_run_on_the_cpu_runs_only_the_nodes_its_outputs_need() -> None:
    """A CPU partition runs a session of only what the wanted outputs need (onnxruntime itself
    runs every node of a session whatever is fetched). Proof: the Reshape behind ``z`` is given
    a shape it cannot take, so a run that computed it fails; asking for ``y`` alone does not."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="r"),
         helper.make_node("Tanh", ["a"], ["y"], name="t"),
         helper.make_node("Reshape", ["a", "shape"], ["z"], name="bad")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    session = ep.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.linspace(-1, 1, 128, dtype=np.float32).reshape(2, 64)
    feeds = {"x": x, "shape": np.array([7], np.int64)}
    with pytest.raises(ep.errors.OrtError):
        session.run(None, feeds)
    (y,) = session.run(["y"], feeds)
    reference = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (want,) = reference.run(["y"], {**feeds, "shape": np.array([128], np.int64)})
    np.testing.assert_array_equal(y, want)
    (y, z) = session.run(["y", "z"], {**feeds, "shape": np.array([128], np.int64)})
    np.testing.assert_array_equal(z, x.clip(0).reshape(128))
