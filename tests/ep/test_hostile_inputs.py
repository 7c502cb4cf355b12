"""Bad input reaching the public API is a typed error naming what was wrong: never a raw
Python exception, an allocation of terabytes or a crash."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework import epcontext as E
from tests.ep.test_epcontext_load import ctx_nodes, gen_options, npu_cpu_model, set_attr

F = TensorProto.FLOAT


@pytest.fixture(scope="module")
def ctx_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ctx")
    onnx.save(npu_cpu_model(), folder / "m.onnx")
    ep.InferenceSession(str(folder / "m.onnx"), gen_options())
    os.symlink("loop", folder / "loop")
    return folder / "m_ctx.onnx"


@pytest.mark.parametrize(("label", "value", "reason"), [
    ("nul", b"a\0b.bin", "contains a NUL byte"),
    ("long", b"x" * 5000 + b".bin", "File name too long"),
    ("loop", b"loop/x.bin", "cannot be opened"),
])
def test_hostile_context_paths_are_invalid_graph(ctx_model: Path, label: str, value: bytes,
                                                  reason: str) -> None:
    model = onnx.load(ctx_model)
    for node in ctx_nodes(model):
        set_attr(node, "ep_cache_context", value)
    path = ctx_model.parent / f"{label}.onnx"
    onnx.save(model, path)
    with pytest.raises(ep.InvalidGraph, match=reason) as info:
        ep.InferenceSession(str(path))
    assert info.value.message.startswith(E.LOAD_ERROR)


def add_model(init: onnx.TensorProto) -> bytes:
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [4])],
                              [helper.make_tensor_value_info("y", F, [4])], [init])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def short_raw() -> onnx.TensorProto:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.raw_data = tensor.raw_data[:6]
    return tensor


def short_field() -> onnx.TensorProto:
    tensor = helper.make_tensor("w", F, [2], [1.0, 2.0])
    tensor.dims[0] = 4
    return tensor


def unknown_type() -> onnx.TensorProto:
    tensor = numpy_helper.from_array(np.ones(4, np.float32), "w")
    tensor.data_type = 77
    return tensor


@pytest.mark.parametrize("make", [short_raw, short_field, unknown_type])
def test_malformed_initializers_fail_like_onnxruntime(make) -> None:
    data = add_model(make())
    x = np.ones(4, np.float32)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail) as theirs:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with pytest.raises(ep.Fail, match="Initializer 'w'") as ours:
        ep.InferenceSession(data).run(None, {"x": x})
    if make is not unknown_type:  # onnxruntime's own words, where it has them
        assert ours.value.message.split(": ", 1)[1] in str(theirs.value)


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_folding_a_huge_constant_is_refused_before_allocating(op: str) -> None:
    inputs = ["shape"] if op == "ConstantOfShape" else ["one", "shape"]
    nodes = [helper.make_node(op, inputs, ["big"]),
             helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
             helper.make_node("Add", ["x", "s"], ["y"])]
    inits = [numpy_helper.from_array(np.array([100000, 100000, 100], np.int64), "shape"),
             numpy_helper.from_array(np.ones(1, np.float32), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [])],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    tracemalloc.start()
    try:
        with pytest.raises(ep.InvalidGraph, match=rf"{op}: .*\[100000, 100000, 100\] would hold "
                                                  r"1000000000000 elements"):
            ep.InferenceSession(model.SerializeToString())
        assert tracemalloc.get_traced_memory()[1] < 256 << 20
    finally:
        tracemalloc.stop()


def huge(name: str) -> onnx.ModelProto:
    """A tensor of more elements than any may hold: a declared input, or a Reshape's output
    (its shape a constant), in a model fed a 4-element tensor."""
    x = helper.make_tensor_value_info("x", F, [2**40, 2**40] if name == "input" else [4])
    shape = numpy_helper.from_array(np.array([2**31, 2**31], np.int64), "shape")
    node = helper.make_node("Relu", ["x"], ["y"]) if name == "input" else \
        helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", F, None)],
                              [] if name == "input" else [shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", ["input", "reshape"])
def test_a_tensor_too_large_to_hold_is_declined_and_fails_as_in_onnxruntime(name: str) -> None:
    """onnxruntime creates the session and its run fails (the feed does not match; the
    Reshape cannot be done); the NPU compiler failed the session with ``EP_FAIL``, one message
    an ``OverflowError``'s. The NPU now declines such a tensor, and the run fails with
    onnxruntime's error. (``ConstantOfShape`` and ``Expand``, sized by a constant's value, stay
    refused when the session is created, above.)"""
    data = huge(name).SerializeToString()
    feeds = {"x": np.ones(4 if name != "input" else (2, 2), np.float32)}
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(data, enable_fallback=0)
    (reasons,) = ours.get_decline_reasons().values()
    assert "holds more than the 2,147,483,647 elements" in reasons["NpuSimExecutionProvider"]
    with pytest.raises(Exception) as want:
        theirs.run(None, feeds)
    with pytest.raises(ep.OrtError) as got:
        ours.run(None, feeds)
    assert type(got.value).__name__ == type(want.value).__name__
