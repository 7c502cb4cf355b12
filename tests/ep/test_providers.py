"""Providers as ONNX Runtime picks them: from session options, from a registry, bound once,
and free dimensions fixed before partitioning."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import ep
from ep.framework import registry
from ep.npusim import NpuSimExecutionProvider
from tests.ep.test_epcontext_load import gen_options, npu_cpu_model
from tests.ep.test_session import X, mixed_model

NPU, CPU = "NpuSimExecutionProvider", "CPUExecutionProvider"
FRAMEWORK = Path(ep.__file__).parent / "framework"


def test_the_framework_imports_no_concrete_provider() -> None:
    for path in FRAMEWORK.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert "npusim" not in (node.module or ""), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any("npusim" in a.name for a in node.names), path.name


def test_the_npu_registers_itself_ahead_of_the_cpu() -> None:
    assert registry.available_providers() == [NPU, CPU] == ep.get_available_providers()
    assert registry.is_registered(NPU) and not registry.is_registered("Nope")


def test_a_python_provider_registered_by_name_joins_like_the_npu(tmp_path: Path) -> None:
    from tests.ep.toy_ep import TOY, ToyExecutionProvider
    registry.register_provider(TOY, ToyExecutionProvider, priority=50)
    try:
        onnx.save(mixed_model(), tmp_path / "m.onnx")
        so = ep.SessionOptions()
        so.add_provider(TOY, {})
        session = ep.InferenceSession(str(tmp_path / "m.onnx"), so)
        assert session.get_providers() == [TOY, CPU]
        assert ep.get_available_providers() == [NPU, TOY, CPU]
    finally:
        registry.unregister_provider(TOY)


def test_compiler_and_session_take_the_providers_of_the_session_options(tmp_path: Path) -> None:
    """ModelCompiler(so) then InferenceSession(ctx, so): one device, the one so names."""
    onnx.save(npu_cpu_model(), tmp_path / "m.onnx")
    so = ep.SessionOptions()
    so.add_provider(NPU, {"device": "npu-s"})
    assert so.has_providers()
    ep.ModelCompiler(so, str(tmp_path / "m.onnx")).compile_to_file(str(tmp_path / "m_ctx.onnx"))
    session = ep.InferenceSession(str(tmp_path / "m_ctx.onnx"), so)
    assert session.get_providers() == [NPU, CPU]
    assert session.get_provider_options()[NPU] == {"device": "npu-s"}
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=[CPU]).run(None, {"x": X})
    for got, ref in zip(session.run(None, {"x": X}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_providers_passed_win_over_session_options_with_onnxruntime_warning(tmp_path) -> None:
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    so = ep.SessionOptions()
    so.add_provider(NPU, {})
    with pytest.warns(UserWarning, match="InferenceSession will only use the providers passed"):
        session = ep.InferenceSession(str(tmp_path / "m.onnx"), so, providers=[CPU])
    assert session.get_providers() == [CPU]


def test_no_providers_anywhere_means_every_available_one(tmp_path: Path) -> None:
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    assert not ep.SessionOptions().has_providers()
    assert ep.InferenceSession(str(tmp_path / "m.onnx")).get_providers() == [NPU, CPU]


def test_add_provider_refuses_an_unknown_name_as_onnxruntime_does() -> None:
    with pytest.raises(RuntimeError) as theirs:
        ort.SessionOptions().add_provider("NopeExecutionProvider", {})
    with pytest.raises(RuntimeError) as ours:
        ep.SessionOptions().add_provider("NopeExecutionProvider", {})
    assert str(theirs.value) in str(ours.value)


def test_an_instance_passed_provider_gets_the_session_context(tmp_path: Path) -> None:
    """The instance is made before the session; bind() hands it the session's options, so it
    writes the EPContext model like a provider named by string."""
    onnx.save(npu_cpu_model(), tmp_path / "m.onnx")
    provider = NpuSimExecutionProvider()
    ep.InferenceSession(str(tmp_path / "m.onnx"), gen_options(), providers=[provider])
    assert (tmp_path / "m_ctx.onnx").exists() and (tmp_path / "m_npusim.bin").exists()
    assert provider.generating


@pytest.mark.parametrize("how", ["session_option", "provider_option"])
def test_free_dimension_overrides_reach_partitioning(tmp_path: Path, how: str) -> None:
    """mixed_model's input is [N, 3]: the NPU needs N fixed, in either form, before it sees the
    graph (a provider option used to reach only its compiler, after capability declined)."""
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    plain = ep.InferenceSession(str(tmp_path / "m.onnx"), providers=[NPU])
    assert "set a dim override" in plain.get_decline_reasons()["add"][NPU]  # N unknown
    so = ep.SessionOptions()
    options: dict[str, str] = {}
    if how == "session_option":
        so.add_free_dimension_override_by_name("N", 2)
    else:
        options["N"] = "2"
    session = ep.InferenceSession(str(tmp_path / "m.onnx"), so, providers=[(NPU, options)])
    assert set(session.get_node_assignment().values()) == {NPU}
    ref_so = ort.SessionOptions()
    ref_so.add_free_dimension_override_by_name("N", 2)
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), ref_so, providers=[CPU]).run(
        None, {"x": X})
    for got, ref in zip(session.run(None, {"x": X}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
    assert [i.shape for i in session.get_inputs()] == [[2, 3]]


@pytest.mark.parametrize("args", [("N", "x"), (3, 1), ("N", 1.5)])
def test_free_dimension_override_argument_types_as_onnxruntime(args) -> None:
    with pytest.raises(TypeError):
        ort.SessionOptions().add_free_dimension_override_by_name(*args)
    with pytest.raises(TypeError), warnings.catch_warnings():
        ep.SessionOptions().add_free_dimension_override_by_name(*args)


def test_conflicting_overrides_are_invalid_argument(tmp_path: Path) -> None:
    onnx.save(mixed_model(), tmp_path / "m.onnx")
    so = ep.SessionOptions()
    so.add_free_dimension_override_by_name("N", 2)
    with pytest.raises(ep.InvalidArgument, match="'N' is fixed to 2 and, by "
                                                 "NpuSimExecutionProvider's options, to 4"):
        ep.InferenceSession(str(tmp_path / "m.onnx"), so, providers=[(NPU, {"N": "4"})])


def denoted_model() -> onnx.ModelProto:
    """x [N, 3] and z [?, 3], both batch dimensions denoted DATA_BATCH, added."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3])
    z = onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [None, 3])
    for value_info in (x, z):
        value_info.type.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "z"], ["y"], name="add")], "g", [x, z],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_free_dimension_overrides_by_denotation_as_onnxruntime() -> None:
    """Both batch dimensions, named and unnamed, are fixed before partitioning (the NPU takes
    the Add); a batch of another size is onnxruntime's refusal; fixing the named one to
    another value by name too is its conflict."""
    data = denoted_model().SerializeToString()
    feeds = {"x": np.ones((2, 3), np.float32), "z": np.full((2, 3), 2, np.float32)}
    sessions = []
    for lib in (ort, ep):
        options = lib.SessionOptions()
        options.add_free_dimension_override_by_denotation("DATA_BATCH", 2)
        sessions.append(lib.InferenceSession(data, options))
    theirs, ours = sessions
    assert ours.get_node_assignment() == {"add": NPU}
    assert [i.shape for i in ours.get_inputs()] == [i.shape for i in theirs.get_inputs()]
    np.testing.assert_array_equal(ours.run(None, feeds)[0], theirs.run(None, feeds)[0])
    for name in feeds:  # each batch dimension alone of another size
        wrong = {**feeds, name: np.ones((4, 3), np.float32)}
        with pytest.raises(Exception) as want:
            theirs.run(None, wrong)
        with pytest.raises(ep.InvalidArgument) as got:
            ours.run(None, wrong)
        assert got.value.message.split("\n")[:2] == \
            str(want.value).split(" : ")[-1].split("\n")[:2]
    errors = []
    for lib in (ort, ep):
        options = lib.SessionOptions()
        options.add_free_dimension_override_by_denotation("DATA_BATCH", 2)
        options.add_free_dimension_override_by_name("N", 3)
        with pytest.raises(Exception) as info:
            lib.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        errors.append(info.value)
    assert str(errors[1]) == str(errors[0])
    for args in (("DATA_BATCH", "x"), (3, 1)):
        with pytest.raises(TypeError):
            ort.SessionOptions().add_free_dimension_override_by_denotation(*args)
        with pytest.raises(TypeError):
            ep.SessionOptions().add_free_dimension_override_by_denotation(*args)
