"""The committed sample traces under traces/ load, are small, and replay to what they hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from ep.traces import SAMPLES, compiler_split, main
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
    assert main([str(tmp_path)]) == 0
    for name in SAMPLES:
        assert (tmp_path / f"{name}.trace.jsonl").read_bytes() == \
            (TRACES / f"{name}.trace.jsonl").read_bytes(), f"traces/ is stale: regenerate {name}"


@pytest.mark.parametrize("argv", [["--help"], ["--bogus"], ["a", "b"]])
def test_generator_options_write_nothing(tmp_path, monkeypatch, capsys, argv):
    """An option is never taken for the output folder (``--help`` once made a folder so
    named); a usage error exits with status 2, as every command here does."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == (0 if argv == ["--help"] else 2)
    assert list(tmp_path.iterdir()) == []
    assert "usage: python -m ep.traces" in capsys.readouterr()[argv != ["--help"]]
