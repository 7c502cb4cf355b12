"""Session benchmark on light_resnet50 (onnx's backend test data), ratios measured in one run.

1. Session creation from the EPContext model vs from the source model (the point of EPContext:
   target >= 10x faster).
2. A functional run on the NPU EP vs onnxruntime's CPU provider (target <= 1.5x).
3. Wall time of a timing-only simulated run (``functional=0``; target < 50 ms).

Run: ``python bench/bench_session.py [--repeat N] [--quick] [--json]``. Each figure is the
median of N runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from figures import Figure, at_least, at_most, bench_main

import ep

QUICK = ["--repeat", "1"]
LIGHT = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``fn`` over ``repeat`` calls (after one warm-up call); what a call
    returns is dropped after its clock stops (a session's teardown is not its creation)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        made = fn()
        times.append(time.perf_counter() - start)
        del made
    return statistics.median(times)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "light_resnet50.onnx"
        shutil.copy(LIGHT, model)
        options = ep.SessionOptions()
        options.add_session_config_entry("ep.context_enable", "1")
        session = ep.InferenceSession(str(model), options)
        ctx = Path(tmp) / "light_resnet50_ctx.onnx"
        arg = session.get_inputs()[0]
        feeds = {arg.name: np.random.default_rng(0).random(arg.shape, dtype=np.float32)}

        from_source = median_seconds(lambda: ep.InferenceSession(str(model)), args.repeat)
        from_ctx = median_seconds(lambda: ep.InferenceSession(str(ctx)), args.repeat)
        print(f"session creation: source {from_source * 1e3:8.1f} ms, EPContext "
              f"{from_ctx * 1e3:8.1f} ms, speedup {from_source / from_ctx:6.1f}x (target >= 10x)")

        npu = ep.InferenceSession(str(ctx), enable_fallback=0)
        cpu = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        t_npu = median_seconds(lambda: npu.run(None, feeds), args.repeat)
        t_cpu = median_seconds(lambda: cpu.run(None, feeds), args.repeat)
        print(f"functional run:   NpuSim {t_npu * 1e3:8.1f} ms, onnxruntime CPU "
              f"{t_cpu * 1e3:8.1f} ms, ratio {t_npu / t_cpu:6.2f}x (target <= 1.5x)")
        stats = npu.get_run_stats()["NpuSimExecutionProvider"]
        print(f"simulated latency: {stats['cycles']} cycles = {stats['microseconds']:.1f} us")

        timing = ep.InferenceSession(str(ctx), providers=[
            ("NpuSimExecutionProvider", {"functional": "0"})], enable_fallback=0)
        t_timing = median_seconds(lambda: timing.run(None, feeds), args.repeat)
        print(f"timing-only run:  {t_timing * 1e3:8.1f} ms wall (target < 50 ms), "
              f"{t_timing / t_cpu:6.2f}x onnxruntime CPU")
    return [at_least("session", "light_resnet50 creation: source / EPContext",
                     from_source / from_ctx, 10.0),
            at_most("session", "light_resnet50 functional run / onnxruntime CPU", t_npu / t_cpu,
                    1.5),
            at_most("session", "light_resnet50 timing-only run", t_timing * 1e3, 50.0, "ms")]


def main() -> None:
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
