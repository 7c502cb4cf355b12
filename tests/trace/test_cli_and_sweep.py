"""The trace subcommands, sweeps and reports, end to end on saved traces."""

from __future__ import annotations

import csv
import json

import pytest

from ep.cli import main
from ep.traces import compiler_split
from npu_sim.errors import TraceError
from npu_sim.trace import analysis, replay, save
from npu_sim.trace.sweep import grid_configs, sweep


@pytest.fixture
def saved(cnn_trace, tmp_path):
    return str(save(cnn_trace, tmp_path / "cnn.trace.jsonl"))


def test_run_trace_export_replay_report_diff(tmp_path, capsys):
    path = str(tmp_path / "run.trace.jsonl")
    assert main(["run", "--timing-only", "--trace", path]) == 0
    assert "trace: " + path in capsys.readouterr().out
    out_json = str(tmp_path / "t.json")
    assert main(["export", path, "--format", "perfetto", "-o", out_json]) == 0
    with open(out_json) as f:
        assert "traceEvents" in json.load(f)
    assert f"wrote {out_json}" in capsys.readouterr().out
    retimed = str(tmp_path / "l.trace.jsonl")
    assert main(["replay", path, "--device", "npu-l", "-o", retimed, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["config"] == "npu-l" and summary["flags"]
    assert summary["makespan_cycles"] == replay(retimed, mode="recorded").makespan
    assert main(["report", path, "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["critical_path"][-1]["end"] - rep["critical_path"][0]["start"] == \
        rep["makespan_cycles"]
    assert main(["diff", path, retimed, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["makespan_delta"] == summary["makespan_cycles"] - rep["makespan_cycles"]


def test_bad_trace_exits_1_with_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.trace.jsonl"
    bad.write_text('{"format": "npu-sim-trace", "schema": "9.0"}\n')
    assert main(["report", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.trace.jsonl:1" in err and "schema version 9.0" in err and "Traceback" not in err


def test_report_figures(cnn_trace):
    rep = analysis.report(cnn_trace)
    assert set(rep["utilization"]) >= {"core0", "dma0"}
    assert all(0 <= u <= 1 for u in rep["utilization"].values())
    assert 0 <= rep["overlap_cycles"] <= min(rep["dma_cycles"], rep["compute_cycles"])
    path = rep["critical_path"]
    assert path[-1]["end"] == cnn_trace.end and path[0]["start"] == cnn_trace.start
    ops = analysis.operators(cnn_trace)
    convs = [o for o in ops if o["op"] == "Conv" and o["macs"]]
    assert convs and all(o["bound"] in ("compute", "memory") for o in convs)
    for o in convs:
        assert (o["bound"] == "compute") == (o["intensity"] >= o["ridge"])
    assert sum(a["cycles"] for a in rep["top_ops"]) <= sum(
        r.cycles for r in cnn_trace.records if r.kind == "kernel")


def test_diff_of_a_trace_with_itself_is_zero(cnn_trace):
    d = analysis.diff(cnn_trace, cnn_trace)
    assert d["makespan_delta"] == 0 and all(r["delta"] == 0 for r in d["operators"])


def test_sweep_rows_match_single_replays(saved, cnn_trace, tmp_path, capsys):
    grid = tmp_path / "grid.toml"
    grid.write_text('base = "npu-m"\n[grid]\nhbm_gbps = [115.0, 460.0]\ndma_channels = [1, 4]\n')
    assert main(["sweep", saved, "--grid", str(grid), "-o", str(tmp_path / "out"),
                 "--workers", "2"]) == 0
    with open(tmp_path / "out.csv") as f:
        rows = list(csv.DictReader(f))
    with open(tmp_path / "out.json") as f:
        assert len(json.load(f)) == 4
    assert [(float(r["hbm_gbps"]), int(r["dma_channels"])) for r in rows] == \
        [(115.0, 1), (115.0, 4), (460.0, 1), (460.0, 4)]
    for r in rows:
        cfg = cnn_trace.config.replace(hbm_gbps=float(r["hbm_gbps"]),
                                       dma_channels=int(r["dma_channels"]))
        assert int(r["makespan"]) == replay(cnn_trace, cfg, "elastic",
                                            split=compiler_split).makespan


def test_grid_errors_are_typed(cnn_trace):
    with pytest.raises(TraceError, match="hbm_gbps=-1"):
        grid_configs({"grid": {"hbm_gbps": [-1]}}, cnn_trace.config)
    with pytest.raises(TraceError, match="unknown keys"):
        grid_configs({"grdi": {}}, cnn_trace.config)
    with pytest.raises(TraceError, match="no configs"):
        grid_configs({}, cnn_trace.config)


def test_sweep_on_ray(cnn_trace):
    ray = pytest.importorskip("ray")
    configs = [cnn_trace.config.replace(hbm_gbps=g) for g in (100.0, 200.0, 400.0)]
    ray.init(num_cpus=1, include_dashboard=False)
    try:
        rows = sweep(cnn_trace, configs, ray=True, chunk=1)
    finally:
        ray.shutdown()
    assert [r["makespan"] for r in rows] == [replay(cnn_trace, c, "elastic").makespan
                                             for c in configs]


def test_plots(cnn_trace, tmp_path):
    pytest.importorskip("matplotlib")
    from npu_sim.trace.plots import plot_all

    paths = plot_all(cnn_trace, tmp_path)
    assert sorted(p.name for p in paths) == ["roofline.png", "timeline.png", "utilization.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
