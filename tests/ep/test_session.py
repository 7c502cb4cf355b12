"""ep.InferenceSession: onnxruntime's API, messages and outputs, with CPU fallback."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.framework.options import DISABLE_MODEL_COMPILE
from tests.ep.graphgen import random_dags
from tests.ep.toy_ep import TOY, ToyExecutionProvider


def mixed_model() -> onnx.ModelProto:
    """x -> Add(W) -> Sigmoid (CPU) -> Relu -> Mul(x) -> y ; Add -> Tanh (CPU) -> z."""
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) / 6, "W")
    nodes = [
        helper.make_node("Add", ["x", "W"], ["a"], name="add"),
        helper.make_node("Sigmoid", ["a"], ["b"], name="sig"),
        helper.make_node("Relu", ["b"], ["c"], name="relu"),
        helper.make_node("Mul", ["c", "x"], ["y"], name="mul"),
        helper.make_node("Tanh", ["a"], ["z"], name="tanh"),
    ]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture
def model_path(tmp_path: Path) -> str:
    path = tmp_path / "mixed.onnx"
    onnx.save(mixed_model(), path)
    return str(path)


def ort_run(model: str | bytes, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def ort_error(model: str, feeds: dict, outputs=None) -> str:
    with pytest.raises(Exception) as info:
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(outputs, feeds)
    return str(info.value)


X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def test_outputs_match_onnxruntime_with_cpu_fallback(model_path: str) -> None:
    session = ep.InferenceSession(model_path, providers=[ToyExecutionProvider()])
    assert session.get_providers() == [TOY, "CPUExecutionProvider"]
    assignment = session.get_node_assignment()
    assert assignment == {"add": TOY, "sig": "CPUExecutionProvider", "relu": TOY, "mul": TOY,
                          "tanh": "CPUExecutionProvider"}
    assert session.get_decline_reasons()["sig"][TOY] == \
        "Sigmoid is not one of ['Add', 'Mul', 'Neg', 'Relu']"
    for got, want in zip(session.run(None, {"x": X}), ort_run(model_path, {"x": X}), strict=True):
        np.testing.assert_array_equal(got, want)
    (z,) = session.run(["z"], {"x": X})
    np.testing.assert_array_equal(z, ort_run(model_path, {"x": X})[1])


def test_provider_spellings(model_path: str) -> None:
    a = ep.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    b = ep.InferenceSession(model_path, providers=[("CPUExecutionProvider",
                                                    {"intra_op_num_threads": 1})])
    c = ep.InferenceSession(model_path, providers=["CPUExecutionProvider"],
                            provider_options=[{"intra_op_num_threads": "1"}])
    assert a.get_provider_options() == {"CPUExecutionProvider": {}}
    assert b.get_provider_options() == c.get_provider_options() == \
        {"CPUExecutionProvider": {"intra_op_num_threads": "1"}}
    for s in (a, b, c):
        np.testing.assert_array_equal(s.run(None, {"x": X})[0], ort_run(model_path, {"x": X})[0])


def test_cpu_listed_first_still_runs_last(model_path: str) -> None:
    s = ep.InferenceSession(model_path, providers=["CPUExecutionProvider", ToyExecutionProvider()])
    assert s.get_providers() == [TOY, "CPUExecutionProvider"]
    assert s.get_node_assignment()["relu"] == TOY


BAD_PROVIDER_ARGUMENTS = [
    {"providers": ["FooExecutionProvider"]},
    {"providers": "CPUExecutionProvider"},  # a string is a sequence of one-letter names
    {"providers": ["CPUExecutionProvider"], "provider_options": [{}, {}]},
    {"providers": ["CPUExecutionProvider"], "provider_options": [[]]},
    {"providers": [("CPUExecutionProvider",)]},
    {"providers": [("CPUExecutionProvider", {})], "provider_options": [{}]},
    {"providers": 3},
]


@pytest.mark.parametrize("kwargs", BAD_PROVIDER_ARGUMENTS)
def test_bad_provider_arguments_fail_as_in_onnxruntime(model_path: str, kwargs) -> None:
    """With the fallback off: the same exception type, and onnxruntime's message (ours may add
    what is valid)."""
    with pytest.raises(Exception) as theirs, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ort.InferenceSession(model_path, enable_fallback=0, **kwargs)
    expected = type(theirs.value) if isinstance(theirs.value, (ValueError, TypeError)) \
        else RuntimeError  # onnxruntime's status errors are RuntimeErrors; so are ours
    with pytest.raises(expected) as ours, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep.InferenceSession(model_path, enable_fallback=0, **kwargs)
    theirs_text = str(theirs.value).split("[ONNXRuntimeError] : ")[-1]
    assert theirs_text.split(";")[0] in str(ours.value)


@pytest.mark.parametrize("kwargs", BAD_PROVIDER_ARGUMENTS)
def test_bad_provider_arguments_fall_back_as_in_onnxruntime(model_path: str, kwargs,
                                                            capsys) -> None:
    """With the fallback on (the default): what onnxruntime retries on the CPU, ep retries,
    printing the same lines; what it raises, ep raises (the same type)."""
    outcomes = []
    for lib in (ort, ep):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                session = lib.InferenceSession(model_path, **kwargs)
            except Exception as exc:  # noqa: BLE001 - compared below
                outcomes.append((exc, capsys.readouterr().out))
                continue
        outcomes.append((session, capsys.readouterr().out))
    (theirs, printed), (ours, ours_printed) = outcomes
    assert ours_printed == printed
    if isinstance(theirs, Exception):
        assert isinstance(ours, type(theirs) if isinstance(theirs, (ValueError, TypeError))
                          else RuntimeError)
        return
    assert "Falling back to ['CPUExecutionProvider'] and retrying." in printed
    assert ours.get_providers() == theirs.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(ours.run(None, {"x": X})[0], theirs.run(None, {"x": X})[0])


def test_a_provider_onnxruntime_knows_but_lacks_is_left_out(model_path: str, capsys) -> None:
    """``["CUDAExecutionProvider", "CPUExecutionProvider"]``, the first line of so much
    onnxruntime code, runs where CUDA is not: onnxruntime warns and leaves it out, no fallback."""
    for lib, extra in ((ort, []), (ep, ["NpuSimExecutionProvider"])):
        with pytest.warns(UserWarning, match="'CUDAExecutionProvider' is not in available"):
            session = lib.InferenceSession(
                model_path, providers=["CUDAExecutionProvider", *extra, "CPUExecutionProvider"])
        assert session.get_providers() == [*extra, "CPUExecutionProvider"]
        assert capsys.readouterr().out == ""
    with pytest.raises(Exception) as theirs_add:
        ort.SessionOptions().add_provider("CUDAExecutionProvider", {})
    with pytest.raises(ep.InvalidArgument) as ours_add:
        ep.SessionOptions().add_provider("CUDAExecutionProvider", {})
    assert ours_add.value.message in str(theirs_add.value)


def test_a_repeated_provider_is_ignored_with_onnxruntime_warning(model_path: str) -> None:
    with pytest.warns(UserWarning, match="Duplicate provider 'CPUExecutionProvider' "
                                         "encountered, ignoring."):
        s = ep.InferenceSession(model_path, providers=["CPUExecutionProvider"] * 2)
    assert s.get_providers() == ["CPUExecutionProvider"]


def test_io_metadata_matches_onnxruntime(model_path: str) -> None:
    ours = ep.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    for a, b in ((ours.get_inputs(), theirs.get_inputs()),
                 (ours.get_outputs(), theirs.get_outputs())):
        assert [(x.name, x.type, x.shape) for x in a] == [(x.name, x.type, x.shape) for x in b]
    assert ep.get_available_providers() == ["NpuSimExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize("feeds, outputs", [
    ({"x": X, "q": X}, None),
    ({"x": X.astype(np.float64)}, None),
    ({"x": np.zeros((2, 4), np.float32)}, None),
    ({"x": np.zeros(3, np.float32)}, None),
    ({"x": X}, ["nope"]),
])
def test_run_errors_have_onnxruntime_text(model_path: str, feeds: dict, outputs) -> None:
    fixed = tmp_fixed(model_path)
    session = ep.InferenceSession(fixed, providers=[ToyExecutionProvider()])
    with pytest.raises(ep.InvalidArgument) as info:
        session.run(outputs, feeds)
    assert info.value.message in ort_error(fixed, feeds, outputs)


def tmp_fixed(model_path: str) -> str:
    """The mixed model with a static (2, 3) input, so shape errors have expected dims."""
    model = onnx.load(model_path)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    path = model_path.replace(".onnx", "_fixed.onnx")
    onnx.save(model, path)
    return path


def test_missing_input_names_the_input(model_path: str) -> None:
    session = ep.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, {})
    with pytest.raises(type(theirs.value)) as ours:  # onnxruntime's Python layer: ValueError
        session.run(None, {})
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


def test_session_config_entries() -> None:
    options = ep.SessionOptions()
    with pytest.raises(RuntimeError) as info:
        options.get_session_config_entry("ep.context_enable")
    with pytest.raises(RuntimeError) as theirs:
        ort.SessionOptions().get_session_config_entry("ep.context_enable")
    assert info.value.message == str(theirs.value)
    options.add_session_config_entry("ep.context_enable", "1")
    assert options.get_session_config_entry("ep.context_enable") == "1"
    with pytest.raises(ep.InvalidArgument, match="expected '0' or '1'"):
        options.add_session_config_entry("ep.context_enable", "yes")
    assert options.get_session_config_entry("ep.context_enable") == "1"
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ep.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.config_entries()["session.intra_op.num_threads"] == "2"


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ep.NoSuchFile, match="File doesn't exist"):
        ep.InferenceSession(str(tmp_path / "missing.onnx"))
    with pytest.raises(ep.InvalidProtobuf, match="protobuf parsing failed"):
        ep.InferenceSession(b"\xff\xff not a model")


@pytest.mark.parametrize("data", [b"", b"\x08\x07", b"\xff\xff not a model"],
                         ids=["empty", "no-graph", "garbage"])
@pytest.mark.parametrize("as_path", [False, True], ids=["bytes", "path"])
def test_what_is_not_a_model_is_refused_in_onnxruntime_words(tmp_path: Path, data: bytes,
                                                             as_path: bool) -> None:
    """Empty bytes parse as a model with no graph: onnxruntime's ``INVALID_ARGUMENT`` "No graph
    was found", not a parse error; from a path, its message names the file."""
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    source = str(path) if as_path else data
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    with pytest.raises(ep.OrtError) as ours:
        ep.InferenceSession(source)
    assert (type(ours.value).__name__, str(ours.value)) == (type(theirs.value).__name__,
                                                             str(theirs.value))


