"""onnx's backend node test cases through ep.backend: never below onnxruntime CPU.

Every node test case shipped with the installed onnx runs on ep (NPU, then CPU) and on
onnxruntime's CPU provider in the same test (about 35 s on one core, so CI runs all of them).
A case onnxruntime passes must pass on ep, except the known failures below, each with the
reason it fails; a known failure that starts passing fails the test too, so the list shrinks.
``python -m ep.testing.conformance`` regenerates docs/conformance.md from the same run.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import ep.backend
from ep.testing import conformance

KNOWN_FAILURES: dict[str, str] = {}
"""Case name -> why it fails on ep although onnxruntime passes it (none today)."""
MIN_ON_NPU = 450


@pytest.fixture(scope="module")
def results() -> list[conformance.CaseResult]:
    return conformance.run(conformance.node_cases())


def test_every_case_onnxruntime_passes_passes_on_ep(results):
    failed = {r.name: r.ep_error for r in results if r.status == "failed"}
    assert sorted(failed) == sorted(KNOWN_FAILURES), failed
    summary = conformance.summary(results)
    assert summary["passed"] + summary["failed"] + summary["skipped"] == len(results) > 1800
    assert summary["passed"] >= summary["onnxruntime_passed"] - len(KNOWN_FAILURES)


def test_the_npu_runs_a_node_in_enough_cases(results):
    assert conformance.summary(results)["on_npu"] >= MIN_ON_NPU


def test_report_lists_every_failure(results):
    text = conformance.report(results, 1.0)
    for r in results:
        if r.status == "failed":
            assert f"`{r.name}`" in text


def _relu_model():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (2, 3))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_backend_prepare_and_run():
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    rep = ep.backend.prepare(_relu_model())
    assert rep.session.get_node_assignment() == {"relu": "NpuSimExecutionProvider"}
    for feed in ([x], {"x": x}, x):
        np.testing.assert_array_equal(rep.run(feed)[0], np.maximum(x, 0))
    with pytest.raises(ep.InvalidArgument, match="2 inputs given"):
        rep.run([x, x])
    assert ep.backend.supports_device("CPU") and not ep.backend.supports_device("CUDA")
    with pytest.raises(ep.InvalidArgument, match="CUDA"):
        ep.backend.prepare(_relu_model(), "CUDA")
    node = helper.make_node("Add", ["a", "b"], ["c"])
    np.testing.assert_array_equal(ep.backend.run_node(node, [x, x])[0], x + x)
    cpu = ep.backend.prepare(_relu_model(), providers=["CPUExecutionProvider"])
    assert cpu.session.get_node_assignment() == {"relu": "CPUExecutionProvider"}
