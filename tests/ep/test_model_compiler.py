"""ep.ModelCompiler, against onnxruntime.ModelCompiler's API, flags and messages."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import ep
from ep.framework import epcontext as E
from tests.ep.test_epcontext_load import npu_cpu_model
from tests.ep.test_session import X, mixed_model


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


def test_compile_to_stream_hands_the_bytes_of_compile_to_bytes(model_path: Path) -> None:
    chunks: list[bytes] = []
    compiler = ep.ModelCompiler(npu_options(), str(model_path),
                                embed_compiled_data_into_model=True)
    compiler.compile_to_stream(chunks.append)
    model = onnx.load_from_string(b"".join(chunks))
    assert any(E.is_ep_context_node(n) for n in model.graph.node)
    got = ep.InferenceSession(b"".join(chunks)).run(None, {"x": X})
    want = ep.InferenceSession(str(model_path)).run(None, {"x": X})
    np.testing.assert_array_equal(got[0], want[0])


def test_an_exception_in_the_stream_callback_is_fail_with_its_message(model_path) -> None:
    def full_disk(data: bytes) -> None:
        raise OSError(28, "No space left on device")

    compiler = ep.ModelCompiler(npu_options(), str(model_path),
                                embed_compiled_data_into_model=True)
    with pytest.raises(ep.Fail, match=r"OSError: \[Errno 28\] No space left on device"):
        compiler.compile_to_stream(full_disk)
    with pytest.raises(TypeError):
        compiler.compile_to_stream(3)


def test_binary_information_places_the_context_binary(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "bins"
    out.mkdir()
    compiler = ep.ModelCompiler(npu_options(), model_path.read_bytes())
    with pytest.raises(ep.InvalidArgument, match="output_dir or model_name is empty"):
        compiler.set_ep_context_binary_information("", "m")
    compiler.set_ep_context_binary_information(str(out) + os.sep, "served")
    data = compiler.compile_to_bytes()
    assert sorted(os.listdir(out)) == ["served_npusim.bin"]
    (node, *_) = [n for n in onnx.load_from_string(data).graph.node if E.is_ep_context_node(n)]
    assert E.parse_ep_context_node(node).ep_cache_context == b"served_npusim.bin"
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_file_path", str(out / "served_ctx.onnx"))
    got = ep.InferenceSession(data, so).run(None, {"x": X})
    np.testing.assert_array_equal(got[0], ep.InferenceSession(str(model_path)).run(
        None, {"x": X})[0])


def test_initializer_location_function_places_cpu_initializers(tmp_path: Path) -> None:
    model = mixed_model()
    model.graph.node[1].CopyFrom(helper.make_node("Mod", ["a", "W"], ["b"], name="sig", fmod=1))
    onnx.save(model, tmp_path / "m.onnx")
    blob = tmp_path / "weights.bin"
    seen: list[str] = []

    def place(name: str, value: np.ndarray, info):
        seen.append(name)
        assert info is None
        with open(blob, "ab") as f:
            offset = f.tell()
            f.write(value.tobytes())
        return ort.OrtExternalInitializerInfo("weights.bin", offset, value.nbytes)

    ep.ModelCompiler(npu_options(), str(tmp_path / "m.onnx"),
                     get_initializer_location_func=place).compile_to_file(
        str(tmp_path / "out.onnx"))
    assert seen == ["W"]
    (w,) = onnx.load(tmp_path / "out.onnx", load_external_data=False).graph.initializer
    assert w.data_location == onnx.TensorProto.EXTERNAL
    want = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, {"x": X})
    got = ep.InferenceSession(str(tmp_path / "out.onnx")).run(None, {"x": X})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)


def test_compile_to_bytes_with_an_external_initializers_file(tmp_path: Path) -> None:
    model = mixed_model()
    model.graph.node[1].CopyFrom(helper.make_node("Mod", ["a", "W"], ["b"], name="sig", fmod=1))
    onnx.save(model, tmp_path / "m.onnx")
    data = ep.ModelCompiler(npu_options(), str(tmp_path / "m.onnx"),
                            external_initializers_file_path="cpu.data",
                            external_initializers_size_threshold=0).compile_to_bytes()
    (w,) = onnx.load_from_string(data).graph.initializer
    assert w.data_location == onnx.TensorProto.EXTERNAL
    assert (tmp_path / "cpu.data").exists()


@pytest.mark.parametrize("level", [ep.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   ep.GraphOptimizationLevel.ORT_ENABLE_BASIC])
def test_graph_optimization_level_is_applied(tmp_path: Path, level) -> None:
    """x -> Identity -> TopK (CPU). onnxruntime's default for ModelCompiler is ORT_DISABLE_ALL:
    the Identity stays and the NPU compiles it; at the basic level it is eliminated before
    partitioning and nothing is left for the NPU."""
    nodes = [helper.make_node("Identity", ["x"], ["i"], name="identity"),
             helper.make_node("TopK", ["i", "k"], ["v", "ix"], name="topk", axis=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [2, 1])],
        [onnx.numpy_helper.from_array(np.array([1], np.int64), "k")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    ep.ModelCompiler(npu_options(), str(tmp_path / "m.onnx"),
                     graph_optimization_level=level).compile_to_file(str(out))
    contexts = [n for n in onnx.load(out).graph.node if E.is_ep_context_node(n)]
    assert len(contexts) == (1 if level == ep.GraphOptimizationLevel.ORT_DISABLE_ALL else 0)
    want = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_array_equal(ep.InferenceSession(str(out)).run(None, {"x": X})[0],
                                  want[0])


def test_compile_to_file_without_a_path_writes_beside_the_input(model_path: Path) -> None:
    ep.ModelCompiler(npu_options(), str(model_path)).compile_to_file()
    assert (model_path.parent / "m_ctx.onnx").exists()
    with pytest.raises(TypeError):
        ep.ModelCompiler(npu_options(), str(model_path)).compile_to_file(3)
