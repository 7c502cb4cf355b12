"""Speed benchmark of issue 13: every figure against its target, as ratios measured in one run.

For each model of the bench set (``bench/speed_models.py``: a 100-op elementwise chain,
light_resnet50, a MobileNet-V3-like and an EfficientNet-like net, BERT-base at sequence 128, a
GPT-2-small-sized decoder at sequence 64) in this process, against onnxruntime's CPU provider
with the same thread count (intra-op threads = the cores this process may use, as numba's and
OpenBLAS's pools):

- functional run time, NpuSim / onnxruntime, outputs checked against onnxruntime's;
- session creation from the source model, NpuSim / onnxruntime (median of ``--repeat``): a
  model created again in a process, as sessions, instances and sweeps create it, which reuses
  onnxruntime's optimized graph and the tile plans of the first creation; beside it, without a
  target, the same with the optimized graph not kept (what a model's first session pays);
- session creation from the EPContext model: the source median over the slowest of 9 loads
  (the first of them checks the binary's weights; the later ones find the file verified,
  ``ep/npusim/verified_files.py``, once its times are settled);
- timing-only runs (``functional=0``): the chain against onnxruntime, light_resnet50 in ms;
- host memory: peak RSS growth over 100 functional runs of light_resnet50 after a warm-up.

Runs alternate in blocks (all NpuSim runs of a round, then all onnxruntime runs), and each figure
is the median over rounds: the machine is shared, so single timings are noise.

Run: ``python bench/bench_speed.py [--models chain,light_resnet50,...] [--repeat N] [--quick]
[--json]`` (``--quick``: chain and light_resnet50, 2 rounds).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).parent))
import figures  # noqa: E402
import speed_models  # noqa: E402
from figures import Figure, bench_main  # noqa: E402

import ep  # noqa: E402
from ep.framework import optimizer  # noqa: E402
from ep.framework.optimized_graphs import OptimizedGraphs  # noqa: E402
from ep.npusim.verified_files import VERIFIED  # noqa: E402

THREADS = len(os.sched_getaffinity(0))
QUICK = ["--models", "chain,light_resnet50", "--repeat", "2"]
RUN_TARGET = {"chain": 20.0, "light_resnet50": 2.0}  # others: 3.0


class Table:
    """The bench's figures (``bench/figures.py``), each printed as it is measured."""

    def __init__(self) -> None:
        self.figures: list[Figure] = []

    def info(self, figure: str, value: float, *, unit: str = "x") -> None:
        self.figures.append(figures.info("speed", figure, value, unit))
        print(f"  {figure}: {figures.number(value, unit)} (no target)", flush=True)

    def add(self, figure: str, value: float, target: float, *, unit: str = "x",
            at_least: bool = False) -> None:
        made = (figures.at_least if at_least else figures.at_most)("speed", figure, value,
                                                                   target, unit)
        self.figures.append(made)
        print(f"  {figure}: {figures.number(value, unit)} (target {made.direction} "
              f"{figures.number(target, unit)})", flush=True)


def seconds(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took; what it returned is dropped after the clock stops. A session's
    teardown is not its creation: dropped inside, an EPContext session of MobileNet-V3 counted
    0.13 ms of teardown on top of a 1.4 ms load, one from source 0.45 ms on 21 ms, onnxruntime's
    0.68 ms on 12 ms (medians of 15, one process)."""
    start = time.perf_counter()
    made = fn()
    elapsed = time.perf_counter() - start
    del made
    return elapsed


class FullCollections:
    """Counts the cyclic collector's full passes (generation 2) while inside."""

    def __enter__(self) -> FullCollections:
        self.count = 0
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._seen)

    def _seen(self, phase: str, info: dict[str, int]) -> None:
        self.count += phase == "start" and info["generation"] == 2


#: Seconds each block of runs waits first (creations, which leave no thread spinning, do not),
#: so that it does not share a core with the threads the other side left spinning:
#: onnxruntime's intra-op worker spins about 48 ms after a run (its state in /proc/self/task,
#: MobileNet-V3, 2 threads), npu-sim's helpers 0.5 ms. Blocks of NpuSim runs that began inside
#: it found the host busy and ran most of their splits on one core (387 of 524 in ten 10-run
#: blocks of MobileNet-V3).
SETTLE = 0.1


def paired_medians(a: Callable[[], object], b: Callable[[], object], rounds: int,
                   block: int, settle: float = 0.0) -> tuple[float, float]:
    """Median seconds of ``a`` and of ``b``, timed in alternating blocks of ``block`` calls,
    each block after ``settle`` seconds of pause (:data:`SETTLE` for runs)."""
    ta, tb = [], []
    for _ in range(rounds):
        time.sleep(settle)
        ta += [seconds(a) for _ in range(block)]
        time.sleep(settle)
        tb += [seconds(b) for _ in range(block)]
    return statistics.median(ta), statistics.median(tb)


def ort_session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The largest difference from onnxruntime's outputs, relative to each output's scale."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.size:
            scale = max(float(np.max(np.abs(w))), 1.0)
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w))) / scale)
    return worst


def bench_model(name: str, folder: Path, table: Table, repeat: int) -> None:
    path, feeds = speed_models.BENCH_SET[name](folder)
    print(f"{name}:", flush=True)
    bench_runs(name, path, feeds, table, repeat)
    if name == "chain":  # no target: a CI job's many small generated models, each new
        table.info("chain creation from source, optimized graph not kept / onnxruntime",
                   fresh_creation(path, repeat))
    else:
        bench_creation(name, path, table, repeat)


