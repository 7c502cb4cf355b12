"""Recording in a session: every run and partition, tagged edges, and end_profiling's files."""

from __future__ import annotations

import json
import os

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import ep
from ep.models import sample_input, tiny_cnn
from npu_sim.trace import load, replay


def _profiled(tmp_path, model, functional="0"):
    so = ep.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    return ep.InferenceSession(model.SerializeToString(), so, providers=[
        ("NpuSimExecutionProvider", {"device": "npu-s", "functional": functional})])


def test_session_accumulates_every_run(tmp_path):
    model = tiny_cnn()
    session = _profiled(tmp_path, model)
    feeds = sample_input(model, 0)
    cycles = []
    for _ in range(3):
        session.run(None, feeds)
        cycles.append(session.get_run_stats()["NpuSimExecutionProvider"]["cycles"])
    profile = session.end_profiling()
    assert profile.startswith(str(tmp_path / "prof_")) and profile.endswith(".json")
    trace = load(profile[:-5] + ".trace.jsonl")
    hosts = [r for r in trace.records if r.engine == "host"]
    assert len(hosts) == 3 and [h.cycles for h in hosts] == cycles
    assert trace.makespan == sum(cycles)
    assert trace.config.name == "npu-s" and trace.model == model.graph.name
    assert [r.id for r in trace.records] == list(range(len(trace.records)))
    # Later runs wait for the earlier ones: their first records depend on the host step.
    second = [r for r in trace.records if hosts[0].id < r.id < hosts[1].id and r.deps]
    assert any(hosts[0].id in r.deps for r in second)
    assert replay(trace).makespan == sum(cycles)  # the recorded timeline is consistent


def test_edges_are_tagged_with_why(cnn_trace):
    kinds = {why for r in cnn_trace.records for _, why in r.edges}
    assert {"barrier", "completion", "host", "data"} <= kinds
    by_id = cnn_trace.by_id()
    for r in cnn_trace.records:
        assert r.submit <= r.ready <= r.start <= r.end
        for d, why in r.edges:
            if why == "completion":  # a command completes with its device work
                assert r.kind in ("command", "sync") and by_id[d].end <= r.end
            if why == "barrier":
                assert by_id[d].kind == "command"