def test_external_data_from_path_and_from_bytes(tmp_path: Path) -> None:
    model = mixed_model()
    path = tmp_path / "ext.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.data", size_threshold=0)
    want = ort_run(str(path), {"x": X})
    got = ep.InferenceSession(str(path), providers=[ToyExecutionProvider()]).run(None, {"x": X})
    np.testing.assert_array_equal(got[0], want[0])
    data = path.read_bytes()
    with pytest.raises(ep.Fail, match="session.model_external_initializers_file_folder_path"):
        ep.InferenceSession(data, providers=[ToyExecutionProvider()])
    options = ep.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(tmp_path))
    got = ep.InferenceSession(data, options, providers=[ToyExecutionProvider()]).run(
        None, {"x": X})
    np.testing.assert_array_equal(got[0], want[0])


def test_disable_model_compile_requires_compiled_model(model_path: str) -> None:
    options = ep.SessionOptions()
    options.add_session_config_entry(DISABLE_MODEL_COMPILE, "1")
    with pytest.raises(ep.ModelRequiresCompilation,
                       match="User disabled EP compilation but EP 'ToyExecutionProvider' needs "
                             r"to compile one or more nodes\."):  # onnxruntime's text
        ep.InferenceSession(model_path, options, providers=[ToyExecutionProvider()])
    ep.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])


