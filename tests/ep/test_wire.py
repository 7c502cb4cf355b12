"""Loading a model without copying its weights (ep.framework.wire): the light model parses to
the same graph, the weights are exactly the stored bytes, and every path that needs the complete
protobuf (CPU fallback, ``InferenceSession.model``, EPContext writing) gets them back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework.pipeline import _load
from ep.framework.shapes import WEIGHT_BYTES
from ep.framework.tensors import viewable
from ep.framework.wire import split_weights, tensor_value_info

RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((64, 64)).astype(np.float32)  # NPU MatMul weight
W2 = RNG.standard_normal((64, 32)).astype(np.float32)  # CPU Einsum weight
W3 = RNG.standard_normal((64, 8)).astype(np.float32)   # stored as float_data, not raw_data
BIAS = RNG.standard_normal(8).astype(np.float32)       # small: stays in the protobuf


def model() -> onnx.ModelProto:
    """x -> MatMul(W1) (NPU) -> Einsum(W2) (CPU) -> y ; MatMul(W3) + BIAS -> z."""
    typed = helper.make_tensor("W3", TensorProto.FLOAT, W3.shape, W3.reshape(-1).tolist())
    inits = [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(W2, "W2"), typed,
             numpy_helper.from_array(BIAS, "bias")]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm"),
             helper.make_node("Einsum", ["a", "W2"], ["y"], name="einsum", equation="ij,jk->ik"),
             helper.make_node("MatMul", ["a", "W3"], ["b"], name="mm3"),
             helper.make_node("Add", ["b", "bias"], ["z"], name="add")]
    graph = helper.make_graph(
        nodes, "wire", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_split_takes_exactly_the_large_raw_weights():
    data = model().SerializeToString()
    light, stripped = split_weights(data, WEIGHT_BYTES, viewable)
    parsed = onnx.ModelProto.FromString(light)
    full = onnx.ModelProto.FromString(data)
    assert [s.index for s in stripped] == [0, 1]
    for s, want in zip(stripped, (W1, W2), strict=True):
        tensor = parsed.graph.initializer[s.index]
        assert not tensor.HasField("raw_data") and list(tensor.dims) == list(want.shape)
        assert data[s.offset:s.offset + s.length] == want.tobytes()
    # Everything else is the model as protobuf parses it.
    for k in (0, 1):
        full.graph.initializer[k].ClearField("raw_data")
    assert parsed == full


def test_split_leaves_to_protobuf_what_it_does_not_take():
    small = model()
    for t in small.graph.initializer:
        t.ClearField("raw_data")
    assert split_weights(small.SerializeToString(), WEIGHT_BYTES, viewable) is None
    data = model().SerializeToString()
    assert split_weights(data[:-3], WEIGHT_BYTES, viewable) is None  # truncated
    assert split_weights(b"\x0b\x0c" + data, WEIGHT_BYTES, viewable) is None  # a group
    twice = data + data  # the graph field twice: protobuf merges them
    assert split_weights(twice, WEIGHT_BYTES, viewable) is None


def test_segments_and_external_tensors_keep_their_raw_data():
    m = model()
    m.graph.initializer[0].segment.begin = 0  # W1: a segment
    m.graph.initializer[1].data_location = TensorProto.EXTERNAL  # W2: bytes live elsewhere
    assert split_weights(m.SerializeToString(), WEIGHT_BYTES, viewable) is None
    m.graph.initializer[1].data_location = TensorProto.DEFAULT
    _, stripped = split_weights(m.SerializeToString(), WEIGHT_BYTES, viewable)
    assert [s.index for s in stripped] == [1]


@pytest.mark.parametrize("from_bytes", [False, True])
def test_session_from_a_split_model_matches_onnxruntime(tmp_path: Path, from_bytes: bool):
    m = model()
    path = tmp_path / "wire.onnx"
    onnx.save(m, path)
    session = ep.InferenceSession(m.SerializeToString() if from_bytes else str(path))
    assert session.get_node_assignment()["einsum"] == "CPUExecutionProvider"
    assert session.get_node_assignment()["mm"] == "NpuSimExecutionProvider"
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, ref in zip(session.run(None, {"x": x}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    stored = {t.name: numpy_helper.to_array(t) for t in session.model.graph.initializer}
    for name, value in (("W1", W1), ("W2", W2), ("W3", W3), ("bias", BIAS)):
        assert np.array_equal(stored[name], value)


def test_initializers_sharing_a_name_are_parsed_by_protobuf(tmp_path: Path):
    m = model()
    m.graph.initializer.append(numpy_helper.from_array(np.zeros_like(W1), "W1"))
    path = tmp_path / "twins.onnx"
    onnx.save(m, path)
    loaded, _, raw = _load(str(path), {}, split=True)
    assert raw == {} and loaded == onnx.load(path)


def test_epcontext_model_keeps_the_cpu_weights(tmp_path: Path):
    path = tmp_path / "wire.onnx"
    onnx.save(model(), path)
    options = ep.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(path), options)
    ctx = onnx.load(tmp_path / "wire_ctx.onnx")
    kept = {t.name: numpy_helper.to_array(t) for t in ctx.graph.initializer}
    assert np.array_equal(kept["W2"], W2)
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    want = ep.InferenceSession(str(path)).run(None, {"x": x})
    got = ep.InferenceSession(str(tmp_path / "wire_ctx.onnx")).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


@given(name=st.text(), elem_type=st.integers(-(2**31), 2**31 - 1),
       dims=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6))
def test_a_value_info_written_as_bytes_is_helpers(name, elem_type, dims):
    """The bytes parse into the message ``helper.make_tensor_value_info`` builds, serialized
    the same: any name, negative element types and dims (a malformed model's), a scalar's
    empty shape."""
    graph = onnx.GraphProto()
    graph.input.add().MergeFromString(tensor_value_info(name, elem_type, dims))
    want = helper.make_tensor_value_info(name, elem_type, dims)
    assert graph.input[0] == want
    assert graph.input[0].SerializeToString() == want.SerializeToString()
