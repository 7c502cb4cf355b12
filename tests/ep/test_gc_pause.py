"""The cyclic collector is paused while a session is created, and left as it was after."""

from __future__ import annotations

import gc
import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ep
from ep.errors import NoSuchFile
from ep.framework import session as session_module
from ep.framework.gc_pause import PausedCollector, creation


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_back_on_after_nested_exits():
    pause = PausedCollector()
    with pause:
        assert not gc.isenabled()
        with pause:
            assert not gc.isenabled() and pause.depth == 2
        assert not gc.isenabled()  # the outer creation is still inside
    assert gc.isenabled() and pause.depth == 0


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    with PausedCollector():
        pass
    assert not gc.isenabled()


def test_an_exception_inside_turns_it_back_on():
    pause = PausedCollector()

    @pause
    def fails() -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        fails()
    assert gc.isenabled() and pause.depth == 0


def test_overlapping_threads_leave_it_on_only_when_the_last_one_leaves():
    pause = PausedCollector()
    inside, release = threading.Barrier(2), threading.Event()
    seen: list[bool] = []

    def worker() -> None:
        with pause:
            inside.wait()
            release.wait()

    thread = threading.Thread(target=worker)
    thread.start()
    with pause:
        inside.wait()
    seen.append(gc.isenabled())  # the worker is still inside
    release.set()
    thread.join()
    assert seen == [False] and gc.isenabled() and pause.depth == 0


def _model(tmp_path) -> str:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    return str(path)


def test_session_creation_runs_with_the_collector_paused(tmp_path, monkeypatch):
    seen: list[bool] = []
    construct = session_module.construct

    def spying(*args, **kwargs):
        seen.append(gc.isenabled())
        return construct(*args, **kwargs)

    monkeypatch.setattr(session_module, "construct", spying)
    path = _model(tmp_path)
    sess = ep.InferenceSession(path)
    x = np.array([-1, 2, -3, 4], np.float32)
    assert seen == [False] and gc.isenabled() and creation.depth == 0
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want[0])


def test_a_failed_creation_leaves_the_collector_on(tmp_path):
    with pytest.raises(NoSuchFile):
        ep.InferenceSession(str(tmp_path / "missing.onnx"))
    assert gc.isenabled() and creation.depth == 0
