"""EPContext model generation (ep.context_enable=1), per the reference EP context design."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import ep
from ep.framework import epcontext as E
from ep.npusim.binary import ContextBinary
from ep.npusim.version import SDK_VERSION
from tests.ep.test_session import X, mixed_model
from tests.ep.toy_ep import TOY, ToyExecutionProvider


def options(**entries: str) -> ep.SessionOptions:
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    for key, value in entries.items():
        so.add_session_config_entry(key.replace("__", "."), value)
    return so


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.onnx"
    onnx.save(mixed_model(), path)
    return path


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def generate(model: Path | bytes, so: ep.SessionOptions, provider=None) -> None:
    src = str(model) if isinstance(model, Path) else model
    ep.InferenceSession(src, so, providers=[provider or ToyExecutionProvider()])


def test_default_output_and_one_binary(model_path: Path) -> None:
    generate(model_path, options())
    folder = model_path.parent
    assert sorted(os.listdir(folder)) == ["mixed.onnx", "mixed_ctx.onnx", "mixed_toy.bin"]
    ctx = onnx.load(folder / "mixed_ctx.onnx")
    src = mixed_model()
    assert [i.name for i in ctx.graph.input] == [i.name for i in src.graph.input]
    assert [o.name for o in ctx.graph.output] == [o.name for o in src.graph.output]
    # The CPU nodes stay; each Toy partition is one EPContext node, in execution order (the
    # graph is in onnxruntime's topological order after its basic optimizations).
    nodes = [(n.op_type, n.name) for n in ctx.graph.node]
    assert sorted(nodes) == [("EPContext", "Toy_0"), ("EPContext", "Toy_1"), ("Sigmoid", "sig"),
                             ("Tanh", "tanh")]
    assert nodes[0] == ("EPContext", "Toy_0") and nodes.index(("Sigmoid", "sig")) < \
        nodes.index(("EPContext", "Toy_1"))
    assert {(o.domain, o.version) for o in ctx.opset_import} == {("", 17), ("com.microsoft", 1)}
    first, second = (attrs(n) for n in ctx.graph.node if E.is_ep_context_node(n))
    assert first == {"main_context": 1, "ep_cache_context": b"mixed_toy.bin", "embed_mode": 0,
                     "ep_sdk_version": b"1.0", "hardware_architecture": b"toy",
                     "partition_name": b"Toy_0", "source": TOY.encode(),
                     "onnx_model_filename": b"mixed.onnx", "max_size": 0}
    assert second["main_context"] == 0 and second["ep_cache_context"] == b"mixed_toy.bin"
    graphs = json.loads((folder / "mixed_toy.bin").read_bytes())["graphs"]
    assert sorted(graphs) == ["Toy_0", "Toy_1"]
    # CPU nodes keep their initializer-free form; the NPU-only initializer W is gone.
    assert [t.name for t in ctx.graph.initializer] == []
    onnx.checker.check_model(ctx)


def test_embed_mode_1_puts_payload_in_main_node(model_path: Path) -> None:
    generate(model_path, options(ep__context_embed_mode="1"))
    assert not (model_path.parent / "mixed_toy.bin").exists()
    ctx = onnx.load(model_path.parent / "mixed_ctx.onnx")
    first, second = (attrs(n) for n in ctx.graph.node if E.is_ep_context_node(n))
    assert first["embed_mode"] == 1 and first["main_context"] == 1
    assert sorted(json.loads(first["ep_cache_context"])["graphs"]) == ["Toy_0", "Toy_1"]
    assert second["main_context"] == 0 and second["ep_cache_context"] == b""


def test_context_file_path_and_prefix(model_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "named.onnx"
    out.parent.mkdir()
    generate(model_path, options(ep__context_file_path=str(out),
                                 ep__context_node_name_prefix="m1_"))
    assert sorted(os.listdir(out.parent)) == ["named.onnx", "named_toy.bin"]
    ctx = onnx.load(out)
    nodes = [n for n in ctx.graph.node if E.is_ep_context_node(n)]
    assert [n.name for n in nodes] == ["m1_Toy_0", "m1_Toy_1"]
    assert [attrs(n)["partition_name"] for n in nodes] == [b"m1_Toy_0", b"m1_Toy_1"]
    graphs = json.loads((out.parent / "named_toy.bin").read_bytes())["graphs"]
    assert sorted(graphs) == ["m1_Toy_0", "m1_Toy_1"]


@pytest.mark.parametrize("given", ["out/", "out", f"out{os.sep}"])
def test_folder_output_path_is_invalid_argument(model_path: Path, given: str) -> None:
    target = str(model_path.parent / given)
    with pytest.raises(ep.InvalidArgument) as info:
        generate(model_path, options(ep__context_file_path=target))
    assert info.value.message == "context_file_path should not point to a folder."
    assert sorted(os.listdir(model_path.parent)) == ["mixed.onnx"]


def test_existing_output_is_fail_and_untouched(model_path: Path) -> None:
    existing = model_path.parent / "mixed_ctx.onnx"
    existing.write_bytes(b"keep me")
    with pytest.raises(ep.Fail, match="exists already"):
        generate(model_path, options())
    assert existing.read_bytes() == b"keep me"
    assert sorted(os.listdir(model_path.parent)) == ["mixed.onnx", "mixed_ctx.onnx"]


def test_bytes_without_context_file_path_is_ort_error(model_path: Path) -> None:
    data = model_path.read_bytes()
    with pytest.raises(ep.InvalidArgument) as ours:
        generate(data, options())
    theirs = ort.SessionOptions()
    theirs.add_session_config_entry("ep.context_enable", "1")
    try:  # onnxruntime >= 1.2x checks the path up front, as we do; older ones only once an
        # EP compiles something (never, with the CPU provider alone)
        ort.InferenceSession(data, theirs, providers=["CPUExecutionProvider"])
    except Exception as exc:
        assert ours.value.message in str(exc)
    out = model_path.parent / "from_bytes_ctx.onnx"
    generate(data, options(ep__context_file_path=str(out)))
    assert out.exists() and (model_path.parent / "from_bytes_toy.bin").exists()


def test_nothing_compiled_writes_nothing(model_path: Path) -> None:
    ep.InferenceSession(str(model_path), options(), providers=["CPUExecutionProvider"])
    assert os.listdir(model_path.parent) == ["mixed.onnx"]


def test_cpu_initializers_embedded_or_external_never_source_file(tmp_path: Path) -> None:
    model = mixed_model()
    model.graph.node[1].CopyFrom(helper.make_node("Add", ["a", "W"], ["b"], name="sig"))
    model.graph.node[1].op_type = "Sub"  # a CPU node (the toy EP has no Sub) reading W
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(model, src / "m.onnx", save_as_external_data=True, location="m.data",
              size_threshold=0)
    want = ort.InferenceSession(str(src / "m.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": X})
    out = tmp_path / "out"
    out.mkdir()
    generate(src / "m.onnx", options(ep__context_file_path=str(out / "a_ctx.onnx")))
    generate(src / "m.onnx", options(ep__context_file_path=str(out / "b_ctx.onnx"),
                                     ep__context_model_external_initializers_file_name="b.data"))
    (src / "m.data").unlink()
    embedded = onnx.load(out / "a_ctx.onnx", load_external_data=False)
    assert [t.name for t in embedded.graph.initializer] == ["W"]
    assert embedded.graph.initializer[0].data_location == onnx.TensorProto.DEFAULT
    external = onnx.load(out / "b_ctx.onnx", load_external_data=False)
    (w,) = external.graph.initializer
    assert w.data_location == onnx.TensorProto.EXTERNAL
    assert {e.key: e.value for e in w.external_data}["location"] == "b.data"
    for name in ("a_ctx.onnx", "b_ctx.onnx"):
        got = ep.InferenceSession(str(out / name), providers=[ToyExecutionProvider()]).run(
            None, {"x": X})
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(
            numpy_helper.to_array(onnx.load(out / name).graph.initializer[0]),
            numpy_helper.to_array(mixed_model().graph.initializer[0]))


def test_share_ep_contexts_is_rejected_clearly(model_path: Path) -> None:
    with pytest.raises(ep.NotImplemented, match="ep.share_ep_contexts=1 is not supported"):
        generate(model_path, options(ep__share_ep_contexts="1"))
    assert os.listdir(model_path.parent) == ["mixed.onnx"]


def test_failed_write_leaves_no_file(model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.replace

    def failing(src: str, dst: str | Path) -> None:
        if str(dst).endswith("_ctx.onnx"):
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(ep.Fail, match="No space left on device"):
        generate(model_path, options())
    assert os.listdir(model_path.parent) == ["mixed.onnx"]


def test_ep_returning_a_bad_node_fails_and_cleans_up(model_path: Path) -> None:
    class Broken(ToyExecutionProvider):
        def get_ep_context_nodes(self) -> list[onnx.NodeProto]:
            nodes = super().get_ep_context_nodes()
            nodes[1].output[0] = "wrong"
            return nodes

    with pytest.raises(ep.EPFail, match="has inputs"):
        generate(model_path, options(), Broken())
    assert os.listdir(model_path.parent) == ["mixed.onnx"]


def test_npu_generation_one_binary_with_every_graph(tmp_path: Path) -> None:
    model = mixed_model()
    path = tmp_path / "npu.onnx"
    model.graph.node[1].op_type = "Softsign"  # keep a CPU partition between two NPU ones
    onnx.save(model, path)
    session = ep.InferenceSession(str(path), options(ep__context_node_name_prefix="p_"))
    assignment = session.get_node_assignment()
    assert assignment["sig"] == "CPUExecutionProvider"
    assert sorted(os.listdir(tmp_path)) == ["npu.onnx", "npu_ctx.onnx", "npu_npusim.bin"]
    ctx = onnx.load(tmp_path / "npu_ctx.onnx")
    nodes = [n for n in ctx.graph.node if E.is_ep_context_node(n)]
    names = [n.name for n in nodes]
    assert len(names) >= 2 and all(n.startswith("p_NpuSim_") for n in names)
    assert [attrs(n)["main_context"] for n in nodes] == [1] + [0] * (len(nodes) - 1)
    first = attrs(nodes[0])
    assert first["source"] == b"NpuSimExecutionProvider"
    assert first["ep_sdk_version"] == SDK_VERSION.encode()
    assert first["hardware_architecture"] == b"npu-m"
    assert first["max_size"] == (tmp_path / "npu_npusim.bin").stat().st_size
    with ContextBinary.open(tmp_path / "npu_npusim.bin") as binary:
        assert binary.graph_names() == names


@pytest.mark.parametrize("level", [ep.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   ep.GraphOptimizationLevel.ORT_ENABLE_ALL])
def test_cpu_node_reading_a_constant_compiled_into_an_ep_context_node(tmp_path: Path,
                                                                        level: int) -> None:
    """A small Constant crosses no partition boundary: the partitioner copies it into every
    fused subgraph that reads it. When the Constant node goes into an EPContext node, the CPU
    nodes that read it must still find it in the EPContext model (torch's exported BERT has
    such Constants feeding attention-mask Where nodes)."""
    c = helper.make_node("Constant", [], ["c"], name="c",
                         value=numpy_helper.from_array(np.float32([2.5])))
    graph = helper.make_graph(
        [c, helper.make_node("Add", ["x", "c"], ["a"], name="add"),
         helper.make_node("Mul", ["a", "c"], ["y"], name="mul")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "const.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    so = ep.SessionOptions()
    so.add_provider("NpuSimExecutionProvider", {"cpu_nodes": "mul"})
    ctx = tmp_path / "const_ctx.onnx"
    ep.ModelCompiler(so, str(path), graph_optimization_level=level).compile_to_file(str(ctx))
    model = onnx.load(ctx)
    assert [n.op_type for n in model.graph.node] == ["EPContext", "Mul"]
    assert "c" in {t.name for t in model.graph.initializer}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (got,) = ep.InferenceSession(str(ctx), providers=["NpuSimExecutionProvider"]).run(
        None, {"x": x})
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