def bench_runs(name: str, path: Path, feeds: dict[str, np.ndarray], table: Table,
               repeat: int) -> None:
    cpu = ort_session(path)
    # warm: numba kernels compiled or loaded from cache; no fallback: a fault is not timed on
    # the CPU provider as if it were the NPU
    npu = ep.InferenceSession(str(path), enable_fallback=0)
    table.add(f"{name} outputs: max error / scale vs onnxruntime",
              error(npu.run(None, feeds), cpu.run(None, feeds)), 1e-4, unit="")
    for _ in range(2):
        npu.run(None, feeds), cpu.run(None, feeds)
    block = max(1, min(10, int(0.3 / max(seconds(lambda: cpu.run(None, feeds)), 1e-6))))
    t_npu, t_cpu = paired_medians(lambda: npu.run(None, feeds), lambda: cpu.run(None, feeds),
                                  repeat, block, SETTLE)
    print(f"  run: NpuSim {t_npu * 1e3:.2f} ms, onnxruntime {t_cpu * 1e3:.2f} ms")
    table.add(f"{name} functional run / onnxruntime", t_npu / t_cpu, RUN_TARGET.get(name, 3.0))

    if name in ("chain", "light_resnet50"):
        timing = ep.InferenceSession(str(path), providers=[
            ("NpuSimExecutionProvider", {"functional": "0"})], enable_fallback=0)
        timing.run(None, feeds)
        t_time, t_cpu = paired_medians(lambda: timing.run(None, feeds),
                                       lambda: cpu.run(None, feeds), repeat, block, SETTLE)
        if name == "chain":
            table.add("chain timing-only run / onnxruntime", t_time / t_cpu, 20.0)
        else:
            table.add("light_resnet50 timing-only run", t_time * 1e3, 10.0, unit="ms")
    if name == "light_resnet50":
        memory(npu, feeds, table)


def creation_medians(path: Path, repeat: int, label: str) -> tuple[float, float]:
    """Median seconds of creating a NpuSim and an onnxruntime session of ``path``, ``repeat``
    pairs, printed under ``label``."""
    pairs = [paired_medians(lambda: ep.InferenceSession(str(path)),
                            lambda: ort_session(path), 1, 1) for _ in range(repeat)]
    t_npu = statistics.median(c[0] for c in pairs)
    t_ort = statistics.median(c[1] for c in pairs)
    print(f"  {label}: NpuSim {t_npu * 1e3:.1f} ms, onnxruntime {t_ort * 1e3:.1f} ms")
    return t_npu, t_ort


def fresh_creation(path: Path, repeat: int) -> float:
    """Creation from source against onnxruntime's, with no optimized graph kept from an earlier
    session of the same model (as for a model the process has not seen)."""
    kept, optimizer.GRAPHS = optimizer.GRAPHS, OptimizedGraphs(entries=0)  # keeps nothing
    try:
        t_new, t_ort = creation_medians(path, repeat, "creation, optimized graph not kept")
    finally:
        optimizer.GRAPHS = kept
    return t_new / t_ort


def bench_creation(name: str, path: Path, table: Table, repeat: int) -> None:
    t_src, t_ort = creation_medians(path, repeat, "creation")
    table.add(f"{name} creation from source / onnxruntime", t_src / t_ort, 2.0)
    table.info(f"{name} creation from source, optimized graph not kept / onnxruntime",
               fresh_creation(path, repeat))
    options = ep.SessionOptions()
    options.add_session_config_entry("ep.context_enable", "1")
    ep.InferenceSession(str(path), options)
    ctx = path.with_name(f"{path.stem}_ctx.onnx")
    # The collector's debt from building the model (torch's export: BERT's left a full pass of
    # about 250 ms due) is paid here, not inside whichever load comes next; full passes during
    # the loads are still counted and printed.
    gc.collect()
    loads, checked = [], []
    with FullCollections() as full:
        for _ in range(9):
            skipped = VERIFIED.skipped
            loads.append(seconds(lambda: ep.InferenceSession(str(ctx))))
            checked.append(VERIFIED.skipped == skipped)
    print(f"  EPContext loads: "
          f"{', '.join(f'{t * 1e3:.1f}' + '*' * c for t, c in zip(loads, checked, strict=True))}"
          f" ms (*: checked the weights; {full.count} full collection(s) of the process among "
          "them)")
    table.add(f"{name} creation source / EPContext (slowest of 9)", t_src / max(loads), 10.0,
              at_least=True)


def memory(npu: ep.InferenceSession, feeds: dict[str, np.ndarray], table: Table) -> None:
    """Peak RSS growth over 100 runs after a warm-up (outputs are dropped each run)."""
    for _ in range(5):
        npu.run(None, feeds)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(100):
        npu.run(None, feeds)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    table.add("light_resnet50 peak RSS growth over 100 runs", grown, 1.0, unit="MiB")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(speed_models.BENCH_SET))
    p.add_argument("--repeat", type=int, default=5)
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    table = Table()
    print(f"{THREADS} threads; onnxruntime {ort.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            bench_model(name, Path(tmp), table, args.repeat)
    return table.figures


def main() -> None:
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
