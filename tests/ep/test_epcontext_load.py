"""Loading EPContext models: round trips, source matching, path rules and load failures."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ep
from ep.framework import epcontext as E
from ep.npusim.binary import ContextBinary
from ep.npusim.epcontext import WeightChecks
from tests.ep.test_binary_blocks import BLOCK, LARGE, packed, sections
from tests.ep.test_session import X, mixed_model
from tests.ep.toy_ep import ToyExecutionProvider

LIGHT = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


def gen_options(**entries: str) -> ep.SessionOptions:
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    for key, value in entries.items():
        so.add_session_config_entry(key.replace("__", "."), value)
    return so


def npu_cpu_model() -> onnx.ModelProto:
    model = mixed_model()
    model.graph.node[1].op_type = "Softsign"  # no Softsign on the NPU: a CPU node between
    return model


def set_attr(node: onnx.NodeProto, name: str, value: object) -> None:
    for attr in list(node.attribute):
        if attr.name == name:
            node.attribute.remove(attr)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


def ctx_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if E.is_ep_context_node(n)]


@pytest.fixture(scope="module")
def npu_ctx(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The NPU+CPU model, its outputs from the source, and its ctx models (embed 0 and 1)."""
    folder = tmp_path_factory.mktemp("npu")
    onnx.save(npu_cpu_model(), folder / "m.onnx")
    want = ep.InferenceSession(str(folder / "m.onnx")).run(None, {"x": X})
    for embed in "01":
        ep.InferenceSession(str(folder / "m.onnx"), gen_options(
            ep__context_embed_mode=embed,
            ep__context_file_path=str(folder / f"e{embed}_ctx.onnx")))
    return {"folder": folder, "want": want}


@pytest.mark.parametrize("embed", ["0", "1"])
@pytest.mark.parametrize("from_bytes", [False, True])
def test_round_trip_identical_outputs(npu_ctx: dict, embed: str, from_bytes: bool) -> None:
    path = npu_ctx["folder"] / f"e{embed}_ctx.onnx"
    so = ep.SessionOptions()
    if from_bytes:
        so.add_session_config_entry("ep.context_file_path", str(path))
    session = ep.InferenceSession(path.read_bytes() if from_bytes else str(path), so)
    assert set(session.get_node_assignment().values()) == {
        "NpuSimExecutionProvider", "CPUExecutionProvider"}
    for got, want in zip(session.run(None, {"x": X}), npu_ctx["want"], strict=True):
        np.testing.assert_array_equal(got, want)


def test_bytes_without_context_file_path_cannot_find_binary(npu_ctx: dict) -> None:
    data = (npu_ctx["folder"] / "e0_ctx.onnx").read_bytes()
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(data)
    assert info.value.message.startswith(E.LOAD_ERROR)
    assert "ep.context_file_path" in info.value.message


def broken_copy(npu_ctx: dict, tmp_path: Path, edit) -> Path:
    tmp_path.mkdir(exist_ok=True)
    for name in ("e0_ctx.onnx", "m_npusim.bin", "e0_npusim.bin"):
        if (npu_ctx["folder"] / name).exists():
            shutil.copy(npu_ctx["folder"] / name, tmp_path / name)
    model = onnx.load(tmp_path / "e0_ctx.onnx")
    edit(model, tmp_path)
    onnx.save(model, tmp_path / "e0_ctx.onnx")
    return tmp_path / "e0_ctx.onnx"


def _main(model: onnx.ModelProto) -> onnx.NodeProto:
    return ctx_nodes(model)[0]


@pytest.mark.parametrize("case, expected", [
    ("empty", "is empty"),
    ("absolute", "is an absolute path"),
    ("escape", "outside the model folder"),
    ("symlink", "outside the model folder"),
    ("missing", "does not exist"),
    ("folder", "is not a file"),
    ("empty_file", "is empty"),
])
def test_bad_context_paths_are_invalid_graph(npu_ctx: dict, tmp_path: Path, case: str,
                                             expected: str) -> None:
    inner = tmp_path / "model"
    inner.mkdir()
    outside = tmp_path / "outside.bin"
    shutil.copy(npu_ctx["folder"] / "e0_npusim.bin", outside)

    def edit(model: onnx.ModelProto, folder: Path) -> None:
        value = {"empty": "", "absolute": str(folder / "e0_npusim.bin"),
                 "escape": "../outside.bin", "symlink": "link.bin", "missing": "nope.bin",
                 "folder": "sub", "empty_file": "zero.bin"}[case]
        (folder / "sub").mkdir()
        (folder / "zero.bin").write_bytes(b"")
        (folder / "link.bin").symlink_to(outside)
        for node in ctx_nodes(model):
            set_attr(node, "ep_cache_context", value)

    path = broken_copy(npu_ctx, inner, edit)
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(str(path))
    assert info.value.message.startswith(E.LOAD_ERROR)
    assert expected in info.value.message
    assert info.value.message.count(E.LOAD_ERROR) == 1  # said once, not wrapped in another
    assert "cannot be opened" not in info.value.message


