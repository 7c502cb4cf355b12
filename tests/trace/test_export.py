"""Exports: the rules Perfetto's JSON importer applies, and ONNX Runtime's profile shape."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from npu_sim.errors import TraceError
from npu_sim.trace import export
from npu_sim.trace.exporters import EXPORTERS, Exporter, register


def _perfetto(trace, tmp_path):
    path = export(trace, "perfetto", tmp_path / "t.json")
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("name", ["tiny_cnn", "transformer_block", "mlp"])
def test_perfetto_json_follows_the_importer_rules(sample_traces, tmp_path, name):
    trace = sample_traces[name][1]
    doc = _perfetto(trace, tmp_path)
    events = doc["traceEvents"]
    pids = {e["pid"] for e in events}
    assert pids == {1}  # one process per device
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert len(set(names.values())) == len(names)  # one lane per engine
    assert {"host", "fw.q0", "dma0"} <= set(names.values())
    assert any(n.startswith("core0.") for n in names.values())

    # X slices on a tid nest: each one either ends before the next starts or contains it.
    slices = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["tid"] in names
            # Perfetto reads microseconds into integer nanoseconds.
            ts, dur = round(e["ts"] * 1000), round(e["dur"] * 1000)
            slices[e["tid"]].append((ts, ts + dur, e))
    for tid, spans in slices.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for start, end, _ in spans:
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], f"slices overlap on {names[tid]}"
            stack.append(end)

    # ts/dur are microseconds of the recorded cycles; cycles are kept in args.
    clock = trace.config.clock_ghz
    by_id = trace.by_id()
    for _, _, e in (s for spans in slices.values() for s in spans):
        rec = by_id[e["args"]["id"]]
        assert e["args"]["start_cycle"] == rec.start and e["args"]["cycles"] == rec.cycles
        assert e["ts"] == pytest.approx((rec.start - trace.start) / clock / 1000, abs=1e-3)
        assert e["dur"] == pytest.approx(rec.cycles / clock / 1000, abs=2e-3)

    # One flow per dependency edge; both ends bind to a slice on their tid.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    edges = sum(len(r.deps) for r in trace.records)
    assert len(starts) == len(ends) == edges and set(starts) == set(ends)

    def enclosed(e):
        return any(s <= round(e["ts"] * 1000) <= t for s, t, _ in slices[e["tid"]])

    for fid, s in starts.items():
        f = ends[fid]
        assert f["bp"] == "e" and s["ts"] <= f["ts"] and enclosed(s) and enclosed(f)

    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"HBM bandwidth (GB/s)", "DMA queue depth", "DMA bytes in flight"} <= counters
    depth = [e["args"]["value"] for e in events if e["name"] == "DMA queue depth"]
    assert min(depth) == 0 and max(depth) >= 1 and depth[-1] == 0


def test_ort_export_is_a_bare_array_of_integer_events(cnn_trace, tmp_path):
    path = export(cnn_trace, "ort", tmp_path / "p.json")
    with open(path) as f:
        events = json.load(f)
    assert isinstance(events, list)
    kernels = [r for r in cnn_trace.records if r.kind == "kernel"]
    nodes = [e for e in events if e["cat"] == "Node"]
    assert len(nodes) == len(kernels)
    for e, r in zip(nodes, kernels, strict=True):
        assert e["name"] == f"{r.work['node']}_kernel_time" and e["ph"] == "X"
        assert isinstance(e["ts"], int) and isinstance(e["dur"], int)
        assert e["args"]["op_name"] == r.work["op"]
    runs = [e for e in events if e["cat"] == "Session"]
    assert [e["name"] for e in runs] == ["model_run", "model_run"]


def test_unknown_format_is_a_typed_error(cnn_trace, tmp_path):
    with pytest.raises(TraceError, match="expected one of"):
        export(cnn_trace, "svg", tmp_path / "x")
    assert not list(tmp_path.iterdir())


def test_a_new_exporter_is_one_short_class(cnn_trace, tmp_path):
    @register
    class Kinds(Exporter):
        name = "kinds-test"

        def _events(self, trace):
            return sorted({r.kind for r in trace.records})

    try:
        path = export(cnn_trace, "kinds-test", tmp_path / "k.json")
        with open(path) as f:
            assert json.load(f) == ["command", "dma", "kernel", "sync"]
    finally:
        EXPORTERS.pop("kinds-test")
