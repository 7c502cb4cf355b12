"""onnxruntime's EP-error fallback (ep.framework.fallback): a run that fails with EPFail runs
again on CPUExecutionProvider, once, printing what onnxruntime prints; compared with the
installed onnxruntime on the same model and feeds."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ep
from tests.ep.test_session import mixed_model
from tests.ep.toy_ep import ToyExecutionProvider

NPU = ["NpuSimExecutionProvider", "CPUExecutionProvider"]
GOOD, BAD = {"i": np.array([0, 3])}, {"i": np.array([0, 7])}  # 7: out of range for 4 rows


def gather() -> bytes:
    """Gather from a 4x3 initializer at fed indices: on the NPU, an index out of range faults
    the device (EPFail); onnxruntime's CPU provider refuses it (InvalidArgument)."""
    data = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "data")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "i"], ["y"], name="gather")], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [data])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def refusal(session, feeds) -> BaseException:
    with pytest.raises(Exception) as info:
        session.run(None, feeds)
    return info.value


def test_a_device_fault_runs_again_on_the_cpu_as_in_onnxruntime(capsys) -> None:
    theirs = ort.InferenceSession(gather(), providers=["CPUExecutionProvider"])
    ours = ep.InferenceSession(gather(), providers=NPU)
    assert ours.get_node_assignment() == {"gather": "NpuSimExecutionProvider"}
    want = refusal(theirs, BAD)
    capsys.readouterr()
    got = refusal(ours, BAD)  # the NPU faults, the CPU refuses as onnxruntime does
    printed = capsys.readouterr().out.splitlines()
    assert type(got).__name__ == type(want).__name__ == "InvalidArgument"
    assert "indices element out of data bounds, idx=7" in str(got)
    assert printed[0].startswith("EP Error: [ONNXRuntimeError] : 11 : EP_FAIL : NpuSim: ")
    assert "Gather: index 7 is out of range" in printed[0]
    assert printed[0].endswith(f" using {NPU}")
    assert printed[1:] == ["Falling back to ['CPUExecutionProvider'] and retrying."]
    # the session now runs on the CPU, and falls back no more
    assert ours.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(ours.run(None, GOOD)[0], theirs.run(None, GOOD)[0])
    assert isinstance(refusal(ours, BAD), ep.InvalidArgument)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("how", ["enable_fallback=0", "disable_fallback()"])
def test_without_the_fallback_the_device_fault_is_raised(how, capsys) -> None:
    if how == "enable_fallback=0":
        ours = ep.InferenceSession(gather(), providers=NPU, enable_fallback=0)
    else:
        ours = ep.InferenceSession(gather(), providers=NPU)
        ours.disable_fallback()
    error = refusal(ours, BAD)
    assert type(error) is ep.EPFail and "Gather: index 7 is out of range" in str(error)
    assert capsys.readouterr().out == ""
    assert ours.get_providers() == NPU  # the session is as it was, and runs again
    np.testing.assert_array_equal(ours.run(None, GOOD)[0], np.array([[0, 1, 2], [9, 10, 11]],
                                                                     np.float32))
    ours.enable_fallback()
    assert isinstance(refusal(ours, BAD), ep.InvalidArgument)
    assert "Falling back" in capsys.readouterr().out
    assert ours.get_providers() == ["CPUExecutionProvider"]


def test_set_providers_creates_the_session_again() -> None:
    session = ep.InferenceSession(gather(), providers=["CPUExecutionProvider"])
    want = session.run(None, GOOD)[0]
    session.set_providers(NPU)
    assert session.get_providers() == NPU
    assert session.get_node_assignment() == {"gather": "NpuSimExecutionProvider"}
    np.testing.assert_array_equal(session.run(None, GOOD)[0], want)
    with pytest.raises(TypeError):  # a failed re-creation leaves the session as it was
        session.set_providers(3)
    assert session.get_providers() == NPU
    np.testing.assert_array_equal(session.run(None, GOOD)[0], want)


