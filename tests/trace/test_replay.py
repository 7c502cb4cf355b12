"""Replay: the recorded makespan exactly, and elastic replay against re-simulation."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ep.traces import CONFIG_CHANGES, compiler_split, simulate
from npu_sim.errors import TraceError
from npu_sim.trace import Trace, replay


@pytest.mark.parametrize("name", ["tiny_cnn", "transformer_block", "mlp"])
def test_recorded_mode_gives_back_the_recorded_makespan(sample_traces, name):
    trace = sample_traces[name][1]
    result = replay(trace, mode="recorded")
    assert result.makespan == trace.makespan == trace.end - trace.start
    assert result.records == trace.records and not result.flags


@pytest.mark.parametrize("name", ["tiny_cnn", "transformer_block", "mlp"])
def test_elastic_under_the_recording_config_reproduces_it(sample_traces, name):
    trace = sample_traces[name][1]
    result = replay(trace, trace.config, "elastic")
    assert result.makespan == trace.makespan
    assert [(r.id, r.start, r.end) for r in result.records] == \
        [(r.id, r.start - trace.start, r.end - trace.start) for r in trace.records]


@pytest.mark.parametrize("change", list(CONFIG_CHANGES))
@pytest.mark.parametrize("name", ["tiny_cnn", "transformer_block", "mlp"])
def test_elastic_replay_matches_resimulation(sample_traces, base_config, name, change):
    model, trace = sample_traces[name]
    config = base_config.replace(**CONFIG_CHANGES[change])
    want = simulate(model, config, runs=2)  # the trace holds two runs
    got = replay(trace, config, "elastic", split=compiler_split).makespan
    assert abs(got - want) <= 0.02 * want, f"{name} {change}: replay {got}, simulated {want}"


def test_compiler_dependent_changes_are_flagged(cnn_trace, base_config):
    kept = replay(cnn_trace, base_config.replace(cores=2), "elastic")
    assert any("compiler-dependent: cores" in f for f in kept.flags)
    assert not replay(cnn_trace, base_config.replace(hbm_gbps=900.0), "elastic").flags


def test_rechunked_transfers_keep_ids_that_others_depend_on(cnn_trace, base_config):
    result = replay(cnn_trace, base_config.replace(dma_chunk_bytes=4096), "elastic")
    by_id = {r.id: r for r in result.records}
    for r in result.records:
        assert all(d in by_id for d in r.deps)
    chunks = [r for r in result.records if r.kind == "dma"]
    assert len(chunks) > len([r for r in cnn_trace.records if r.kind == "dma"])
    assert all(r.work["bytes"] <= 4096 for r in chunks)
    assert len({r.id for r in result.records}) == len(result.records)


def test_energy_is_carried_when_kernels_report_it(cnn_trace):
    records = tuple(dataclasses.replace(r, work={**r.work, "energy": {"array": 2.0}})
                    if r.kind == "kernel" else r for r in cnn_trace.records)
    kernels = sum(r.kind == "kernel" for r in records)
    dma = [r.work["energy"] for r in records if r.kind == "dma"]
    assert dma and all(e["hbm"] > 0 for e in dma)  # DMA chunks price their own energy
    result = replay(Trace(cnn_trace.config, records, "m"), mode="recorded")
    assert result.energy["array"] == 2.0 * kernels
    for part in ("hbm", "host_link"):
        assert result.energy[part] == pytest.approx(sum(e.get(part, 0.0) for e in dma))


def test_elastic_replay_reprices_energy_under_the_new_config(cnn_trace, base_config):
    same = replay(cnn_trace, base_config, "elastic")
    assert same.energy == pytest.approx(replay(cnn_trace, mode="recorded").energy)
    # DMA energy is linear in the bytes: re-chunking keeps it; a dearer link scales it
    rechunked = replay(cnn_trace, base_config.replace(dma_chunk_bytes=4096), "elastic")
    assert rechunked.energy["host_link"] == pytest.approx(same.energy["host_link"])
    dear = base_config.replace(host_link_pj_per_byte=2 * base_config.host_link_pj_per_byte)
    assert replay(cnn_trace, dear, "elastic").energy["host_link"] == pytest.approx(
        2 * same.energy["host_link"])


@settings(max_examples=25, deadline=None)
@given(hbm=st.floats(20.0, 4000.0), link=st.floats(1.0, 200.0), ch=st.integers(1, 16),
       chunk=st.sampled_from([4096, 65536, 10 << 20]))
def test_elastic_replay_invariants(cnn_trace, hbm, link, ch, chunk):
    """Under any config: dependencies respected, no engine double-booked, makespan spans it."""
    config = cnn_trace.config.replace(hbm_gbps=hbm, host_link_gbps=link, dma_channels=ch,
                                      dma_chunk_bytes=chunk)
    result = replay(cnn_trace, config, "elastic")
    by_id = {r.id: r for r in result.records}
    for r in result.records:
        for d, why in r.edges:
            limit = r.end if why == "completion" else r.start
            assert limit >= by_id[d].end
    lanes: dict[str, list] = {}
    for r in result.records:
        if r.kind == "kernel":
            for c in r.work["core_ids"]:
                lanes.setdefault(f"core{c}", []).append((r.start, r.end))
        elif r.kind == "dma":
            lanes.setdefault(r.engine, []).append((r.start, r.end))
    for spans in lanes.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert result.makespan == max(r.end for r in result.records)
    assert all(0 <= u <= 1 for u in result.utilization.values())


def test_edited_timeline_is_refused_by_recorded_replay(cnn_trace):
    target = next(r for r in cnn_trace.records if r.kind == "kernel" and r.deps)
    early = dataclasses.replace(target, start=0, submit=0, ready=0)
    edited = Trace(cnn_trace.config, tuple(early if r.id == target.id else r
                                           for r in cnn_trace.records))
    with pytest.raises(TraceError, match=f"record {target.id}.*before its"):
        replay(edited, mode="recorded")


def test_bad_arguments_are_typed(cnn_trace):
    with pytest.raises(TraceError, match="mode='fast'"):
        replay(cnn_trace, mode="fast")
    with pytest.raises(TraceError, match="expected a DeviceConfig"):
        replay(cnn_trace, "npu-m", mode="elastic")


def test_replay_and_export_stay_functions_after_their_modules_load():
    import npu_sim.trace
    import npu_sim.trace.exporters  # noqa: F401
    import npu_sim.trace.retime  # noqa: F401

    assert callable(npu_sim.trace.replay) and callable(npu_sim.trace.export)


def test_a_run_shifted_and_appended_replays_as_two_runs(cnn_trace):
    """Records are data: a fast path may re-emit a run's records shifted in time."""
    from npu_sim.trace import Recording

    run = [r for r in cnn_trace.records if r.id < next(
        h.id for h in cnn_trace.records if h.engine == "host")]
    span = cnn_trace.records[len(run)].cycles
    start = cnn_trace.records[len(run)].start
    rec = Recording(cnn_trace.config, "m")
    rec.add_run("a", run, start, start + span)
    rec.add_run("a", [r.shifted(span, ids=10_000) for r in run], start + span,
                start + 2 * span)
    trace = rec.trace()
    assert replay(trace, mode="recorded").makespan == 2 * span
    assert replay(trace, trace.config, "elastic").makespan == 2 * span
