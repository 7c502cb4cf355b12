"""Cycle fidelity against SCALE-Sim's stall-free closed forms and the roofline, per layer and
per whole model.

For SCALE-Sim-style layers (the convolutions of ResNet-18 at 224x224, an MLP at batch 64) this
prints, for each dataflow on the ``os32`` preset (32x32 array, stationary load exposed as
SCALE-Sim counts it), the layer's GEMM shape (``Sr`` output rows, ``Sc`` output columns, ``T``
reduction), our cycles (``npu_sim.cost.gemm_cycles`` / ``conv_cycles``) and the closed form:
OS ``ceil(Sr/R)*ceil(Sc/C)*(T+R+C-2) - 1``, WS ``ceil(T/R)*ceil(Sc/C)*(Sr+2R+C-2) - 1``,
IS ``ceil(T/R)*ceil(Sr/C)*(Sc+2R+C-2) - 1``. The last column is "hidden": the same layer with
shadow registers (every other preset's choice); "roofline" is the array's compute bound
``ceil(Sr*Sc*T / (R*C))``.

Then, for three whole models on ``npu-m`` (onnx's light ResNet-50, a BERT-base-sized
transformer encoder block at 128 tokens, the MLP at batch 64), all float32, compiled and run
timing-only: the simulated cycles of the run; the sum of the launches' cycles beside the
roofline bound (per launch ``max(MACs / peak MACs per cycle on every core, operand bytes / HBM
bytes per cycle)``, summed); the array launches' one-core compute beside the closed form of the
GEMMs this script maps them to itself (``Sr``, ``Sc``, ``T`` per group, hidden load:
``folds * (ceil(stream / rate) + R + C - 2)``); the share of launch time that is compute-,
memory- or overhead-bound (whichever of compute, memory and launch/fill/drain is largest); and
the run's energy and TOPS/W.

Run: ``python bench/bench_fidelity.py [--quick] [--json]`` (the tables in ``docs/cost_model.md``
are its output; ``--quick`` leaves out the whole models).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnx
from figures import Figure, at_most, bench_main, info
from onnx import TensorProto, helper

from ep.framework.provider import FusedNode
from ep.npusim.compiler import compile_partition
from ep.npusim.runtime import NpuRuntime
from npu_sim import DeviceConfig, TensorSpec
from npu_sim.cost import conv_cycles, gemm_cycles, op_cost

QUICK = ["--layers-only"]
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"

# (name, N, C, H, M, K, stride, pad): ResNet-18's distinct convolutions at 224x224.
RESNET18 = [
    ("conv1", 1, 3, 224, 64, 7, 2, 3),
    ("layer1 3x3", 1, 64, 56, 64, 3, 1, 1),
    ("layer2 3x3/2", 1, 64, 56, 128, 3, 2, 1),
    ("layer2 3x3", 1, 128, 28, 128, 3, 1, 1),
    ("layer2 1x1/2", 1, 64, 56, 128, 1, 2, 0),
    ("layer3 3x3", 1, 256, 14, 256, 3, 1, 1),
    ("layer4 3x3", 1, 512, 7, 512, 3, 1, 1),
]
# (name, M, K, N): an MLP at batch 64.
MLP = [("fc1 784->512", 64, 784, 512), ("fc2 512->256", 64, 512, 256), ("fc3 256->10", 64, 256, 10)]


def closed_form(flow: str, sr: int, sc: int, t: int, r: int, c: int) -> int:
    """SCALE-Sim 3.0.0's stall-free cycle count."""
    if flow == "os":
        return math.ceil(sr / r) * math.ceil(sc / c) * (t + r + c - 2) - 1
    if flow == "ws":
        return math.ceil(t / r) * math.ceil(sc / c) * (sr + 2 * r + c - 2) - 1
    return math.ceil(t / r) * math.ceil(sr / c) * (sc + 2 * r + c - 2) - 1


def rows() -> list[tuple]:
    """One row per (layer, dataflow): name, flow, Sr, Sc, T, ours, closed form, hidden."""
    out = []
    for flow in ("os", "ws", "is"):
        config = DeviceConfig.preset("os32").replace(dataflow=flow)
        hidden = config.replace(stationary_load="hidden")
        r, c = config.array_rows, config.array_cols
        for name, n, ch, h, m, k, stride, pad in RESNET18:
            oh = (h + 2 * pad - k) // stride + 1
            sr, sc, t = n * oh * oh, m, ch * k * k
            ours = conv_cycles(config, n, ch, h, h, m, k, k, stride, pad)
            quiet = conv_cycles(hidden, n, ch, h, h, m, k, k, stride, pad)
            out.append((name, flow, sr, sc, t, ours, closed_form(flow, sr, sc, t, r, c), quiet))
        for name, m, k, n in MLP:
            out.append((name, flow, m, n, k, gemm_cycles(config, m, n, k),
                        closed_form(flow, m, n, k, r, c), gemm_cycles(hidden, m, n, k)))
    return out


