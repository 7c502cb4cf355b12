"""The benchmarks' one table: bench/figures.py's records and table builder, the runner
(python -m bench) on one cheap bench, and npu-sim bench. Timings are never asserted."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import figures as F
from ep.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_figure_is_judged_by_its_target_and_direction():
    assert F.at_most("b", "ratio", 1.4, 1.5).ok is True
    assert F.at_most("b", "ratio", 1.6, 1.5).ok is False
    assert F.at_least("b", "speedup", 12, 10).ok is True
    assert F.at_least("b", "speedup", 9.9, 10).ok is False
    assert F.at_most("b", "edge", 1.5, 1.5).ok is True
    assert F.info("b", "rate", 3.0).ok is None
    assert F.at_most("b", "nan", math.nan, 1.0).ok is None
    with pytest.raises(ValueError, match="target and direction go together"):
        F.Figure("b", "half", 1.0, "x", 2.0, None)
    with pytest.raises(ValueError, match="direction '<'"):
        F.Figure("b", "bad", 1.0, "x", 2.0, "<")


def test_json_form_has_the_documented_keys_and_round_trips():
    fig = F.at_least("session", "creation: source / EPContext", 21.5, 10.0)
    data = fig.to_dict()
    assert data == {"bench": "session", "name": "creation: source / EPContext", "value": 21.5,
                    "unit": "x", "target": 10.0, "direction": ">=", "ok": True}
    assert F.Figure.from_dict(json.loads(json.dumps(data))) == fig
    missing = F.at_most("b", "n/a", math.nan, 1.0).to_dict()
    assert missing["value"] is None and missing["ok"] is None
    assert math.isnan(F.Figure.from_dict(missing).value)


def test_the_table_has_one_row_per_figure_and_counts_the_targets_met():
    figs = [F.at_most("session", "functional run / onnxruntime", 1.96, 1.5),
            F.at_most("session", "timing-only run", 31.6, 50.0, "ms"),
            F.info("dma", "4 channels / 1 channel", 0.97)]
    lines = F.table(figs).splitlines()
    assert lines[0].split() == ["bench", "figure", "measured", "target", "result"]
    assert lines[1].split()[-5:] == ["1.96x", "<=", "1.5x", "falls", "short"]
    assert lines[1].endswith("falls short")
    assert "31.6 ms" in lines[2] and "<= 50 ms" in lines[2] and lines[2].endswith("pass")
    assert lines[3].endswith("-") and "0.97x" in lines[3]
    assert lines[4] == "1 of 2 figures with a target meet it; 1 figure(s) without a target"
    # Columns line up: every row's "measured" cell starts where the header's does.
    column = lines[0].index("measured")
    assert all(line[column - 2:column] == "  " for line in lines[1:4])
    md = F.markdown(figs).splitlines()
    assert md[0] == "| bench | figure | measured | target | result |"
    assert md[2] == "| session | functional run / onnxruntime | 1.96x | <= 1.5x | falls short |"


def test_every_bench_reports_through_bench_main():
    """Each bench_*.py has a main() that calls bench_main (parsed, not imported: importing one
    pulls in its models), which gives it --quick and --json for the runner."""
    benches = sorted((ROOT / "bench").glob("bench_*.py"))
    assert len(benches) >= 9
    for path in benches:
        tree = ast.parse(path.read_text())
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "main" in functions, path.name
        calls = [n.func.id for n in ast.walk(functions["main"])
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        assert "bench_main" in calls, path.name


def test_bench_main_prints_the_table_or_json(capsys):
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)

    def measure(args: argparse.Namespace) -> list[F.Figure]:
        print(f"detail n={args.n}")
        return [F.at_most("toy", f"n={args.n}", args.n, 5, "")]

    F.bench_main(parser, measure, ["--n", "3"], argv=["--quick"])
    out = capsys.readouterr().out
    assert out.startswith("detail n=3\n") and "n=3" in out and out.rstrip().endswith(
        "1 of 1 figures with a target meet it; 0 figure(s) without a target")

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10)
    F.bench_main(parser, measure, ["--n", "3"], argv=["--json", "--n", "7"])
    captured = capsys.readouterr()
    assert captured.err == "detail n=7\n"  # the detail moves to stderr with --json
    (row,) = json.loads(captured.out)
    assert row["name"] == "n=7" and row["ok"] is False


def test_the_runner_on_one_cheap_bench_prints_one_table():
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", "allocator"],
                          cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["bench", "figure", "measured", "target", "result"]
    rows = lines[1:-1]
    assert [r.split()[0] for r in rows] == ["allocator", "allocator"]
    assert "best_fit malloc/free rate / first_fit" in rows[0]
    assert "bench allocator (quick) ..." in proc.stderr  # progress of the run, on stderr


def test_npu_sim_bench_json_runs_the_checkout(capsys):
    assert main(["bench", "--quick", "--only", "allocator", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == {}
    assert {f["name"] for f in report["figures"]} == {
        "best_fit malloc/free rate / first_fit", "mru malloc/free rate / first_fit"}
    assert all(set(f) == {"bench", "name", "value", "unit", "target", "direction", "ok"}
               for f in report["figures"])


def test_a_failing_bench_is_reported_and_exits_1(tmp_path):
    """A checkout whose one bench raises: the runner names it with its last stderr line."""
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("__main__.py", "figures.py"):
        (bench / name).write_text((ROOT / "bench" / name).read_text())
    (bench / "bench_broken.py").write_text("raise SystemExit('the broken bench gave up')\n")
    proc = subprocess.run([sys.executable, "-m", "bench"], cwd=tmp_path, capture_output=True,
                          text=True, check=False, timeout=60)
    assert proc.returncode == 1
    assert "bench broken FAILED: the broken bench gave up" in proc.stdout


def test_a_pipe_in_a_figure_name_does_not_break_the_markdown_table():
    (row,) = F.markdown([F.info("b", "a|b", 1.0)]).splitlines()[2:]
    assert row == "| b | a\\|b | 1x | - | - |"
