"""IOBinding and OrtValue runs (ep.framework.io_binding) against the installed onnxruntime on
the same model: the same outputs, written where they are bound, and the same refusals."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ep

NPU = ["NpuSimExecutionProvider", "CPUExecutionProvider"]
X = np.array([[-1.5, 2.0, 0.5], [3.0, -4.0, 1.0]], np.float32)


def relu_and_sum() -> bytes:
    """y = Relu(x) (2x3), s = ReduceSum(y) over axis 1 (2): two outputs, on the NPU."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"]),
         helper.make_node("ReduceSum", ["y", "axes"], ["s"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [2])], [axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def both() -> list:
    ours = ep.InferenceSession(relu_and_sum(), providers=NPU, enable_fallback=0)
    assert set(ours.get_node_assignment().values()) == {"NpuSimExecutionProvider"}
    return [ort.InferenceSession(relu_and_sum(), providers=["CPUExecutionProvider"]), ours]


def each(both: list, act: Callable) -> list:
    """``act(session)`` on onnxruntime's and ours: its result, or the exception raised."""
    out = []
    for session in both:
        try:
            out.append(act(session))
        except Exception as exc:  # noqa: BLE001 - compared by the caller
            out.append(exc)
    return out


def test_allocated_outputs_in_the_order_bound(both) -> None:
    def act(session):
        binding = session.io_binding()
        binding.bind_cpu_input("x", X)
        binding.bind_output("s")
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        got = [v.numpy() for v in binding.get_outputs()]
        assert all(isinstance(v, ort.OrtValue) for v in binding.get_outputs())
        copied = binding.copy_outputs_to_cpu()
        for a, b in zip(got, copied, strict=True):
            np.testing.assert_array_equal(a, b)
        return got

    theirs, ours = each(both, act)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_outputs_written_into_bound_memory(both) -> None:
    def act(session):
        y, s = np.full((2, 3), 7, np.float32), ort.OrtValue.ortvalue_from_numpy(
            np.full(2, 7, np.float32))
        binding = session.io_binding()
        binding.bind_input("x", "cpu", 0, np.float32, list(X.shape), X.ctypes.data)
        binding.bind_output("y", "cpu", 0, np.float32, [2, 3], y.ctypes.data)
        binding.bind_ortvalue_output("s", s)
        session.run_with_iobinding(binding)
        return y.copy(), s.numpy()

    theirs, ours = each(both, act)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_a_rebound_input_and_an_ortvalue_input(both) -> None:
    def act(session):
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(X))
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        first = binding.copy_outputs_to_cpu()[0]
        binding.bind_cpu_input("x", -X)
        session.run_with_iobinding(binding)
        return first, binding.copy_outputs_to_cpu()[0]

    theirs, ours = each(both, act)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["unknown input", "no output", "wrong output shape",
                                  "npu device", "inputs cleared"])
def test_refusals_as_in_onnxruntime(both, case) -> None:
    def act(session):
        binding = session.io_binding()
        if case == "unknown input":
            binding.bind_cpu_input("q", X)
        elif case == "npu device":
            binding.bind_input("x", "npu", 0, np.float32, [2, 3], X.ctypes.data)
        binding.bind_cpu_input("x", X)
        if case == "wrong output shape":
            buffer = np.zeros(3, np.float32)
            binding.bind_output("s", "cpu", 0, np.float32, [3], buffer.ctypes.data)
        elif case != "no output":
            binding.bind_output("s")
        if case == "inputs cleared":
            binding.clear_binding_inputs()
        session.run_with_iobinding(binding)

    theirs, ours = each(both, act)
    assert isinstance(theirs, RuntimeError), theirs  # onnxruntime's binding: plain
    assert isinstance(ours, RuntimeError), ours
    if case in ("unknown input", "no output"):
        assert str(theirs) in str(ours)
    # the session is unchanged
    np.testing.assert_array_equal(both[1].run(["y"], {"x": X})[0], np.maximum(X, 0))


def test_run_with_ort_values(both) -> None:
    def act(session):
        values = session.run_with_ort_values(["s", "y"],
                                             {"x": ort.OrtValue.ortvalue_from_numpy(X)})
        assert all(isinstance(v, ort.OrtValue) for v in values)
        return [v.numpy() for v in values]

    theirs, ours = each(both, act)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(TypeError, match="must be an OrtValue"):
        both[1].run_with_ort_values(None, {"x": X})
    assert ep.OrtValue is ort.OrtValue


@pytest.mark.parametrize(("element_type", "shape", "pointer"), [
    (np.float32, [2, 3], 0), (np.float32, [2, 3], -8), (np.float32, [2, 3], "0x10"),
    (np.float32, [2, -3], None), (np.float32, "23", None), (object, [2, 3], None),
    ("not a type", [2, 3], None)], ids=repr)
