"""Cycle fidelity against SCALE-Sim's stall-free closed forms, per dataflow.

For SCALE-Sim-style layers (the convolutions of ResNet-18 at 224x224, an MLP at batch 64) this
prints, for each dataflow on the ``os32`` preset (32x32 array, stationary load exposed as
SCALE-Sim counts it), the layer's GEMM shape (``Sr`` output rows, ``Sc`` output columns, ``T``
reduction), our cycles (``npu_sim.cost.gemm_cycles`` / ``conv_cycles``) and the closed form:
OS ``ceil(Sr/R)*ceil(Sc/C)*(T+R+C-2) - 1``, WS ``ceil(T/R)*ceil(Sc/C)*(Sr+2R+C-2) - 1``,
IS ``ceil(T/R)*ceil(Sr/C)*(Sc+2R+C-2) - 1``. The last column is "hidden": the same layer with
shadow registers (every other preset's choice).

Run: ``python bench/bench_fidelity.py`` (the table in ``docs/cost_model.md`` is its output).
"""

from __future__ import annotations

import math

from npu_sim import DeviceConfig
from npu_sim.cost import conv_cycles, gemm_cycles

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


def main() -> None:
    print("| layer | flow | Sr | Sc | T | npu-sim (exposed) | SCALE-Sim closed form | "
          "npu-sim (hidden) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    mismatches = 0
    for name, flow, sr, sc, t, ours, ref, hidden in rows():
        mismatches += ours != ref
        print(f"| {name} | {flow} | {sr} | {sc} | {t} | {ours:,} | {ref:,} | {hidden:,} |")
    print(f"\n{mismatches} of {len(rows())} rows differ from the closed form")


if __name__ == "__main__":
    main()
