"""The committed sample traces under traces/ load, are small, and replay to what they hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from ep.traces import SAMPLES, compiler_split
from npu_sim.trace import load, replay

TRACES = Path(__file__).resolve().parents[2] / "traces"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_trace_replays_to_its_recorded_makespan(name):
    path = TRACES / f"{name}.trace.jsonl"
    assert path.stat().st_size < 1 << 20
    assert (TRACES / f"{name}.perfetto.json").stat().st_size < 1 << 20
    trace = load(path)
    hosts = [r for r in trace.records if r.engine == "host"]
    assert len(hosts) == 1 and trace.makespan == hosts[0].cycles > 0
    assert replay(trace, mode="recorded").makespan == trace.makespan
    assert replay(trace, trace.config, "elastic", split=compiler_split).makespan == \
        trace.makespan


def test_samples_are_what_the_generator_writes(tmp_path):
    from ep.traces import main

    assert main([str(tmp_path)]) == 0
    for name in SAMPLES:
        assert (tmp_path / f"{name}.trace.jsonl").read_bytes() == \
            (TRACES / f"{name}.trace.jsonl").read_bytes(), f"traces/ is stale: regenerate {name}"