def test_a_binding_that_cannot_be_memory_is_refused(both, element_type, shape, pointer) -> None:
    """Never read: a null or negative address, a negative dimension, an element type without
    a size; each is onnxruntime's RuntimeError class with what was wrong."""
    binding = both[1].io_binding()
    with pytest.raises(ep.RuntimeException, match="Error when binding input"):
        binding.bind_input("x", "cpu", 0, element_type, shape,
                           X.ctypes.data if pointer is None else pointer)
    with pytest.raises(ep.RuntimeException, match="Error when binding output"):
        binding.bind_output("y", "cpu", 0, element_type, shape,
                            X.ctypes.data if pointer is None else pointer)


def scribble() -> list[np.ndarray]:
    """Allocate and fill what a freed output's memory would be reused for."""
    return [np.full(n, 777.0, np.float32) for n in (2, 6) for _ in range(200)]


def test_an_output_array_outlives_its_ortvalue(both) -> None:
    """``[v.numpy() for v in ...run_with_ort_values(...)]``, and the same of a binding's
    outputs: onnxruntime's arrays view memory the ``OrtValue`` owns, kept alive by the view.
    The session's ``OrtValue``s viewed arrays only the Python object held, so the arrays
    read freed memory once the list of ``OrtValue``s was dropped."""
    def act(session):
        arrays = [v.numpy() for v in session.run_with_ort_values(
            ["s", "y"], {"x": ort.OrtValue.ortvalue_from_numpy(X)})]
        binding = session.io_binding()
        binding.bind_cpu_input("x", X)
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        arrays += [v.numpy() for v in binding.get_outputs()]
        del binding
        scribble()
        return [a.copy() for a in arrays]

    theirs, ours = each(both, act)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("feed", [X, X.astype(np.float64), X[:1], X.T], ids=[
    "float32", "float64", "one-row", "transposed"])
def test_run_takes_ortvalue_feeds_as_onnxruntime_does(both, feed) -> None:
    """onnxruntime's ``run`` takes an ``OrtValue`` for a tensor input, checked as an array."""
    theirs, ours = each(both, lambda s: s.run(None, {"x": ort.OrtValue.ortvalue_from_numpy(
        np.ascontiguousarray(feed))}))
    if isinstance(theirs, Exception):
        assert type(ours).__name__ == type(theirs).__name__
        assert ours.message in str(theirs)
    else:
        for a, b in zip(ours, theirs, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def cast_to(elem_type: int) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=elem_type)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", elem_type, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]) \
        .SerializeToString()


@pytest.mark.parametrize("elem_type", [TensorProto.FLOAT16, TensorProto.FLOAT8E4M3FN,
                                       TensorProto.INT64, TensorProto.BOOL],
                         ids=["float16", "float8e4m3fn", "int64", "bool"])
def test_an_output_ortvalue_has_the_output_type(elem_type) -> None:
    """A float8 output is an ``OrtValue`` of ``tensor(float8e4m3fn)`` (its array uint8), as
    onnxruntime's: the session's said ``tensor(uint8)``."""
    x = ort.OrtValue.ortvalue_from_numpy(np.array([1.5, 2.0], np.float32))
    got = []
    for lib in (ort, ep):
        session = lib.InferenceSession(cast_to(elem_type), providers=["CPUExecutionProvider"])
        value = session.run_with_ort_values(None, {"x": x})[0]
        got.append((value.data_type(), value.numpy().dtype, value.numpy().tolist()))
    assert got[1] == got[0]


def test_a_string_output_is_an_array_not_an_ortvalue() -> None:
    """onnxruntime's Python API makes no string ``OrtValue``: ``run_with_ort_values`` and a
    binding's ``get_outputs`` refuse a string output (``NotImplemented``, naming it), where
    onnxruntime returns one; ``run`` and ``copy_outputs_to_cpu`` give onnxruntime's strings
    (its own ``copy_outputs_to_cpu`` of a string output crashes the process, 1.32: compared
    with its ``get_outputs()[0].numpy()``)."""
    model = cast_to(TensorProto.STRING)
    x = np.array([1.5, 2.0], np.float32)
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(model, providers=["CPUExecutionProvider"])
    with pytest.raises(ep.NotImplemented, match="output 'y' is a string tensor"):
        ours.run_with_ort_values(None, {"x": ort.OrtValue.ortvalue_from_numpy(x)})
    outputs = []
    for session in (theirs, ours):
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y")
        session.run_with_iobinding(binding)
        outputs.append(binding)
    want = outputs[0].get_outputs()[0].numpy().tolist()
    assert outputs[1].copy_outputs_to_cpu()[0].tolist() == want
    assert ours.run(None, {"x": x})[0].tolist() == want
    with pytest.raises(ep.NotImplemented, match="output 'y' is a string tensor"):
        outputs[1].get_outputs()