def test_arena_reuse_edges_are_told_apart_from_data():
    """Two chains whose buffers reuse each other's memory: the compiler orders them by
    anti-dependencies, which the trace tags ``arena`` (no byte flows along them)."""
    from ep.traces import record
    from npu_sim.config import DeviceConfig

    def t(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [64, 64])

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Neg", ["y"], ["d"]), helper.make_node("Exp", ["d"], ["e"]),
             helper.make_node("Add", ["b", "e"], ["z"])]
    graph = helper.make_graph(nodes, "g", [t("x"), t("y")], [t("z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    trace = record(model, DeviceConfig.preset("npu-m"))
    by_id = trace.by_id()
    arena = [(r, by_id[d]) for r in trace.records for d, why in r.edges if why == "arena"]
    assert arena, "expected arena-reuse edges"
    kernel_of = {r.id: by_id[d] for r in trace.records for d, why in r.edges
                 if why == "completion" and by_id[d].kind == "kernel"}
    for rec, dep in arena:
        later = rec if rec.kind == "kernel" else kernel_of[rec.id]
        earlier = kernel_of[dep.id]
        written = [(a, a + n) for a, n in earlier.work["writes"]]
        read = [(a, a + n) for a, n in later.work["reads"]]
        assert not any(lo < e and s < hi for lo, hi in written for s, e in read)


def test_profiling_off_writes_nothing(tmp_path):
    model = tiny_cnn()
    session = ep.InferenceSession(model.SerializeToString(), providers=[
        ("NpuSimExecutionProvider", {"functional": "0"})])
    session.run(None, sample_input(model, 0))
    assert session.end_profiling() == ""


def _ort_reference_profile(tmp_path) -> list[dict]:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu0")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "ort")
    s = ort.InferenceSession(model.SerializeToString(), so,
                             providers=["CPUExecutionProvider"])
    s.run(None, {"x": np.ones((2, 3), np.float32)})
    with open(s.end_profiling()) as f:
        return json.load(f)


def test_profile_has_onnxruntime_fields(tmp_path):
    reference = _ort_reference_profile(tmp_path)
    ref_node = next(e for e in reference if e["cat"] == "Node")
    model = tiny_cnn()
    session = _profiled(tmp_path, model)
    session.run(None, sample_input(model, 0))
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    assert isinstance(events, list) and os.path.exists(path[:-5] + ".trace.jsonl")
    nodes = [e for e in events if e["cat"] == "Node" and e["name"].endswith("_kernel_time")]
    assert nodes and {e["cat"] for e in events} <= {"Session", "Node"}
    for e in nodes:
        assert set(ref_node) <= set(e)  # cat, pid, tid, dur, ts, ph, name, args
        for key in ("op_name", "provider", "input_type_shape", "output_type_shape",
                    "node_index"):
            assert key in e["args"] and key in ref_node["args"]
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int)
        assert type(e["args"]["input_type_shape"]) is type(ref_node["args"]["input_type_shape"])
    convs = [e for e in nodes if e["args"]["op_name"] == "Conv"]
    assert convs and all(e["args"]["provider"] == "NpuSimExecutionProvider" for e in convs)
    assert {"float": [1, 3, 64, 64]} in [s for e in convs for s in e["args"]["input_type_shape"]]


def test_the_first_run_keeps_the_weight_uploads_its_kernels_waited_for(tmp_path):
    # With weight streaming the first run's kernels wait for uploads started at session
    # creation: the profile must hold them, or replay would start those kernels too early.
    model = tiny_cnn()
    session = _profiled(tmp_path, model)
    session.run(None, sample_input(model, 0))
    first = session.get_run_stats()["NpuSimExecutionProvider"]["cycles"]
    trace = load(session.end_profiling()[:-len(".json")] + ".trace.jsonl")
    by_id = {r.id: r for r in trace.records}
    uploads = {r.id for r in trace.records if r.kind == "dma" and r.name.startswith("h2d#")}
    waited = [r for r in trace.records if r.kind == "kernel" and uploads & set(r.deps)]
    assert uploads and waited
    assert all(d in by_id for r in trace.records for d in r.deps)
    assert replay(trace, mode="recorded").makespan == first


def test_an_upload_that_lands_after_the_run_it_started_in_keeps_its_chain(tmp_path):
    """Streamed weights upload one after another while the runs go on: one that started during
    a run and landed after it is recorded with the next run, chained to the upload before it.
    That edge was dropped (it points into the earlier run), and the upload got a host edge on
    the earlier run's end, which it started before: replay refused the trace as edited."""
    f, pair = TensorProto.FLOAT, [1, 1, 2]

    def const(name, values, shape=(1, 1, 2)):
        return numpy_helper.from_array(np.array(values, np.float32).reshape(shape), name)

    nodes = [helper.make_node("Relu", ["x"], ["t0"]), helper.make_node("Add", ["w0", "x"], ["t1"]),
             helper.make_node("Relu", ["x"], ["t2"]),
             helper.make_node("LayerNormalization", ["x", "w1", "w2"], ["t3"], axis=-1),
             helper.make_node("Add", ["w3", "x"], ["t4"]),
             helper.make_node("Add", ["w4", "x"], ["t5"])]
    graph = helper.make_graph(
        nodes, "streamed", [helper.make_tensor_value_info("x", f, pair)],
        [helper.make_tensor_value_info(f"t{k}", f, pair) for k in range(6)],
        initializer=[const("w0", [0.09, -0.26]), const("w1", [1.0, 1.1], (2,)),
                     const("w2", [0.0, 0.05], (2,)), const("w3", [0.17, 0.41]),
                     const("w4", [0.06, -0.07])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    so = ep.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    session = ep.InferenceSession(model.SerializeToString(), so,
                                  providers=["NpuSimExecutionProvider", "CPUExecutionProvider"])
    for _ in range(2):
        session.run(None, {"x": np.array([[[0.1, -0.1]]], np.float32)})
    trace = load(session.end_profiling()[:-len(".json")] + ".trace.jsonl")
    hosts = [r.id for r in trace.records if r.engine == "host"]
    by_id = {r.id: r for r in trace.records}
    straddling = [r for r in trace.records if r.kind == "dma" and r.start < by_id[hosts[0]].end
                  < r.end and r.id > hosts[0]]
    assert straddling, "no upload outlived the first run: the case is not exercised"
    for r in straddling:
        assert hosts[0] not in r.deps and any(d < hosts[0] for d in r.deps)
    assert replay(trace, mode="recorded").makespan == trace.makespan
    assert replay(trace, trace.config, "elastic").makespan == trace.makespan