# -- whole models -------------------------------------------------------------------------------


def _model(name: str, nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [helper.make_tensor(k, TensorProto.FLOAT if v.dtype == np.float32 else TensorProto.INT64,
                            v.shape, v.flatten().tolist()) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def encoder_block(seq: int = 128, d: int = 768, heads: int = 12, ffn: int = 3072):
    """A post-norm transformer encoder block (BERT-base sizes), float32, random weights."""
    rng = np.random.default_rng(0)
    dh = d // heads
    inits = {n: (rng.normal(size=s) * 0.02).astype(np.float32) for n, s in (
        ("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)),
        ("w1", (d, ffn)), ("w2", (ffn, d)), ("g1", (d,)), ("b1", (d,)), ("g2", (d,)),
        ("b2", (d,)), ("bf1", (ffn,)), ("bf2", (d,)))}
    inits["heads"] = np.array([1, seq, heads, dh], np.int64)
    inits["merged"] = np.array([1, seq, d], np.int64)
    inits["scale"] = np.array(1 / math.sqrt(dh), np.float32)
    mk = helper.make_node
    nodes = []
    for t in ("q", "k", "v"):
        nodes += [mk("MatMul", ["x", f"w{t}"], [f"{t}0"]),
                  mk("Reshape", [f"{t}0", "heads"], [f"{t}1"]),
                  mk("Transpose", [f"{t}1"], [f"{t}2"],
                     perm=[0, 2, 3, 1] if t == "k" else [0, 2, 1, 3])]
    nodes += [mk("MatMul", ["q2", "k2"], ["s0"]), mk("Mul", ["s0", "scale"], ["s1"]),
              mk("Softmax", ["s1"], ["p"], axis=-1), mk("MatMul", ["p", "v2"], ["a0"]),
              mk("Transpose", ["a0"], ["a1"], perm=[0, 2, 1, 3]),
              mk("Reshape", ["a1", "merged"], ["a2"]), mk("MatMul", ["a2", "wo"], ["a3"]),
              mk("Add", ["x", "a3"], ["r1"]),
              mk("LayerNormalization", ["r1", "g1", "b1"], ["n1"], axis=-1),
              mk("MatMul", ["n1", "w1"], ["f0"]), mk("Add", ["f0", "bf1"], ["f1"]),
              mk("Gelu", ["f1"], ["f2"]), mk("MatMul", ["f2", "w2"], ["f3"]),
              mk("Add", ["f3", "bf2"], ["f4"]), mk("Add", ["n1", "f4"], ["r2"]),
              mk("LayerNormalization", ["r2", "g2", "b2"], ["y"], axis=-1)]
    return _model("encoder", nodes, [("x", (1, seq, d))], [("y", (1, seq, d))], inits)


def mlp(batch: int = 64):
    """The MLP of the layer table (784 -> 512 -> 256 -> 10, ReLU), float32, random weights."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "x"
    for i, (_, _, k, n) in enumerate(MLP):
        inits[f"w{i}"] = (rng.normal(size=(k, n)) * 0.05).astype(np.float32)
        inits[f"b{i}"] = np.zeros(n, np.float32)
        nodes += [helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"])]
        x = f"g{i}"
        if i < len(MLP) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    nodes[-1].output[0] = "y"
    return _model("mlp", nodes, [("x", (batch, 784))], [("y", (batch, 10))], inits)


def _fused(model: onnx.ModelProto, name: str) -> FusedNode:
    inits = {t.name for t in model.graph.initializer}
    return FusedNode(name, model.graph, [i.name for i in model.graph.input if i.name not in inits],
                     [o.name for o in model.graph.output], list(model.opset_import))


def _gemms(op: str, ins: list, out: TensorSpec, attrs: dict) -> tuple[int, int, int, int] | None:
    """``(items, Sr, Sc, T)`` of an array launch, mapped here independently of the cost model."""
    if op == "Conv":
        w = ins[1]
        g = int(attrs.get("group", 1))
        return g, out.shape[0] * math.prod(out.shape[2:]), w.shape[0] // g, \
            math.prod(w.shape[1:])
    if op in ("MatMul", "Gemm"):
        a, b = ins[0], ins[1]
        k = a.shape[0] if op == "Gemm" and attrs.get("transA") else a.shape[-1]
        n = out.shape[-1]
        if len(b.shape) > 2 and math.prod(b.shape[:-2]) > 1:
            return math.prod(out.shape[:-2]), out.shape[-2], n, k
        return 1, math.prod(out.shape[:-1]), n, k
    return None


def _closed_form_hidden(config: DeviceConfig, sr: int, sc: int, t: int, dtype: str) -> int:
    r, c, rate = config.array_rows, config.array_cols, config.macs_per_pe(dtype)
    folds, stream = {"os": (math.ceil(sr / r) * math.ceil(sc / c), t),
                     "ws": (math.ceil(t / r) * math.ceil(sc / c), sr),
                     "is": (math.ceil(t / r) * math.ceil(sr / c), sc)}[config.dataflow]
    return folds * (math.ceil(stream / rate) + r + c - 2)


def model_row(name: str, model: onnx.ModelProto, config: DeviceConfig) -> dict:
    """Figures of one whole model on ``config`` (see the module docstring)."""
    compiled = compile_partition(_fused(model, name), config)
    program, report = compiled.program, compiled.report
    specs = [TensorSpec(t.shape, t.dtype) for t in program.tensors]
    bw = config.hbm_bytes_per_cycle
    total = roof = ours_array = ref_array = 0
    bound = {"compute": 0, "memory": 0, "overhead": 0}
    for launch, entry in zip(program.launches, report.launches, strict=True):
        ins = [specs[t] if t >= 0 else None for t in launch.inputs]
        outs = [specs[t] for t in launch.outputs]
        cost = op_cost(config, launch.op, ins, outs, launch.attrs, entry["cores"])
        total += cost.total_cycles
        parts = {"compute": cost.compute_cycles, "memory": cost.memory_cycles,
                 "overhead": cost.overhead_cycles}
        bound[max(parts, key=parts.__getitem__)] += cost.total_cycles
        dtype = next(s.dtype for s in ins if s is not None)
        nbytes = sum(s.nbytes for s in [*ins, *outs] if s is not None)
        peak = config.peak_macs_per_cycle(dtype) if cost.macs else 1
        roof += max(cost.macs / peak, nbytes / bw)
        one = op_cost(config, launch.op, ins, outs, launch.attrs, 1)
        gemm = _gemms(launch.op, ins, outs[0], launch.attrs)
        if gemm is not None and one.engine == "array":
            items, sr, sc, t = gemm
            ours_array += one.compute_cycles
            ref_array += items * _closed_form_hidden(config, sr, sc, t, dtype)
    runtime = NpuRuntime(config, functional=False)
    runtime.run(name, runtime.load(program), None)
    stats = runtime.last_run_stats()
    return {"name": name, "launches": len(program.launches), "run": stats["cycles"],
            "sum": total, "roof": roof, "ours_array": ours_array, "ref_array": ref_array,
            "bound": {k: v / total for k, v in bound.items()},
            "energy_uj": stats["energy"]["total_pj"] / 1e6,
            "tops_per_w": stats["energy"]["tops_per_w"]}


def models() -> list[dict]:
    """The whole-model rows on npu-m."""
    config = DeviceConfig.preset("npu-m")
    return [model_row("ResNet-50 (light)", onnx.load(str(LIGHT / "light_resnet50.onnx")), config),
            model_row("encoder block", encoder_block(), config),
            model_row("MLP", mlp(), config)]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers-only", action="store_true", help="leave out the whole models")
    return p


def measure(args: argparse.Namespace) -> list[Figure]:
    print("| layer | flow | Sr | Sc | T | npu-sim (exposed) | SCALE-Sim closed form | "
          "npu-sim (hidden) | roofline |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    mismatches = 0
    pes = DeviceConfig.preset("os32").pes_per_core
    for name, flow, sr, sc, t, ours, ref, hidden in rows():
        mismatches += ours != ref
        print(f"| {name} | {flow} | {sr} | {sc} | {t} | {ours:,} | {ref:,} | {hidden:,} | "
              f"{-(-sr * sc * t // pes):,} |")
    print(f"\n{mismatches} of {len(rows())} rows differ from the closed form\n")
    found = [at_most("fidelity", "layers whose cycles differ from SCALE-Sim's closed form",
                     mismatches, 0, "")]
    if args.layers_only:
        return found
    print("| model (npu-m, float32) | launches | run cycles | sum of launch cycles | roofline "
          "| sum / roofline | array compute, 1 core / closed form | compute-bound | "
          "memory-bound | overhead-bound | energy (uJ) | TOPS/W |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in models():
        b = r["bound"]
        ratio = r["ours_array"] / r["ref_array"] if r["ref_array"] else float("nan")
        print(f"| {r['name']} | {r['launches']} | {r['run']:,} | {r['sum']:,} | "
              f"{r['roof']:,.0f} | {r['sum'] / r['roof']:.2f} | {ratio:.4f} | "
              f"{b['compute']:.0%} | {b['memory']:.0%} | {b['overhead']:.0%} | "
              f"{r['energy_uj']:,.1f} | {r['tops_per_w']:.3f} |")
        found += [info("fidelity", f"{r['name']}: launch cycles / roofline", r["sum"] / r["roof"]),
                  info("fidelity", f"{r['name']}: array cycles / closed form", ratio)]
    return found


def main() -> None:
    bench_main(parser(), measure, QUICK)


if __name__ == "__main__":
    main()