@pytest.mark.parametrize("attr, value, expected", [
    ("ep_sdk_version", "9.0.0", "SDK version '9.0.0'"),
    ("hardware_architecture", "npu-l", "hardware architecture 'npu-l'"),
])
def test_version_and_architecture_mismatch(npu_ctx: dict, tmp_path: Path, attr: str,
                                           value: str, expected: str) -> None:
    path = broken_copy(npu_ctx, tmp_path, lambda m, _: set_attr(_main(m), attr, value))
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(str(path))
    assert info.value.message.startswith(E.LOAD_ERROR) and expected in info.value.message


def test_device_option_must_match_binary(npu_ctx: dict) -> None:
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(str(npu_ctx["folder"] / "e0_ctx.onnx"),
                            providers=[("NpuSimExecutionProvider", {"device": "npu-s"})])
    assert info.value.message.startswith(E.LOAD_ERROR) and "npu-m" in info.value.message


def test_corrupted_binary_fails_checksum(npu_ctx: dict, tmp_path: Path) -> None:
    def corrupt(model: onnx.ModelProto, folder: Path) -> None:
        data = bytearray((folder / "e0_npusim.bin").read_bytes())
        data[20] ^= 0xFF
        (folder / "e0_npusim.bin").write_bytes(bytes(data))

    path = broken_copy(npu_ctx, tmp_path, corrupt)
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(str(path))
    assert info.value.message.startswith(E.LOAD_ERROR) and "checksum" in info.value.message


def test_a_bad_weight_block_fails_the_load_it_was_checked_during(tmp_path: Path) -> None:
    """A binary's weights are checksummed on a thread while the programs are placed: a bad
    block still fails the load with the load error naming the node, also when the load fails
    for another reason too (the block is reported first, as when checked at open)."""
    w = np.random.default_rng(0).standard_normal((3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(w, "w")])
    sound = {"folder": tmp_path / "sound"}
    sound["folder"].mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), sound["folder"] / "e0.onnx")
    ep.InferenceSession(str(sound["folder"] / "e0.onnx"), gen_options(),
                        providers=["NpuSimExecutionProvider"])
    x = np.ones((2, 3), np.float32)
    got = ep.InferenceSession(str(sound["folder"] / "e0_ctx.onnx")).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], x @ w)  # a sound one loads and runs

    def corrupt_weights(model: onnx.ModelProto, folder: Path) -> None:
        data = bytearray((folder / "e0_npusim.bin").read_bytes())
        weights = next(s for s in ContextBinary.from_bytes(bytes(data)).sections
                       if s.kind_name == "weights")
        data[weights.offset + weights.length - 1] ^= 0xFF
        (folder / "e0_npusim.bin").write_bytes(bytes(data))

    path = broken_copy(sound, tmp_path / "w", corrupt_weights)
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(str(path))
    message = info.value.message
    assert message.startswith(E.LOAD_ERROR) and "(weights), block 0" in message
    node = ctx_nodes(onnx.load(path))[0].name
    assert f"EPContext node {node!r}: checksum mismatch" in message

    def corrupt_binding(model: onnx.ModelProto, folder: Path) -> None:
        model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value += 1

    path = broken_copy(sound, tmp_path / "b", corrupt_binding)
    with pytest.raises(ep.InvalidGraph, match="the compiled graph's input 0"):
        ep.InferenceSession(str(path))

    def corrupt_both(model: onnx.ModelProto, folder: Path) -> None:
        corrupt_weights(model, folder)
        corrupt_binding(model, folder)

    path = broken_copy(sound, tmp_path / "wb", corrupt_both)
    with pytest.raises(ep.InvalidGraph) as info:
        ep.InferenceSession(str(path))
    assert "(weights), block 0" in info.value.message


