"""EPContext models loaded and run while the interpreter exits, from an ``atexit`` handler.

By then ``concurrent.futures`` takes no new work ("cannot schedule new futures after interpreter
shutdown"): the checksum thread's pool and the external weights' hashing pool refuse it, and
Python 3.12+ starts no thread at all (the kernels' helper threads). A load there checks the
weights on the loading thread and a run splits no launch, as onnxruntime loads and runs at any
time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import atexit, json, sys
from pathlib import Path

import numpy as np
import onnx

import ep
from tests.ep.npusim_graphs import matmul_add, ort_run, random_feed

folder = Path(sys.argv[1])
# 256 KiB of weights, checked on every load: in the binary, and in external weight files
# (hashed when loaded); and a product large enough to be split over the helper threads,
# which the exiting interpreter's first run starts.
cases = {"0": (2, "0"), "1": (2, "1"), "split": (512, "0")}
contexts = {}
for name, (rows, mode) in cases.items():
    model = matmul_add(m=rows, k=256, n=256, seed=5)
    feed = random_feed(model)
    path = folder / f"m{name}.onnx"
    onnx.save(model, path)
    so = ep.SessionOptions()
    so.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(path), so,
                        providers=[("NpuSimExecutionProvider", {"external_weights": mode})])
    contexts[name] = (path.with_name(f"m{name}_ctx.onnx"), feed, ort_run(model, feed))


def at_exit():
    report = {}
    for name, (ctx, feed, want) in contexts.items():
        try:
            session = ep.InferenceSession(str(ctx), enable_fallback=0)
            got = session.run(None, feed)
            report[name] = {"providers": session.get_providers(),
                            "error": max(float(np.max(np.abs(g - w)))
                                         for g, w in zip(got, want, strict=True))}
        except Exception as exc:  # reported to the test, which fails naming it
            report[name] = {"raised": f"{type(exc).__name__}: {exc}"}
    print("REPORT " + json.dumps(report), flush=True)


atexit.register(at_exit)
"""


def test_an_epcontext_model_loads_and_runs_from_an_atexit_handler(tmp_path):
    result = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, f"no report; stdout {result.stdout[-2000:]!r}, stderr {result.stderr[-2000:]!r}"
    report = json.loads(lines[-1][len("REPORT "):])
    assert set(report) == {"0", "1", "split"}
    for name, outcome in report.items():
        assert "raised" not in outcome, f"{name}: {outcome['raised']}"
        assert outcome["providers"][0] == "NpuSimExecutionProvider"
        assert outcome["error"] <= 1e-4, (name, outcome)