def test_profiling_writes_ort_format(model_path: str, tmp_path: Path) -> None:
    options = ep.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "prof")
    session = ep.InferenceSession(model_path, options, providers=[ToyExecutionProvider()])
    session.run(None, {"x": X})
    name = session.end_profiling()
    assert name.startswith(str(tmp_path / "prof_")) and name.endswith(".json")
    events = json.loads(Path(name).read_text())
    names = [e["name"] for e in events]
    assert {"session_initialization", "model_run", "Toy_0_kernel_time",
            "CPU_0_kernel_time"} <= set(names)
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    assert ep.InferenceSession(model_path).end_profiling() == ""


def test_npu_run_reports_simulated_latency(model_path: str) -> None:
    session = ep.InferenceSession(model_path)
    want = ort_run(model_path, {"x": X})
    for got, ref in zip(session.run(None, {"x": X}), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    stats = session.get_run_stats()["NpuSimExecutionProvider"]
    assert stats["cycles"] > 0 and stats["microseconds"] > 0
    assert all(0 <= u <= 1 for u in stats["utilization"].values())


@settings(max_examples=15, deadline=None)
@given(random_dags(max_nodes=8))
def test_random_graphs_match_onnxruntime(model: onnx.ModelProto) -> None:
    data = model.SerializeToString()
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal((3, 3)).astype(np.float32)
             for i in model.graph.input if i.name != "W"}
    session = ep.InferenceSession(data, providers=[ToyExecutionProvider()])
    assert set(session.get_node_assignment()) == {n.name for n in session._graph.nodes}
    for got, want in zip(session.run(None, feeds), ort_run(data, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def assignment(session) -> list[tuple[str, list[tuple[str, str, str]]]]:
    return [(s.ep_name, [(n.name, n.domain, n.op_type) for n in s.get_nodes()])
            for s in session.get_provider_graph_assignment_info()]


def test_provider_graph_assignment_info_as_onnxruntime(model_path: str) -> None:
    """All on the CPU provider: onnxruntime's list, node by node; on the NPU: its partitions,
    each one subgraph; without the config entry, onnxruntime's Fail."""
    sessions = []
    for lib in (ort, ep):
        options = lib.SessionOptions()
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        sessions.append(lib.InferenceSession(model_path, options,
                                             providers=["CPUExecutionProvider"]))
    assert assignment(sessions[1]) == assignment(sessions[0])
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(model_path).get_provider_graph_assignment_info()
    with pytest.raises(ep.Fail) as ours:
        ep.InferenceSession(model_path).get_provider_graph_assignment_info()
    assert str(ours.value) == str(theirs.value)
    options = ep.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    toy = ep.InferenceSession(model_path, options, providers=[ToyExecutionProvider()])
    want = []
    for part in toy.get_partitions():  # mixed_model's nodes all have names
        groups = [[n] for n in part["nodes"]] if part["provider"] == "CPUExecutionProvider" \
            else [part["nodes"]]
        want += [(part["provider"], group) for group in groups]
    assert {p for p, _ in want} == {TOY, "CPUExecutionProvider"}
    assert [(p, [n[0] for n in nodes]) for p, nodes in assignment(toy)] == want