def test_a_bad_block_found_while_another_error_is_handled_is_not_chained_to_it() -> None:
    """The load reports the bad block instead of the error it was waited for in (the provider's
    compile waits inside its ``except``): the block's error does not show that one as the
    exception it happened while handling."""
    data = bytearray(packed(LARGE))
    data[sections(bytes(data))["weights"][1].offset + BLOCK] ^= 1
    checks = WeightChecks([("node", ContextBinary.from_bytes(bytes(data), defer_weights=True))])
    with pytest.raises(ep.InvalidGraph) as info:
        try:
            raise ep.InvalidGraph("the binding")
        except ep.InvalidGraph:
            checks.wait()
    assert info.value.message.startswith(f"{E.LOAD_ERROR} EPContext node 'node': checksum "
                                         "mismatch in section #4 (weights), block 1 ")
    assert info.value.__suppress_context__ and info.value.__cause__ is None


def test_nodes_of_other_sources_are_not_taken(tmp_path: Path) -> None:
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    ep.InferenceSession(str(tmp_path / "m.onnx"), gen_options(), [ToyExecutionProvider()])
    model = onnx.load(tmp_path / "m_ctx.onnx")
    set_attr(ctx_nodes(model)[0], "source", "OtherExecutionProvider")
    onnx.save(model, tmp_path / "other.onnx")
    with pytest.raises(ep.NotImplemented) as info:
        ep.InferenceSession(str(tmp_path / "other.onnx"), providers=[ToyExecutionProvider()])
    assert info.value.message.startswith(
        "Could not find an implementation for EPContext(1) node with name 'Toy_0'.")
    for node in ctx_nodes(model):
        set_attr(node, "source", None)  # no source: taken, as TensorRT does for old models
    onnx.save(model, tmp_path / "nosource.onnx")
    toy = ToyExecutionProvider()
    got = ep.InferenceSession(str(tmp_path / "nosource.onnx"), providers=[toy]).run(
        None, {"x": X})
    assert toy.loaded_from_context == 2 and toy.compiled_fresh == 0
    want = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_array_equal(got[0], want[0])


def _chain(op: str, x: str, y: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, [x], [y], name=op.lower())], op,
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_merged_contexts_from_two_models_all_load(tmp_path: Path) -> None:
    onnx.save(_chain("Relu", "x", "h"), tmp_path / "first.onnx")
    onnx.save(_chain("Neg", "h", "y"), tmp_path / "second.onnx")
    for name in ("first", "second"):
        ep.InferenceSession(str(tmp_path / f"{name}.onnx"),
                            gen_options(ep__context_node_name_prefix=f"{name}_"))
    a = ctx_nodes(onnx.load(tmp_path / "first_ctx.onnx"))
    b = ctx_nodes(onnx.load(tmp_path / "second_ctx.onnx"))
    assert [E.parse_ep_context_node(n).main_context for n in a + b] == [1, 1]
    merged = helper.make_model(helper.make_graph(
        a + b, "merged", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=8)
    onnx.save(merged, tmp_path / "merged.onnx")
    session = ep.InferenceSession(str(tmp_path / "merged.onnx"))
    assert set(session.get_node_assignment().values()) == {"NpuSimExecutionProvider"}
    np.testing.assert_array_equal(session.run(None, {"x": X})[0], -np.maximum(X, 0))


def test_light_resnet50_round_trip(tmp_path: Path) -> None:
    shutil.copy(LIGHT, tmp_path / "r.onnx")
    source = ep.InferenceSession(str(tmp_path / "r.onnx"), gen_options())
    name = source.get_inputs()[0].name
    x = np.random.default_rng(0).random(source.get_inputs()[0].shape, dtype=np.float32)
    want = source.run(None, {name: x})
    assert sorted(os.listdir(tmp_path)) == ["r.onnx", "r_ctx.onnx", "r_npusim.bin"]
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_file_path", str(tmp_path / "r_ctx.onnx"))
    for model in (str(tmp_path / "r_ctx.onnx"), (tmp_path / "r_ctx.onnx").read_bytes()):
        got = ep.InferenceSession(model, so).run(None, {name: x})
        np.testing.assert_array_equal(got[0], want[0])
