"""Benchmark: compile time and arena quality of the NPU compiler on light_resnet50.onnx.

Prints, for each preset, the wall time of ``compile_partition`` (the first, cold run, and the
best of a few; target < 2 s) and the arena peak against two references computed in the same
run: the lower bound (max over steps of the live aligned bytes; target ratio <= 1.1) and no
reuse (sum of all buffers). Run: ``python bench/bench_compile.py [--repeat N] [--presets a,b]
[--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import onnx
from figures import Figure, at_most, bench_main

from ep.framework.provider import FusedNode
from ep.npusim.compiler import compile_partition
from npu_sim.config import DeviceConfig

QUICK = ["--repeat", "1", "--presets", "npu-m"]
MODEL = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"


def fused_model(model: onnx.ModelProto) -> FusedNode:
    """The whole model as one fused node (what the partitioner gives when the NPU takes all)."""
    inits = {t.name for t in model.graph.initializer}
    return FusedNode("resnet50", model.graph,
                     [i.name for i in model.graph.input if i.name not in inits],
                     [o.name for o in model.graph.output], list(model.opset_import))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--presets", default="npu-s,npu-m,npu-l,os32")
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    fused = fused_model(onnx.load(str(MODEL)))
    found = []
    print(f"model: {MODEL.name}")
    print(f"{'preset':8} {'cold s':>7} {'best s':>7} {'launches':>9} {'arena MiB':>10} "
          f"{'bound MiB':>10} {'no-reuse MiB':>13} {'peak/bound':>11} {'no-reuse/peak':>14}")
    for preset in args.presets.split(","):
        config = DeviceConfig.preset(preset)
        times = []
        for _ in range(max(1, args.repeat)):
            start = time.perf_counter()
            result = compile_partition(fused, config)
            times.append(time.perf_counter() - start)
        arena = result.report.arena
        mib = 1 << 20
        print(f"{preset:8} {times[0]:7.3f} {min(times):7.3f} {len(result.program.launches):9d} "
              f"{arena.peak / mib:10.2f} {arena.lower_bound / mib:10.2f} "
              f"{arena.no_reuse / mib:13.2f} {arena.ratio:11.3f} "
              f"{arena.no_reuse / max(arena.peak, 1):14.2f}")
        found += [at_most("compile", f"light_resnet50 on {preset}: cold compile", times[0], 2.0,
                          "s"),
                  at_most("compile", f"light_resnet50 on {preset}: arena peak / lower bound",
                          arena.ratio, 1.1)]
    stages = ", ".join(f"{k} {v:.3f}" for k, v in result.report.seconds.items())
    print(f"stage seconds (last run): {stages}")
    print("targets: compile < 2 s, peak/bound <= 1.1")
    return found


def main() -> None:
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
