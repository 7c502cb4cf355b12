"""ep.ModelCompiler, against onnxruntime.ModelCompiler's API, flags and messages."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from test_epcontext_load import npu_cpu_model
from test_session import X, mixed_model

import ep
from ep.framework import epcontext as E


def npu_options() -> ep.SessionOptions:
    so = ep.SessionOptions()
    so.add_provider("NpuSimExecutionProvider", {"device": "npu-m"})
    return so


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(npu_cpu_model(), path)
    return path


def ort_message(model: Path, flags: int, out: Path) -> str:
    with pytest.raises(Exception) as info:
        ort.ModelCompiler(ort.SessionOptions(), str(model), flags=flags).compile_to_file(str(out))
    return str(info.value)


def test_compile_to_file_then_run(model_path: Path) -> None:
    out = model_path.parent / "compiled.onnx"
    ep.ModelCompiler(npu_options(), str(model_path)).compile_to_file(str(out))
    assert sorted(os.listdir(model_path.parent)) == ["compiled.onnx", "compiled_npusim.bin",
                                                     "m.onnx"]
    want = ep.InferenceSession(str(model_path)).run(None, {"x": X})
    so = ep.SessionOptions()
    so.add_session_config_entry("session.disable_model_compile", "1")
    got = ep.InferenceSession(str(out), so).run(None, {"x": X})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_compile_to_bytes_embedded_writes_no_file(model_path: Path) -> None:
    data = ep.ModelCompiler(npu_options(), model_path.read_bytes(),
                            embed_compiled_data_into_model=True).compile_to_bytes()
    assert os.listdir(model_path.parent) == ["m.onnx"]
    nodes = [n for n in onnx.load_from_string(data).graph.node if E.is_ep_context_node(n)]
    assert [E.parse_ep_context_node(n).embed_mode for n in nodes] == [1] * len(nodes)
    want = ep.InferenceSession(str(model_path)).run(None, {"x": X})
    np.testing.assert_array_equal(ep.InferenceSession(data).run(None, {"x": X})[0], want[0])


def test_compile_to_bytes_with_binary_beside_the_input(model_path: Path) -> None:
    data = ep.ModelCompiler(npu_options(), str(model_path)).compile_to_bytes()
    assert sorted(os.listdir(model_path.parent)) == ["m.onnx", "m_npusim.bin"]
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_file_path", str(model_path.parent / "m_ctx.onnx"))
    want = ep.InferenceSession(str(model_path)).run(None, {"x": X})
    np.testing.assert_array_equal(ep.InferenceSession(data, so).run(None, {"x": X})[0], want[0])
    with pytest.raises(ep.InvalidArgument, match="Both ep_context_path and model_path"):
        ep.ModelCompiler(npu_options(), model_path.read_bytes()).compile_to_bytes()


def test_no_nodes_compiled(model_path: Path) -> None:
    out = model_path.parent / "out.onnx"
    flag = ep.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED
    with pytest.raises(ep.Fail) as info:
        ep.ModelCompiler(ep.SessionOptions(), str(model_path), flags=flag).compile_to_file(out)
    assert info.value.message in ort_message(model_path, int(flag), out)
    assert not out.exists()
    ep.ModelCompiler(ep.SessionOptions(), str(model_path)).compile_to_file(out)
    assert [n.op_type for n in onnx.load(out).graph.node] == \
        [n.op_type for n in npu_cpu_model().graph.node]


def test_output_file_exists(model_path: Path) -> None:
    out = model_path.parent / "out.onnx"
    out.write_bytes(b"old")
    flag = ep.OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS
    with pytest.raises(ep.Fail) as info:
        ep.ModelCompiler(npu_options(), str(model_path), flags=flag).compile_to_file(str(out))
    assert info.value.message == ort_message(model_path, int(flag), out).split(" : ", 3)[3]
    assert out.read_bytes() == b"old"
    ep.ModelCompiler(npu_options(), str(model_path)).compile_to_file(str(out))
    assert any(E.is_ep_context_node(n) for n in onnx.load(out).graph.node)


def test_folder_output(model_path: Path) -> None:
    with pytest.raises(ep.InvalidArgument, match="should not point to a folder"):
        ep.ModelCompiler(npu_options(), str(model_path)).compile_to_file(
            str(model_path.parent) + "/")
    with pytest.raises(ep.InvalidArgument, match="flags=8 is invalid"):
        ep.ModelCompiler(npu_options(), str(model_path), flags=8)


BAD_ARGUMENTS = {
    "empty bytes": ((b"",), {}),
    "empty path": (("",), {}),
    "int model": ((3,), {}),
    "external file type": (("MODEL",), {"external_initializers_file_path": 3}),
    "negative threshold": (("MODEL",), {"external_initializers_size_threshold": -1}),
    "flags type": (("MODEL",), {"flags": "x"}),
    "both initializer options": (("MODEL",), {"external_initializers_file_path": "w.bin",
                                              "get_initializer_location_func": print}),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_raise_what_onnxruntime_raises(model_path: Path, case: str) -> None:
    args, kwargs = BAD_ARGUMENTS[case]
    args = tuple(str(model_path) if a == "MODEL" else a for a in args)
    with pytest.raises(Exception) as theirs:
        ort.ModelCompiler(ort.SessionOptions(), *args, **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        ep.ModelCompiler(npu_options(), *args, **kwargs)
    if "incompatible" not in str(theirs.value):  # pybind's text names its C++ signature
        assert str(theirs.value) == str(ours.value)


def test_missing_input_and_compiled_input_use_onnxruntime_messages(model_path: Path) -> None:
    missing = model_path.parent / "nope.onnx"
    with pytest.raises(Exception) as theirs:
        ort.ModelCompiler(ort.SessionOptions(), str(missing)).compile_to_file(str(missing) + "x")
    with pytest.raises(ep.InvalidArgument) as ours:
        ep.ModelCompiler(npu_options(), str(missing)).compile_to_file(str(missing) + "x")
    assert str(ours.value) == str(theirs.value)


def test_compiled_model_is_invalid_graph(model_path: Path) -> None:
    out = model_path.parent / "out.onnx"
    ep.ModelCompiler(npu_options(), str(model_path)).compile_to_file(str(out))
    listing = sorted(os.listdir(model_path.parent))
    with pytest.raises(ep.InvalidGraph, match="Please ensure the input model is not already "
                                              "compiled"):
        ep.ModelCompiler(npu_options(), str(out)).compile_to_file(str(model_path.parent / "x.onnx"))
    assert sorted(os.listdir(model_path.parent)) == listing


def test_external_initializers_threshold(tmp_path: Path) -> None:
    model = mixed_model()
    # A CPU node (the NPU has no Mod) reading the 24-byte initializer W.
    model.graph.node[1].CopyFrom(helper.make_node("Mod", ["a", "W"], ["b"], name="sig", fmod=1))
    onnx.save(model, tmp_path / "m.onnx")
    for threshold, external in ((16, True), (1024, False)):
        out = tmp_path / f"t{threshold}.onnx"
        ep.ModelCompiler(npu_options(), str(tmp_path / "m.onnx"),
                         external_initializers_file_path=f"t{threshold}.data",
                         external_initializers_size_threshold=threshold).compile_to_file(out)
        (w,) = onnx.load(out, load_external_data=False).graph.initializer
        assert (w.data_location == onnx.TensorProto.EXTERNAL) == external
        want = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": X})
        got = ep.InferenceSession(str(out)).run(None, {"x": X})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
