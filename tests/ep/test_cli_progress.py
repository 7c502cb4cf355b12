"""Progress of the command line: drawn on a terminal only, silent without tqdm or when piped."""

from __future__ import annotations

import io
import json
import sys
import time

from ep import cli_progress
from ep.cli import main


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_phase_on_a_terminal_shows_its_label_and_clears_it():
    stream = Terminal()
    with cli_progress.phase("compiling m.onnx for npu-m", stream=stream, delay=0) as step:
        time.sleep(2 * cli_progress.REFRESH)  # the ticker redraws the elapsed time
        step(1)
    assert "compiling m.onnx for npu-m: 00:0" in stream.getvalue()


def test_a_bar_with_a_total_counts_its_steps():
    stream = Terminal()
    with cli_progress.phase("sweep of 4 configs", total=4, stream=stream, delay=0) as step:
        for _ in range(4):
            time.sleep(0.15)  # longer than tqdm's redraw interval
            step(1)
    assert "sweep of 4 configs" in stream.getvalue() and "3/4" in stream.getvalue()


def test_a_phase_shorter_than_its_delay_shows_nothing():
    stream = Terminal()
    with cli_progress.phase("quick", stream=stream, delay=60):
        pass
    assert "quick" not in stream.getvalue()


def test_silent_when_not_a_terminal_or_switched_off(monkeypatch):
    piped = io.StringIO()
    with cli_progress.phase("piped", stream=piped, delay=0) as step:
        step(1)
    assert piped.getvalue() == ""
    monkeypatch.setenv("NPU_SIM_PROGRESS", "0")
    off = Terminal()
    with cli_progress.phase("off", stream=off, delay=0):
        pass
    assert off.getvalue() == ""


def test_silent_fallback_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `from tqdm import tqdm` raises ImportError
    stream = Terminal()
    with cli_progress.phase("no tqdm", stream=stream, delay=0) as step:
        step(3)
    assert stream.getvalue() == ""


def test_commands_print_no_progress_when_output_is_captured(capsys):
    assert main(["run", "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert json.loads(captured.out)["model"].startswith("tiny_cnn")


def test_sweep_reports_every_config_to_its_progress():
    from pathlib import Path

    from npu_sim.trace import load
    from npu_sim.trace.sweep import sweep

    trace = load(Path(__file__).resolve().parents[2] / "traces" / "tiny_cnn.trace.jsonl")
    configs = [trace.config.replace(hbm_gbps=100.0 * (i + 1)) for i in range(5)]
    steps: list[int] = []
    rows = sweep(trace, configs, workers=1, chunk=2, progress=steps.append)
    assert steps == [2, 2, 1] and len(rows) == 5
