"""Benchmark: the numba sgemm (npu_sim.kernels.sgemm.matmul) against numpy's matmul (OpenBLAS).

The GEMM shapes are those of ResNet-50's convolutions and classifier at batch 1, read from onnx's
``light_resnet50.onnx`` with shape inference: a Conv is ``(M, K, N) = (C_out, C_in * kh * kw,
H_out * W_out)``, the Gemm is ``(1000, 2048, 1)`` (weights @ column). ``sgemm.matmul`` is what
the kernels call; it hands products too small or too thin for the sgemm (the Gemm) to numpy.
Both run in this process on the same arrays, in alternating phases, best of ``--repeat`` calls
per round and best over ``--rounds`` rounds. Printed per shape: GFLOPS of each and the speed
ratio (numpy time / sgemm time, above 1 means sgemm is faster); overall: the ratio of the total
time of one ResNet-50 pass through all its GEMMs (each shape weighted by how often it occurs,
i.e. by its MAC share). Also: the largest relative error against a float64 product at
K = 4608, and the cold (empty cache) and warm (numba cache present) import-and-first-call
times, each measured in a fresh interpreter. The machine has 2 cores: numbers are only
meaningful when nothing else runs.

    python bench/bench_sgemm.py [--rounds 3] [--repeat 10]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import shape_inference

MODEL = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx")
FIRST_CALL = (
    "import time; t = time.perf_counter(); import numpy as np; "
    "from npu_sim.kernels.sgemm import sgemm; "
    "sgemm(np.ones((70, 40), np.float32), np.ones((40, 50), np.float32)); "
    "sgemm(np.ones((70, 40), np.float32), np.ones((40, 5), np.float32)); "
    "print(time.perf_counter() - t)"
)


def resnet_shapes() -> collections.Counter[tuple[int, int, int]]:
    """``(M, K, N)`` of every Conv and Gemm of ResNet-50 at batch 1, with multiplicities."""
    model = shape_inference.infer_shapes(onnx.load(MODEL))
    graph = model.graph
    dims = {i.name: list(i.dims) for i in graph.initializer}
    for vi in list(graph.value_info) + list(graph.input) + list(graph.output):
        dims[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    shapes: collections.Counter[tuple[int, int, int]] = collections.Counter()
    for node in graph.node:
        if node.op_type == "Conv":
            w, y = dims[node.input[1]], dims[node.output[0]]
            shapes[(w[0], int(np.prod(w[1:])), int(np.prod(y[2:])))] += 1
        elif node.op_type == "Gemm":
            w = dims[node.input[1]]
            shapes[(w[0], w[1], 1)] += 1
    return shapes


def best(fn, repeat: int) -> float:
    """Shortest of ``repeat`` timed calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def first_call_seconds(cache_dir: str) -> float:
    """Import and first calls of sgemm in a fresh interpreter using ``cache_dir``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", FIRST_CALL], env=env, check=True, capture_output=True, text=True
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as cache:
        cold = first_call_seconds(cache)
        warm = first_call_seconds(cache)
    print(f"sgemm import + first calls: cold {cold:.2f} s, warm (cached) {warm:.2f} s")

    from npu_sim.kernels.sgemm import matmul, sgemm

    rng = np.random.default_rng(0)
    shapes = resnet_shapes()
    arrays = {}
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        arrays[(m, k, n)] = (a, b, np.empty((m, n), np.float32), np.empty((m, n), np.float32))
        matmul(a, b, arrays[(m, k, n)][2])
    t_np = dict.fromkeys(shapes, np.inf)
    t_us = dict.fromkeys(shapes, np.inf)
    for _ in range(args.rounds):
        # one phase per implementation, with a pause between: OpenBLAS's threads keep spinning
        # for a while after a call and would take a core from the other side
        for shape, (a, b, _, c_np) in arrays.items():
            run = lambda a=a, b=b, c=c_np: np.matmul(a, b, out=c)  # noqa: E731
            t_np[shape] = min(t_np[shape], best(run, args.repeat))
        time.sleep(0.5)
        for shape, (a, b, c, _) in arrays.items():
            run = lambda a=a, b=b, c=c: matmul(a, b, c)  # noqa: E731
            t_us[shape] = min(t_us[shape], best(run, args.repeat))
        time.sleep(0.5)

    total_macs = sum(m * k * n * cnt for (m, k, n), cnt in shapes.items())
    print(f"{'M':>5} {'K':>5} {'N':>6} {'count':>5} {'MAC %':>6} {'numpy GF':>9} "
          f"{'sgemm GF':>9} {'ratio':>6}")
    for (m, k, n), cnt in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1] * kv[0][2]
                                 * kv[1]):
        flops = 2.0 * m * k * n
        share = 100 * m * k * n * cnt / total_macs
        print(f"{m:5d} {k:5d} {n:6d} {cnt:5d} {share:6.2f} {flops / t_np[(m, k, n)] / 1e9:9.1f} "
              f"{flops / t_us[(m, k, n)] / 1e9:9.1f} {t_np[(m, k, n)] / t_us[(m, k, n)]:6.2f}")
    total_np = sum(t_np[s] * cnt for s, cnt in shapes.items())
    total_us = sum(t_us[s] * cnt for s, cnt in shapes.items())
    print(f"ResNet-50 GEMMs, one pass: numpy {1e3 * total_np:.2f} ms, sgemm {1e3 * total_us:.2f} "
          f"ms, ratio {total_np / total_us:.2f} (MAC-weighted; > 1: sgemm faster)")

    a = rng.standard_normal((512, 4608), dtype=np.float32)
    b = rng.standard_normal((4608, 49), dtype=np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(ref).max()
    print(f"K=4608 max |error| / max |ref| vs float64: sgemm "
          f"{np.abs(sgemm(a, b) - ref).max() / scale:.1e}, numpy "
          f"{np.abs(np.matmul(a, b) - ref).max() / scale:.1e}")


if __name__ == "__main__":
    main()
