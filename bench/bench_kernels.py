"""Benchmark: ResNet-50 through the npu_sim kernels, op by op, against onnxruntime's CPU provider.

The model is onnx's ``light_resnet50.onnx`` (the backend test data shipped with the onnx
package). Its weights are ``ConstantOfShape`` fills of one value, so they are replaced by random
values from a fixed seed (He-scaled conv weights, plausible batch-norm statistics) and the model
is rebuilt with them as initializers. A tiny interpreter then runs it node by node in
topological order, looking each node's kernel up by op type and passing its attributes as plain
Python values, exactly as a KERNEL command would.

Two interpreter runs are timed:

* ``op-by-op``: every node as its own kernel (BatchNormalization and Relu separate);
* ``fused``: what the NPU compiler feeds the device: batch norm folded into the preceding Conv's
  weights and bias, and a following Relu fused into the Conv (``activation`` attribute).
  onnxruntime performs the same folding and fusion in its default graph optimizations.

Both use the same thread count as onnxruntime (intra-op threads = numba threads = BLAS threads
= 2). Each engine is timed in a child process of its own (an idle onnxruntime session in the same
process slowed the kernels by ~40%), rounds alternating; times are the best of all runs. The
script checks the outputs against onnxruntime, then measures JIT cost in two child processes
sharing a fresh ``NUMBA_CACHE_DIR``: the first compiles every kernel the model needs (cold), the
second loads them from the cache (warm start).

The GEMMs go through numpy's OpenBLAS, whose kernel family follows ``OPENBLAS_CORETYPE`` (the
line printed says which); onnxruntime uses its own MLAS kernels.

Run: ``python bench/bench_kernels.py [--repeat N] [--rounds R] [--quick] [--json]``.
"""

from __future__ import annotations

import os

THREADS = 2
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, str(THREADS))

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from figures import Figure, bench_main, info  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

MODEL = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx")
SEED = 0
QUICK = ["--repeat", "2", "--rounds", "1"]


def build_model(seed: int = SEED) -> onnx.ModelProto:
    """light_resnet50 with its ConstantOfShape weights replaced by seeded random initializers;
    the logits (the Gemm output) are exposed as a second graph output."""
    src = onnx.load(MODEL)
    rng = np.random.default_rng(seed)
    consts = {i.name: numpy_helper.to_array(i) for i in src.graph.initializer}
    inits, nodes = [], []
    for node in src.graph.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        name, shape = node.output[0], tuple(int(d) for d in consts[node.input[0]])
        if name.endswith("_w_0") and len(shape) == 4:
            fan_in = int(np.prod(shape[1:]))
            value = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
        elif name.endswith("_w_0"):
            value = rng.normal(0, np.sqrt(1.0 / shape[-1]), shape)
        elif name.endswith(("_bn_s_0", "_bn_riv_0")):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.normal(0, 0.1, shape)
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
    used = {i for n in nodes for i in n.input}
    inits += [i for i in src.graph.initializer if i.name in used]
    data = next(i for i in src.graph.input if i.name == "gpu_0/data_0")
    gemm_out = next(n.output[0] for n in nodes if n.op_type == "Gemm")
    logits = helper.make_tensor_value_info(gemm_out, onnx.TensorProto.FLOAT, [1, 1000])
    outputs = [*src.graph.output, logits]
    graph = helper.make_graph(nodes, "resnet50", [data], outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=list(src.opset_import), ir_version=8)
    onnx.checker.check_model(model)
    return model


Step = tuple[Callable[..., list[np.ndarray]], list[str], list[str], dict[str, Any]]


def plan(model: onnx.ModelProto, fuse: bool) -> tuple[list[Step], dict[str, np.ndarray]]:
    """Kernel calls in topological order, and the parameters; ``fuse`` folds BN and Relu."""
    from ep.npusim.compiler.ir import attr_value
    from npu_sim.kernels import lookup

    params = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = [(n.op_type, list(n.input), list(n.output),
              {a.name: attr_value(a) for a in n.attribute}) for n in model.graph.node]
    if fuse:
        nodes = _fuse(nodes, params)
    steps: list[Step] = []
    ready = set(params) | {i.name for i in model.graph.input}
    pending = list(nodes)
    while pending:  # topological order (Kahn): take the first node whose inputs exist
        idx = next(k for k, n in enumerate(pending) if all(i in ready or not i for i in n[1]))
        op, ins, outs, attrs = pending.pop(idx)
        steps.append((lookup(op).values, ins, outs, attrs))
        ready.update(outs)
    return steps, params


def _fuse(nodes: list, params: dict[str, np.ndarray]) -> list:
    """Fold BatchNormalization into the Conv before it and fuse a following Relu into it."""
    consumers: dict[str, int] = {}
    for _, ins, _, _ in nodes:
        for i in ins:
            consumers[i] = consumers.get(i, 0) + 1
    producer = {outs[0]: k for k, (_, _, outs, _) in enumerate(nodes)}
    dropped: set[int] = set()
    for k, (op, ins, outs, attrs) in enumerate(nodes):
        src = producer.get(ins[0]) if ins else None
        if src is None or nodes[src][0] != "Conv" or consumers[ins[0]] != 1:
            continue
        cop, cins, couts, cattrs = nodes[src]
        if op == "BatchNormalization":
            scale, bias, mean, var = (params[n] for n in ins[1:5])
            factor = scale / np.sqrt(var + np.float32(attrs.get("epsilon", 1e-5)))
            w = params[cins[1]] * factor[:, None, None, None]
            b = params[cins[2]] if len(cins) > 2 else np.zeros_like(mean)
            params[cins[1] + "_folded"] = w.astype(np.float32)
            params[cins[1] + "_bias"] = ((b - mean) * factor + bias).astype(np.float32)
            nodes[src] = (cop, [cins[0], cins[1] + "_folded", cins[1] + "_bias"], outs, cattrs)
        elif op == "Relu" and "activation" not in cattrs:
            nodes[src] = (cop, cins, outs, {**cattrs, "activation": "Relu"})
        else:
            continue
        producer[outs[0]] = src
        dropped.add(k)
    return [n for k, n in enumerate(nodes) if k not in dropped]