def test_a_bad_model_is_raised_without_a_fallback(capsys) -> None:
    """onnxruntime's status errors are not what its Python layer retries: nothing printed."""
    for lib, error in ((ort, Exception), (ep, ep.InvalidProtobuf)):
        with pytest.raises(error) as info:
            lib.InferenceSession(b"not a model")
        assert type(info.value).__name__ == "InvalidProtobuf"
    assert capsys.readouterr().out == ""


def with_disabled_cpu_fallback(value: str = "1") -> tuple:
    options = []
    for lib in (ort, ep):
        so = lib.SessionOptions()
        so.log_severity_level = 3
        so.add_session_config_entry("session.disable_cpu_ep_fallback", value)
        options.append(so)
    return tuple(options)


@pytest.mark.parametrize("named", [False, True], ids=["cpu not named", "cpu named"])
def test_disabled_cpu_ep_fallback_refuses_cpu_nodes_as_onnxruntime(named) -> None:
    """A node on the CPU provider fails the session (FAIL); the CPU provider named together
    with the option is a conflict (INVALID_ARGUMENT); the same words as onnxruntime's. Ours
    keeps the Gather on the CPU by the NPU's ``cpu_nodes`` option when the CPU is not named."""
    theirs_so, ours_so = with_disabled_cpu_fallback()
    cpu = ["CPUExecutionProvider"]
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(gather(), theirs_so, providers=cpu if named else None)
    with pytest.raises(ep.OrtError) as ours:
        ep.InferenceSession(gather(), ours_so, providers=cpu if named else [
            ("NpuSimExecutionProvider", {"cpu_nodes": "gather"})])
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value) == str(theirs.value)


def test_disabled_cpu_ep_fallback_lets_a_model_all_on_the_npu_run() -> None:
    _, options = with_disabled_cpu_fallback()
    session = ep.InferenceSession(gather(), options, providers=["NpuSimExecutionProvider"])
    assert session.get_node_assignment() == {"gather": "NpuSimExecutionProvider"}
    np.testing.assert_array_equal(session.run(None, GOOD)[0], [[0, 1, 2], [9, 10, 11]])


def test_other_values_leave_the_cpu_ep_fallback_on_as_in_onnxruntime() -> None:
    theirs_so, ours_so = with_disabled_cpu_fallback("yes")
    want = ort.InferenceSession(gather(), theirs_so,
                                providers=["CPUExecutionProvider"]).run(None, GOOD)[0]
    ours = ep.InferenceSession(gather(), ours_so, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ours.run(None, GOOD)[0], want)


class _Failing(ToyExecutionProvider):
    """A provider whose own code raises a plain Python exception in ``where``."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def get_capability(self, graph):
        if self.where == "get_capability":
            raise KeyError("a bug in get_capability")
        return super().get_capability(graph)

    def compile(self, fused_nodes):
        if self.where == "compile":
            raise ValueError("a bug in compile")
        return super().compile(fused_nodes)


@pytest.mark.parametrize("where", ["get_capability", "compile"])
def test_a_providers_own_exception_is_its_eps_failure(where, capsys) -> None:
    """EPFail naming the provider and the call, chained to the exception, not retried on the
    CPU provider: what onnxruntime makes of an EP returning a failed status."""
    with pytest.raises(ep.EPFail, match=f"ToyExecutionProvider.{where} raised") as info:
        ep.InferenceSession(mixed_model().SerializeToString(), providers=[_Failing(where)])
    assert isinstance(info.value.__cause__, (KeyError, ValueError))
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", ["abc", None, [1]], ids=repr)
def test_an_unreadable_enable_fallback_is_refused_as_in_onnxruntime(value) -> None:
    with pytest.raises(Exception) as theirs:
        ort.InferenceSession(gather(), enable_fallback=value)
    with pytest.raises(Exception) as ours:
        ep.InferenceSession(gather(), providers=NPU, enable_fallback=value)
    assert type(ours.value) is type(theirs.value)
    assert repr(value) in str(ours.value)
