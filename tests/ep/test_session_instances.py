"""Several instances of one compiled model (PPLNN's ``CreateRuntime``): each with its own
activations, all reading one device copy of the weights, run from many threads."""

from __future__ import annotations

import gc

import numpy as np
import onnx
from onnx import TensorProto, helper

import ep
from tests.ep.npusim_graphs import model, ort_run, rng
from tests.threads import run_together

NPU = "NpuSimExecutionProvider"


def two_npu_partitions(k: int = 64) -> onnx.ModelProto:
    """x -> MatMul w1 -> Softsign (CPU) -> MatMul w2 -> y, plus h, the first MatMul's result."""
    r = rng(5)
    inits = {"w1": r.normal(0, 0.2, (k, k)).astype(np.float32),
             "w2": r.normal(0, 0.2, (k, k)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Softsign", ["h"], ["s"], name="soft"),
             helper.make_node("MatMul", ["s", "w2"], ["y"], name="mm2")]
    F = TensorProto.FLOAT
    return model(nodes, [("x", F, (8, k))], [("y", F, (8, k)), ("h", F, (8, k))], inits)


def stats(session: ep.InferenceSession) -> dict:
    return session._providers[0].runtime.firmware.stats()


def test_instances_share_the_weights_and_have_their_own_activations():
    source = two_npu_partitions()
    session = ep.InferenceSession(source.SerializeToString(), providers=[NPU])
    assert set(session.get_node_assignment().values()) == {NPU, "CPUExecutionProvider"}
    before = stats(session)
    weights = sum(onnx.numpy_helper.to_array(t).nbytes for t in source.graph.initializer)
    assert before["hbm.weights.bytes"] == weights
    instances = [session.create_instance() for _ in range(3)]
    after = stats(session)
    assert after["hbm.weights.bytes"] == weights  # still one copy
    assert after["hbm.weights.references"] == 4 * before["hbm.weights.references"]
    grown = after["hbm.bytes_in_use"] - before["hbm.bytes_in_use"]
    assert 0 < grown < weights  # three arenas, no weight
    feed = {"x": rng(1).normal(0, 1, (8, 64)).astype(np.float32)}
    want = ort_run(source, feed)
    for runner in (session, *instances):
        for got, ref in zip(runner.run(None, feed), want, strict=True):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # Partial runs work on an instance too.
    (h,) = instances[0].run(["h"], feed)
    np.testing.assert_allclose(h, want[1], rtol=1e-5, atol=1e-6)
    del instances, runner
    gc.collect()
    assert stats(session)["hbm.bytes_in_use"] == before["hbm.bytes_in_use"]
    assert stats(session)["hbm.weights.references"] == before["hbm.weights.references"]


def test_eight_threads_on_a_session_and_its_instances_get_the_serial_results():
    source = two_npu_partitions()
    session = ep.InferenceSession(source.SerializeToString(), providers=[NPU])
    runners = [session, *(session.create_instance() for _ in range(3))]
    feeds = [{"x": rng(100 + i).normal(0, 1, (8, 64)).astype(np.float32)} for i in range(8)]
    serial = [session.run(None, feed) for feed in feeds]
    results: dict[tuple[int, int], list[np.ndarray]] = {}

    def work(t: int) -> None:
        for r in range(6):
            k = (t + r) % 8
            results[(t, r)] = runners[(t + r) % len(runners)].run(None, feeds[k])

    run_together(work, 8)
    assert len(results) == 48
    for (t, r), outputs in results.items():
        for got, want in zip(outputs, serial[(t + r) % 8], strict=True):
            np.testing.assert_array_equal(got, want)