def run_plan(
    steps: list[Step],
    params: dict[str, np.ndarray],
    feeds: dict[str, np.ndarray],
    wanted: list[str],
) -> list[np.ndarray]:
    """Run the kernel calls; return the ``wanted`` values."""
    env = {**params, **feeds}
    for fn, ins, outs, attrs in steps:
        results = fn([env[i] if i else None for i in ins], attrs)
        env.update(zip(outs, results, strict=False))
    return [env[w] for w in wanted]


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """Best wall time of ``repeat`` calls, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


ENGINES = ("onnxruntime CPU", "kernels, fused", "kernels, op-by-op")


def _engine(name: str, model: onnx.ModelProto) -> tuple[Callable[[], Any], int]:
    """A no-argument run of ``model`` on engine ``name``, and its number of kernel calls."""
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    feeds = {"gpu_0/data_0": x}
    outs = [o.name for o in model.graph.output]
    if name == "onnxruntime CPU":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        return (lambda: sess.run(outs, feeds)), 0
    steps, params = plan(model, fuse=name == "kernels, fused")
    return (lambda: run_plan(steps, params, feeds, outs)), len(steps)


def child(mode: str, repeat: int) -> None:
    """Child process: time one engine (or the JIT of the fused plan); print one JSON line."""
    t0 = time.perf_counter()
    import npu_sim.kernels  # noqa: F401

    t1 = time.perf_counter()
    model = build_model()
    name = "kernels, fused" if mode == "jit" else mode
    run, calls = _engine(name, model)
    t2 = time.perf_counter()
    run()  # compiles (or loads from the cache) every kernel the model needs
    t3 = time.perf_counter()
    best = best_of(run, repeat)
    print(json.dumps({"import": t1 - t0, "first": t3 - t2, "best": best, "calls": calls}))


def _child(mode: str, repeat: int, env: dict[str, str] | None = None) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--repeat", str(repeat)],
        env={**os.environ, **(env or {})},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def check_outputs(model: onnx.ModelProto) -> None:
    """Both kernel plans give onnxruntime's logits and probabilities."""
    import onnxruntime as ort

    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    outs = [o.name for o in model.graph.output]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = sess.run(outs, {"gpu_0/data_0": x})
    for fuse in (True, False):
        got = run_plan(*plan(model, fuse), {"gpu_0/data_0": x}, outs)
        for name, a, e in zip(outs, got, ref, strict=True):
            # Logits are sums over up to 4608 products per layer through 50 layers: agree to
            # float32 accumulation-order noise relative to their scale.
            err = float(np.max(np.abs(a - e)) / (np.max(np.abs(e)) + 1e-30))
            assert err < 1e-3, f"{name}: max error {err:.2e} relative to the output's scale"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=10, help="timed runs per engine (best of)")
    p.add_argument("--rounds", type=int, default=2, help="child processes per engine")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    check_outputs(build_model())
    # Each engine is timed in its own process: an idle onnxruntime session's spinning pool
    # threads measurably slow other work in the same process, and vice versa. Rounds alternate
    # the engines to spread the noise of a shared machine; the best time of all counts.
    best = dict.fromkeys(ENGINES, float("inf"))
    calls = {}
    for _ in range(args.rounds):
        for name in ENGINES:
            r = _child(name, args.repeat)
            best[name] = min(best[name], r["best"])
            calls[name] = int(r["calls"])
    coretype = os.environ.get("OPENBLAS_CORETYPE", "auto-detected")
    print(
        f"ResNet-50 (light_resnet50, random weights), batch 1, 224x224, {THREADS} threads, "
        f"best of {args.rounds}x{args.repeat}; OpenBLAS core: {coretype}"
    )
    t_ort = best["onnxruntime CPU"]
    for name, t in best.items():
        extra = f"   ratio {t / t_ort:5.2f}x  ({calls[name]} kernel calls)" if calls[name] else ""
        print(f"  {name:<20}{t * 1e3:8.1f} ms{extra}")
    print("  outputs (logits, probabilities) match onnxruntime for both kernel plans")
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        cold = _child("jit", 2, {"NUMBA_CACHE_DIR": cache})
        warm = _child("jit", 2, {"NUMBA_CACHE_DIR": cache})
    print("  JIT of the fused plan's kernels, fresh NUMBA_CACHE_DIR (child processes):")
    for label, r in (("cold (compile)", cold), ("warm (cache)", warm)):
        print(
            f"    {label:<15} import {r['import']:.2f} s, first run {r['first']:.2f} s, "
            f"steady run {r['best']:.3f} s -> JIT/load overhead {r['first'] - r['best']:.2f} s"
        )
    return [*(info("kernels", f"ResNet-50 {name} / onnxruntime CPU", t / t_ort)
              for name, t in best.items() if calls[name]),
            info("kernels", "JIT load overhead, warm cache", warm["first"] - warm["best"], "s"),
            info("kernels", "JIT compile overhead, cold cache", cold["first"] - cold["best"],
                 "s")]


def main() -> None:
    args = parser().parse_known_args()[0]
    if args.child:
        child(args.child, args.repeat)
        return
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
