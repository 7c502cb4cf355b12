"""``engine`` edges: a record that waited for a core or a DMA channel names who held it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_sim import Device, TensorSpec
from npu_sim.config import DeviceConfig
from npu_sim.trace import Recording, load, replay
from npu_sim.trace.analysis import format_report, report
from npu_sim.trace.control import engines_held
from tests.kernel_fixtures import fixed_cycles, registered_kernels

SPEC = TensorSpec((256,), "float32")
SMALL_CHUNKS = DeviceConfig.preset("npu-m").replace(dma_chunk_bytes=8192)  # transfers of chunks


def _hold(cycles):
    return ("TestHold" + str(cycles),
            (lambda inputs, attrs: [np.zeros(256, np.float32)], fixed_cycles(cycles)))


def _stitched(dev):
    dev.synchronize()
    rec = Recording(dev.config)
    rec.add_run("r", dev.trace.snapshot(), 0, dev.now)
    return rec.trace()


def _run(dev, launches, transfers):
    """Launch ``(cycles, cores, dep)`` kernels and ``(bytes, dep)`` d2d transfers, in turn;
    ``dep`` indexes an earlier launch or transfer (or is None)."""
    buf = dev.malloc(SPEC.nbytes)
    big = dev.malloc(1 << 16), dev.malloc(1 << 16)
    events = []
    for i in range(max(len(launches), len(transfers))):
        if i < len(launches):
            cycles, cores, dep = launches[i]
            deps = [events[dep]] if dep is not None and dep < len(events) else []
            events.append(dev.compute.execute(
                f"TestHold{cycles}", [(buf.address, SPEC)], [(buf.address, SPEC)], {},
                cores=cores, node=f"k{i}", functional=False, deps=deps))
        if i < len(transfers):
            nbytes, dep = transfers[i]
            deps = [events[dep]] if dep is not None and dep < len(events) else []
            events.append(dev.dma.transfer(big[0].address, big[1].address, nbytes,
                                           name=f"t{i}", deps=deps))
    return _stitched(dev)


CYCLES = (50, 130, 400)


@st.composite
def workloads(draw):
    launch = st.tuples(st.sampled_from(CYCLES),
                       st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
                       st.none() | st.integers(0, 12))
    transfer = st.tuples(st.integers(1, 1 << 10).map(lambda n: 64 * n),  # up to 64 KiB
                         st.none() | st.integers(0, 12))
    return (draw(st.lists(launch, min_size=1, max_size=8)),
            draw(st.lists(transfer, max_size=6)))


@settings(max_examples=40, deadline=None)
@given(workloads())
def test_every_engine_edge_names_an_earlier_holder_of_the_same_engine(work):
    with registered_kernels(dict(_hold(c) for c in CYCLES)):
        trace = _run(Device(SMALL_CHUNKS), *work)
        for rec, holders in _engine_edges(trace.records):
            # On the device every record that waited names a holder.
            assert bool(holders) == (rec.ready < rec.start)
        # Replay ignores the edges: without them it re-times the trace to the same cycles.
        stripped = dataclasses.replace(trace, records=tuple(
            dataclasses.replace(r, deps=tuple(d for d, w in r.edges if w != "engine"),
                                why=tuple(w for _, w in r.edges if w != "engine"))
            for r in trace.records))
        a, b = (replay(t, SMALL_CHUNKS, mode="elastic") for t in (trace, stripped))
        assert a.makespan == b.makespan == trace.makespan
        assert [(r.id, r.start, r.end) for r in a.records] == \
            [(r.id, r.start, r.end) for r in b.records]
        # ...and re-derives them from its own times: here the recorded ones, from either.
        assert [r.edges for r in a.records] == [r.edges for r in b.records] == \
            [r.edges for r in trace.records]
        # Under a config with one channel and one core the chunks and kernels queue up.
        narrow = replay(trace, SMALL_CHUNKS.replace(dma_channels=1, cores=1), mode="elastic")
        list(_engine_edges(narrow.records))


def _engine_edges(records):
    """Each record with its ``engine`` dependencies, checked: each an earlier record on an
    engine the record held, which ended after the record was ready and by its start."""
    by_id = {r.id: r for r in records}
    for rec in records:
        holders = [by_id[d] for d, why in rec.edges if why == "engine"]
        for dep in holders:
            assert dep.id < rec.id and rec.ready < dep.end <= rec.start
            assert set(engines_held(dep)) & set(engines_held(rec))
        yield rec, holders


def test_second_kernel_on_a_busy_core_waits_for_the_first():
    with registered_kernels(dict([_hold(400), _hold(50)])):
        dev = Device("npu-m")
        buf = dev.malloc(SPEC.nbytes)
        for cycles, node in ((400, "first"), (50, "second")):
            dev.compute.execute(f"TestHold{cycles}", [(buf.address, SPEC)],
                                [(buf.address, SPEC)], {}, cores=[0], node=node,
                                functional=False)
        trace = _stitched(dev)
    first, second = (r for r in trace.records if r.kind == "kernel")
    assert (first.name, second.name) == ("first", "second")
    assert second.ready == 0 and second.start == first.end == 400
    assert second.edges == ((first.id, "engine"),)
    assert first.edges == ()  # it waited for nothing
    # The critical path steps back through the engine edge.
    path = report(trace)["critical_path"]
    kernels = [p for p in path if p["kind"] == "kernel"]
    assert [(p["name"], p["via"]) for p in kernels] == [("first", None), ("second", "engine")]
    assert "second  (waited for core0 held by first)" in format_report(report(trace))


def test_a_schema_1_0_trace_without_engine_edges_still_loads_and_replays(tmp_path):
    sample = Path(__file__).parents[2] / "traces" / "tiny_cnn.trace.jsonl"
    text = sample.read_text(encoding="utf-8")
    assert text.startswith('{"format":"npu-sim-trace","schema":"1.1",')
    old = tmp_path / "old.trace.jsonl"
    old.write_text(text.replace('"schema":"1.1"', '"schema":"1.0"', 1), encoding="utf-8")
    now, then = load(sample), load(old)
    assert then.records == now.records
    assert replay(then, mode="elastic").makespan == replay(now, mode="elastic").makespan \
        == then.makespan
