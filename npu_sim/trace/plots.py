"""PNG figures of a trace: the timeline per engine, the roofline, the utilization.

Needs matplotlib (``pip install "npu-sim[plot]"``); without it :func:`plot_all` raises
:class:`~npu_sim.errors.TraceError` saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import TraceError
from .analysis import operators, report
from .exporters import lane_of
from .format import Trace


def plot_all(trace: Trace, folder: str | os.PathLike[str]) -> list[Path]:
    """Write ``timeline.png``, ``roofline.png`` and ``utilization.png`` into ``folder``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TraceError("--plot", "needs matplotlib: pip install 'npu-sim[plot]'") from None
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(12, 5))
    lanes: dict[str, list[tuple[int, int]]] = {}
    for r in trace.records:
        if r.kind in ("kernel", "dma"):
            for lane in lane_of(r):
                lanes.setdefault(lane, []).append((r.start - trace.start, r.cycles))
    for i, (_, spans) in enumerate(sorted(lanes.items())):
        ax.broken_barh(spans, (i - 0.4, 0.8))
    ax.set_yticks(range(len(lanes)), sorted(lanes))
    ax.set_xlabel("cycles")
    ax.set_title(f"{trace.model or 'trace'} on {trace.config.name}")
    paths.append(_save(fig, out / "timeline.png", plt))

    fig, ax = plt.subplots(figsize=(6, 5))
    rows = [o for o in operators(trace) if o["macs"] and o["hbm_bytes"]]
    if rows:
        peak = max(o["peak_ops_per_cycle"] for o in rows)
        bw = trace.config.hbm_bytes_per_cycle
        ridge = peak / bw
        xs = [ridge / 100, ridge, ridge * 100]
        ax.plot(xs, [min(peak, x * bw) for x in xs], color="black")
        ax.scatter([o["intensity"] for o in rows], [o["ops_per_cycle"] for o in rows])
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (ops / HBM byte)")
    ax.set_ylabel("ops / cycle")
    paths.append(_save(fig, out / "roofline.png", plt))

    fig, ax = plt.subplots(figsize=(8, 4))
    util = report(trace)["utilization"]
    ax.bar(list(util), [100 * u for u in util.values()])
    ax.set_ylabel("busy %")
    paths.append(_save(fig, out / "utilization.png", plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
