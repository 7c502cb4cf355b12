"""Elastic replay's per-trace cache of core splits and costs, and its collector pause: a
repeated replay is the same replay, whichever split rule and config come before it."""

from __future__ import annotations

import dataclasses
import gc

from ep.traces import CONFIG_CHANGES, compiler_split
from npu_sim.trace import replay
from npu_sim.trace.elastic import PRICED_CONFIGS


def _fresh(trace):
    """The same trace as another object: nothing prepared or priced for it yet."""
    return dataclasses.replace(trace)


def _one_core(config, op, ins, outs, attrs):
    return 1


def test_a_repeated_replay_reuses_nothing_that_changes_it(sample_traces, base_config):
    trace = sample_traces["transformer_block"][1]
    config = base_config.replace(**CONFIG_CHANGES["cores 8"])
    first = replay(trace, config, "elastic", split=compiler_split)
    again = replay(trace, config, "elastic", split=compiler_split)
    assert again.records == first.records and again.energy == first.energy
    # Another split rule under the same config re-decides every split.
    single = replay(trace, config, "elastic", split=_one_core)
    assert single.records == replay(_fresh(trace), config, "elastic", split=_one_core).records
    assert {len(r.work["core_ids"]) for r in single.records if r.kind == "kernel"} == {1}
    assert single.makespan != first.makespan
    # Once more configs than the cache keeps went by, the first is priced again, the same.
    for cores in range(1, PRICED_CONFIGS + 2):
        replay(trace, base_config.replace(cores=cores), "elastic", split=compiler_split)
    assert replay(trace, config, "elastic", split=compiler_split).records == first.records


def test_replay_leaves_the_collector_as_it_found_it(cnn_trace, base_config):
    config = base_config.replace(dma_chunk_bytes=4096)
    assert gc.isenabled()
    replay(cnn_trace, config, "elastic")
    assert gc.isenabled()
    gc.disable()
    try:
        replay(cnn_trace, config, "elastic")
        assert not gc.isenabled()
    finally:
        gc.enable()
