"""A run's and a session's arguments of the wrong type or value fail as onnxruntime's do: the
same exception class, checked against the installed onnxruntime in each test, before anything
runs; the session is unchanged after (the next good run gives onnxruntime's values)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ep

NPU = ["NpuSimExecutionProvider", "CPUExecutionProvider"]
X = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)


def two_outputs() -> bytes:
    """x -> Relu -> r, r + x -> y: both outputs on the NPU."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("r", "y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def sessions() -> tuple[ort.InferenceSession, ep.InferenceSession]:
    model = two_outputs()
    npu = ep.InferenceSession(model, providers=NPU)
    assert set(npu.get_node_assignment().values()) == {"NpuSimExecutionProvider"}
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]), npu


def raised(call) -> BaseException:
    with pytest.raises(Exception) as info:
        call()
    return info.value


def still_runs(sessions: tuple[Any, Any]) -> None:
    theirs, ours = sessions
    for got, want in zip(ours.run(None, {"x": X}), theirs.run(None, {"x": X}), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("names", ["yy", b"y", ["y", 1], [None], 3, np.float32(1)],
                         ids=repr)
def test_output_names_of_the_wrong_type_are_a_type_error(sessions, names) -> None:
    theirs, ours = sessions
    assert isinstance(raised(lambda: theirs.run(names, {"x": X})), TypeError)
    error = raised(lambda: ours.run(names, {"x": X}))
    assert type(error) is TypeError
    assert "output_names" in str(error) and repr(names) in str(error)
    still_runs(sessions)


@pytest.mark.parametrize("names", [None, [], (), ["y"], ("r",), ["y", "y"], ["y", "r"]],
                         ids=repr)
def test_output_names_onnxruntime_takes(sessions, names) -> None:
    theirs, ours = sessions
    want = theirs.run(names, {"x": X})
    got = ours.run(names, {"x": X})
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("options", ["foo", 1, [], ort.RunOptions], ids=repr)
def test_run_options_of_the_wrong_type_are_a_type_error(sessions, options) -> None:
    theirs, ours = sessions
    assert isinstance(raised(lambda: theirs.run(None, {"x": X}, options)), TypeError)
    error = raised(lambda: ours.run(None, {"x": X}, options))
    assert type(error) is TypeError
    assert "run_options" in str(error) and type(options).__name__ in str(error)


@pytest.mark.parametrize("make", [ep.RunOptions, ort.RunOptions])
def test_run_options_run_as_onnxruntime_does(sessions, make) -> None:
    theirs, ours = sessions
    mine, reference = make(), ort.RunOptions()
    assert [getattr(mine, a) for a in ("log_severity_level", "log_verbosity_level", "logid",
                                       "only_execute_path_to_fetches", "terminate")] == \
        [getattr(reference, a) for a in ("log_severity_level", "log_verbosity_level", "logid",
                                         "only_execute_path_to_fetches", "terminate")]
    for level in (-1, 0, 4):
        mine.log_severity_level = reference.log_severity_level = level
        np.testing.assert_array_equal(ours.run(["y"], {"x": X}, mine)[0],
                                      theirs.run(["y"], {"x": X}, reference)[0])
    for level in (5, 7, -2):
        mine.log_severity_level = reference.log_severity_level = level
        want = raised(lambda: theirs.run(None, {"x": X}, reference))
        got = raised(lambda: ours.run(None, {"x": X}, mine))
        assert type(got).__name__ == type(want).__name__ == "Fail"
        assert f"Invalid run log severity level. Not a valid onnxruntime::logging::Severity " \
               f"value: {level}" in str(got)
        assert f"value: {level}" in str(want)
    mine.log_severity_level = reference.log_severity_level = -1
    mine.terminate = reference.terminate = True
    want = raised(lambda: theirs.run(None, {"x": X}, reference))
    got = raised(lambda: ours.run(None, {"x": X}, mine))
    assert type(got).__name__ == type(want).__name__ == "Fail"
    assert str(got) == str(want)
    still_runs(sessions)


def test_run_config_entries_as_onnxruntime() -> None:
    mine, reference = ep.RunOptions(), ort.RunOptions()
    for options in (mine, reference):
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    assert mine.get_run_config_entry("memory.enable_memory_arena_shrinkage") == \
        reference.get_run_config_entry("memory.enable_memory_arena_shrinkage")
    want = raised(lambda: reference.get_run_config_entry("nope"))
    got = raised(lambda: mine.get_run_config_entry("nope"))
    assert isinstance(want, RuntimeError) and isinstance(got, RuntimeError)
    assert got.message == str(want)
    assert isinstance(raised(lambda: reference.add_run_config_entry("k", 1)), TypeError)
    assert isinstance(raised(lambda: mine.add_run_config_entry("k", 1)), TypeError)


@pytest.mark.parametrize("feed", [[X], None, (X,), "x", X], ids=lambda f: type(f).__name__)
def test_a_feed_that_is_not_a_mapping_is_a_type_error(sessions, feed) -> None:
    theirs, ours = sessions
    # onnxruntime lets the AttributeError of its own feed.keys() through (docs/conformance.md)
    assert isinstance(raised(lambda: theirs.run(None, feed)), AttributeError)
    error = raised(lambda: ours.run(None, feed))
    assert type(error) is TypeError
    assert "input_feed" in str(error) and type(feed).__name__ in str(error)
    still_runs(sessions)


@pytest.mark.parametrize("options", ["foo", 1, ort.SessionOptions], ids=repr)
def test_session_options_of_the_wrong_type_are_a_type_error(options) -> None:
    model = two_outputs()
    options = options() if options is ort.SessionOptions else options
    if not isinstance(options, ort.SessionOptions):
        assert isinstance(raised(lambda: ort.InferenceSession(model, options)), TypeError)
    error = raised(lambda: ep.InferenceSession(model, options, providers=NPU))
    assert type(error) is TypeError
    assert "ep.SessionOptions" in str(error) and type(options).__name__ in str(error)


def test_instances_check_their_arguments_too(sessions) -> None:
    theirs, ours = sessions
    instance = ours.create_instance()
    assert type(raised(lambda: instance.run("y", {"x": X}))) is TypeError
    assert type(raised(lambda: instance.run(None, [X]))) is TypeError
    assert type(raised(lambda: instance.run(None, {}))) is ValueError
    options = ep.RunOptions()
    options.terminate = True
    assert type(raised(lambda: instance.run(None, {"x": X}, options))) is ep.Fail
    np.testing.assert_array_equal(instance.run(["y"], {"x": X})[0],
                                  theirs.run(["y"], {"x": X})[0])


def test_an_optional_input_may_be_left_out_as_in_onnxruntime() -> None:
    optional = helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    graph = helper.make_graph([helper.make_node("OptionalHasElement", ["o"], ["b"])], "g",
                              [helper.make_value_info("o", optional)],
                              [helper.make_tensor_value_info("b", TensorProto.BOOL, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(model.SerializeToString(), providers=NPU)
    for feed in ({}, {"o": None}, {"o": np.ones(2, np.float32)}):
        assert ours.run(None, feed) == theirs.run(None, feed)


@pytest.mark.parametrize("version", [None, 7])
def test_model_metadata_as_onnxruntime(version) -> None:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              doc_string="the graph")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="torch", doc_string="the model", domain="d")
    model.ir_version = 8
    if version is not None:
        model.model_version = version
    helper.set_model_props(model, {"author": "me", "licence": "MIT"})
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(model.SerializeToString(), providers=NPU)
    fields = ("producer_name", "graph_name", "domain", "description", "graph_description",
              "version", "custom_metadata_map")
    assert [getattr(ours.get_modelmeta(), f) for f in fields] == \
        [getattr(theirs.get_modelmeta(), f) for f in fields]


def test_module_functions_onnxruntime_code_calls() -> None:
    assert ep.__version__ == ort.__version__  # the API mirrored is the installed one's
    assert isinstance(ep.get_device(), str) and ep.get_device() == "NPU"
    assert ep.get_all_providers()[:1] == ["NpuSimExecutionProvider"]
    assert ep.get_all_providers()[1:] == ort.get_all_providers()
    assert set(ep.get_available_providers()) <= set(ep.get_all_providers())
    for name in ("get_build_info", "get_version_string", "set_default_logger_severity",
                 "set_default_logger_verbosity", "set_seed", "disable_telemetry_events",
                 "enable_telemetry_events", "has_collective_ops", "preload_dlls",
                 "print_debug_info"):  # onnxruntime's, which runs the CPU provider here
        assert getattr(ep, name) is getattr(ort, name), name


def test_the_enums_print_as_onnxruntime_prints_them() -> None:
    """``str(options.execution_mode)`` is ``ExecutionMode.ORT_PARALLEL``, as onnxruntime's
    prints; an ``IntEnum`` printed its number (``1``) from Python 3.11 on."""
    for kind in ("ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel"):
        ours, theirs = getattr(ep, kind), getattr(ort, kind)
        for name, member in theirs.__members__.items():
            assert (str(ours[name]), f"{ours[name]}", int(ours[name])) == (
                str(member), f"{member}", int(member))


FEED_TYPES = [TensorProto.FLOAT, TensorProto.INT64, TensorProto.UINT8, TensorProto.BOOL,
              TensorProto.FLOAT16, TensorProto.STRING]
FEEDS = [[1.5, 2.7], [1, 2], [True, False], ["a", "b"], [[1, 2], [3]], [[1, 2], [3, 4]], [],
         [300, -1], [np.float64(1.5)], (1.0, 2.0), "ab", 1, 2.5, True, np.float32(1),
         memoryview(np.ones(2, np.float32)), np.ones(2, np.float32), np.arange(2)]


@pytest.mark.parametrize("elem_type", FEED_TYPES, ids=TensorProto.DataType.Name)
def test_feeds_that_are_not_arrays_as_onnxruntime_takes_them(elem_type) -> None:
    """Lists are made arrays of the input's type; scalars, tuples, strings and buffers are
    refused, each as onnxruntime's binding does (a RuntimeError, the same text)."""
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem_type, None)],
                              [helper.make_tensor_value_info("y", elem_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(model.SerializeToString(), providers=NPU)
    for feed in FEEDS:
        try:
            want = theirs.run(None, {"x": feed})[0]
        except Exception as exc:  # noqa: BLE001 - compared below
            got = raised(lambda: ours.run(None, {"x": feed}))  # noqa: B023 - called here
            if type(exc) is RuntimeError:  # the binding's own: ours is RuntimeException
                assert isinstance(got, ep.RuntimeException), (feed, got)
            else:  # a status error: the same name
                assert type(got).__name__ == type(exc).__name__, (feed, exc, got)
            assert str(exc).split(" : ")[-1] in str(got), (feed, exc, got)
            continue
        got = ours.run(None, {"x": feed})[0]
        assert got.dtype == want.dtype and got.shape == want.shape, feed
        assert got.tolist() == want.tolist(), feed


def test_profiling_start_time_as_onnxruntime(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the profiles end_profiling writes
    model = two_outputs()
    for lib in (ort, ep):
        assert lib.InferenceSession(model, providers=["CPUExecutionProvider"]) \
            .get_profiling_start_time_ns() == 0
        options = lib.SessionOptions()
        options.enable_profiling = True
        before = time.time_ns()
        session = lib.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        assert before <= session.get_profiling_start_time_ns() <= time.time_ns()
        session.end_profiling()


SCALARS = st.one_of(st.integers(-300, 300), st.floats(-1e3, 1e3, allow_nan=False, width=32),
                    st.booleans())
LISTS = st.recursive(st.lists(SCALARS, max_size=4),
                     lambda inner: st.lists(inner, min_size=1, max_size=3), max_leaves=12)


@pytest.fixture(scope="module")
def identities() -> dict[int, tuple[Any, Any]]:
    sessions = {}
    for elem_type in FEED_TYPES:
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", elem_type, None)],
                                  [helper.make_tensor_value_info("y", elem_type, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        sessions[elem_type] = (
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
            ep.InferenceSession(model.SerializeToString(), providers=NPU))
    return sessions


@given(feed=LISTS, elem_type=st.sampled_from(FEED_TYPES))
@settings(max_examples=200)
def test_any_list_feed_is_what_onnxruntime_makes_of_it(identities, feed, elem_type) -> None:
    """Property: for any (possibly ragged) nested list of numbers and booleans, ep's run gives
    onnxruntime's array (dtype, shape, values) or refuses it as onnxruntime does."""
    theirs, ours = identities[elem_type]
    try:
        want = theirs.run(None, {"x": feed})[0]
    except Exception as exc:  # noqa: BLE001 - compared below
        got = raised(lambda: ours.run(None, {"x": feed}))
        assert type(got).__name__ == type(exc).__name__ or (
            type(exc) is RuntimeError and isinstance(got, ep.RuntimeException)), (exc, got)
        return
    got = ours.run(None, {"x": feed})[0]
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tolist() == want.tolist() or np.array_equal(got, want, equal_nan=True)


def test_run_async_calls_back_as_onnxruntime(sessions) -> None:
    """Results (or the failure's message) reach the callback from another thread, with the
    user data; a missing input is raised at the call, before any thread."""
    calls = []
    for session in sessions:
        done = threading.Event()
        got: list = []

        def callback(results, user_data, error, got=got, done=done) -> None:
            got.append((results, user_data, error))
            done.set()

        session.run_async(["y"], {"x": X}, callback, "data")
        assert done.wait(30)
        done.clear()
        session.run_async(["q"], {"x": X}, callback, 7)
        assert done.wait(30)
        calls.append(got)
        with pytest.raises(ValueError, match=r"Required inputs \(\['x'\]\) are missing"):
            session.run_async(None, {}, callback, None)
        with pytest.raises(TypeError):  # onnxruntime's binding refuses it at the call
            session.run_async(None, {"x": X}, 3, None)
    (theirs_ok, theirs_bad), (ours_ok, ours_bad) = calls
    np.testing.assert_array_equal(ours_ok[0][0], theirs_ok[0][0])
    assert ours_ok[1:] == theirs_ok[1:] == ("data", "")
    assert ours_bad[:2] == theirs_bad[:2] == ([], 7)
    assert ours_bad[2] == theirs_bad[2]  # onnxruntime's message, no prefix


@pytest.mark.parametrize("make", ["SessionOptions", "RunOptions"])
def test_a_misspelt_option_is_refused_as_onnxruntime(make) -> None:
    for lib in (ort, ep):
        options = getattr(lib, make)()
        with pytest.raises(AttributeError, match="enable_mem_patern"):
            options.enable_mem_patern = False
        options.log_severity_level = 3  # a real one is taken
        assert options.log_severity_level == 3


OPTION_VALUES = [("intra_op_num_threads", "x"), ("intra_op_num_threads", 2.5),
                 ("intra_op_num_threads", 2**40), ("intra_op_num_threads", True),
                 ("intra_op_num_threads", np.int64(2)), ("intra_op_num_threads", -1),
                 ("inter_op_num_threads", "x"), ("graph_optimization_level", 5),
                 ("graph_optimization_level", "x"), ("execution_mode", 1),
                 ("enable_profiling", "yes"), ("enable_profiling", 0.0),
                 ("enable_profiling", None), ("enable_mem_pattern", "no"),
                 ("log_severity_level", "x"), ("log_severity_level", 5),
                 ("log_severity_level", -2), ("log_verbosity_level", -3),
                 ("optimized_model_filepath", 3), ("profile_file_prefix", None),
                 ("logid", b"run"), ("use_deterministic_compute", np.bool_(True))]


@pytest.mark.parametrize(("name", "value"), OPTION_VALUES, ids=repr)
def test_session_option_values_as_onnxruntime_takes_them(name, value) -> None:
    """A value onnxruntime's setter refuses is a TypeError when set; one it takes is stored
    as it stores it; one its session creation refuses fails ours with the same words."""
    outcome = []
    for lib in (ort, ep):
        options = lib.SessionOptions()
        try:
            setattr(options, name, value)
        except TypeError as exc:
            outcome.append(("set", exc))
            continue
        stored = getattr(options, name)
        try:
            lib.InferenceSession(two_outputs(), options, providers=["CPUExecutionProvider"],
                                 enable_fallback=0)
        except Exception as exc:  # noqa: BLE001 - compared below
            outcome.append(("create", exc, stored))
            continue
        outcome.append(("ok", stored))
    (theirs, *t_rest), (ours, *o_rest) = outcome
    assert ours == theirs, outcome
    if theirs == "ok":
        assert o_rest[0] == t_rest[0] and type(o_rest[0]) is type(t_rest[0])  # as converted
    if theirs == "create":
        assert isinstance(o_rest[0], RuntimeError)
        assert str(t_rest[0]).split(". ")[-1].strip() in str(o_rest[0])  # its ends in "\n"
    if theirs == "set":
        assert name in str(o_rest[0]) and repr(value) in str(o_rest[0])


@pytest.mark.parametrize("source", ["bytearray", "memoryview", "directory", "missing"])
def test_model_sources_as_onnxruntime_takes_them(tmp_path, source) -> None:
    model = two_outputs()
    given = {"bytearray": bytearray(model), "memoryview": memoryview(model),
             "directory": str(tmp_path), "missing": str(tmp_path / "nope.onnx")}[source]
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(given, providers=["CPUExecutionProvider"])
    with pytest.raises(Exception) as ours:
        ep.InferenceSession(given, providers=NPU)
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value) == str(theirs.value)


WIDE = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
LAYOUTS = {
    "Fortran order": lambda: np.asfortranarray(WIDE[:2, :3]),
    "strided": lambda: WIDE[::2, ::2],
    "negative strides": lambda: WIDE[:2, :3][::-1, ::-1],
    "read-only": lambda: np.frombuffer(WIDE[:2, :3].tobytes(), np.float32).reshape(2, 3),
    "broadcast (zero strides)": lambda: np.broadcast_to(WIDE[0, :3], (2, 3)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_feeds_of_any_memory_layout_give_onnxruntimes_values(sessions, layout):
    reference, npu = sessions
    x = LAYOUTS[layout]()
    for got, want in zip(npu.run(None, {"x": x}), reference.run(None, {"x": x}), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_feed_in_non_native_byte_order_is_refused(sessions):
    """onnxruntime reads a big-endian array's bytes as little-endian and computes with those
    values, silently: the session refuses it, naming the type. Should onnxruntime ever read it
    right, the second assertion says so."""
    reference, npu = sessions
    swapped = X.astype(X.dtype.newbyteorder())
    with pytest.raises(ep.InvalidArgument, match="Unexpected input data type"):
        npu.run(None, {"x": swapped})
    assert not np.allclose(reference.run(None, {"x": swapped})[0],
                           reference.run(None, {"x": X})[0])


def test_memory_infos_and_tuning_results_as_onnxruntime_gives_them() -> None:
    """``get_input_memory_infos`` / ``get_output_memory_infos`` (host memory, as onnxruntime's
    CPU provider reads its inputs and writes its outputs) and the tuning results, which no
    provider here produces; onnxruntime's value classes are its own."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]
                             ).SerializeToString()
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(data)

    def described(infos: list) -> list:
        return [(i.name, i.allocator_type, i.device_id, i.mem_type, i.device_mem_type,
                 i.device_vendor_id) for i in infos]

    for method in ("get_input_memory_infos", "get_output_memory_infos"):
        assert described(getattr(ours, method)()) == described(getattr(theirs, method)())
    assert ours.get_tuning_results() == theirs.get_tuning_results() == []
    results = [{"ep": "NpuSimExecutionProvider", "results": {}, "validators": {}}]
    assert ours.set_tuning_results(results) is theirs.set_tuning_results([]) is None
    with pytest.raises(TypeError):
        theirs.set_tuning_results("bad")
    with pytest.raises(TypeError, match="must be a list of dicts"):
        ours.set_tuning_results("bad")
    for name in ("OrtDevice", "OrtMemoryInfo", "OrtMemType", "OrtAllocatorType", "OrtArenaCfg",
                 "OrtDeviceMemoryType", "OrtDeviceVendorId", "OrtMemoryInfoDeviceType"):
        assert getattr(ep, name) is getattr(ort, name), name
