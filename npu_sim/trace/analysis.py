"""Analysing a trace: where the time went, what bounds each operator, and what changed.

:func:`report` gives per-engine utilization, how much DMA overlapped compute, the critical
path (the chain of records, each the last-finishing dependency of the next, that ends at the
makespan), the operators by time and each operator's place on the roofline: arithmetic
intensity (2 * MACs per HBM byte) against the ridge point of the config (peak ops per cycle
over HBM bytes per cycle), compute-bound at or above it, memory-bound below. :func:`diff`
compares two traces operator by operator (kernels matched by ONNX node). Both return plain
dicts (what ``--json`` prints); :func:`format_report` and :func:`format_diff` render text.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import ConfigError
from .format import Trace
from .recorder import TraceRecord
from .retime import busy_cycles


def _union(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        elif end > start:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in intervals)


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def critical_path(trace: Trace) -> list[TraceRecord]:
    """The chain that sets the makespan: from the last record to end, each step back the
    dependency that finished last (ties: the lower id), first record first. A record that
    waited for an engine steps back through its ``engine`` edge to the record that held it,
    which finished after everything it read."""
    if not trace.records:
        return []
    by_id = trace.by_id()
    node = max(trace.records, key=lambda r: (r.end, -r.id))
    chain = [node]
    while node.deps:
        node = max((by_id[d] for d in node.deps), key=lambda r: (r.end, -r.id))
        chain.append(node)
    return chain[::-1]


def _via(earlier: TraceRecord, later: TraceRecord) -> str:
    """Why ``later`` waited for ``earlier`` (one step of the critical path)."""
    return later.edge_kind(later.deps.index(earlier.id))


def _node_key(rec: TraceRecord) -> str:
    return str(rec.work.get("node") or rec.name)


def _macs_per_cycle(trace: Trace, dtype: str) -> float:
    try:
        return trace.config.peak_macs_per_cycle(dtype)
    except ConfigError:  # a dtype the array has no rate for (int64 indices...): float16's
        return trace.config.peak_macs_per_cycle("float16")


def operators(trace: Trace) -> list[dict[str, Any]]:
    """Per ONNX node (summed over runs): op, launches, cycles, MACs, HBM bytes, arithmetic
    intensity, attained and peak ops per cycle, and ``bound`` (compute, memory or vector)."""
    rows: dict[str, dict[str, Any]] = {}
    hbm_per_cycle = trace.config.hbm_bytes_per_cycle
    for r in trace.records:
        if r.kind != "kernel":
            continue
        w = r.work
        row = rows.setdefault(_node_key(r), {
            "node": _node_key(r), "op": w.get("op", ""), "launches": 0, "cycles": 0, "macs": 0,
            "hbm_bytes": 0, "unit": w.get("unit", "array"), "cores": w.get("cores", 1),
            "dtype": (w.get("outputs") or [[None, "float32"]])[0][1]})
        row["launches"] += 1
        row["cycles"] += r.cycles
        row["macs"] += int(w.get("macs", 0))
        row["hbm_bytes"] += int(w.get("hbm_bytes", 0))
    out = []
    for row in rows.values():
        ops = 2 * row["macs"]
        intensity = ops / row["hbm_bytes"] if row["hbm_bytes"] else float("inf") if ops else 0.0
        peak = 2 * _macs_per_cycle(trace, row["dtype"]) * row["cores"] / trace.config.cores
        ridge = peak / hbm_per_cycle
        bound = "vector" if not ops else "compute" if intensity >= ridge else "memory"
        out.append({**row, "intensity": intensity, "ridge": ridge,
                     "ops_per_cycle": ops / row["cycles"] if row["cycles"] else 0.0,
                     "peak_ops_per_cycle": peak, "bound": bound})
    return sorted(out, key=lambda r: (-r["cycles"], r["node"]))


def report(trace: Trace, top: int = 10) -> dict[str, Any]:
    """The analysis of ``trace`` (see the module docstring) as a plain dict."""
    span = trace.makespan
    busy = busy_cycles(trace.records)
    dma = _union((r.start, r.end) for r in trace.records if r.kind == "dma")
    compute = _union((r.start, r.end) for r in trace.records if r.kind == "kernel")
    both = _intersection(dma, compute)
    by_op: dict[str, dict[str, Any]] = {}
    for row in operators(trace):
        agg = by_op.setdefault(row["op"], {"op": row["op"], "cycles": 0, "launches": 0})
        agg["cycles"] += row["cycles"]
        agg["launches"] += row["launches"]
    kernel_cycles = sum(a["cycles"] for a in by_op.values()) or 1
    ops = sorted(by_op.values(), key=lambda a: (-a["cycles"], a["op"]))
    for agg in ops:
        agg["share"] = agg["cycles"] / kernel_cycles
    path = critical_path(trace)
    energy: dict[str, float] = {}
    for r in trace.records:
        for part, value in (r.work.get("energy") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                energy[part] = energy.get(part, 0.0) + value
    return {
        "model": trace.model, "config": trace.config.name, "records": len(trace.records),
        "makespan_cycles": span, "makespan_us": trace.config.cycles_to_us(span),
        "utilization": {e: (b / span if span else 0.0) for e, b in sorted(busy.items())},
        "dma_cycles": _length(dma), "compute_cycles": _length(compute),
        "overlap_cycles": both,
        "overlap_of_dma": both / _length(dma) if dma else 0.0,
        "critical_path": [{"id": r.id, "kind": r.kind, "name": r.name, "engine": r.engine,
                           "start": r.start, "end": r.end, "cycles": r.cycles,
                           "via": _via(path[i - 1], r) if i else None}
                          for i, r in enumerate(path)],
        "top_ops": ops[:top],
        "operators": operators(trace)[:top],
        "energy": energy,
    }


def diff(a: Trace, b: Trace) -> dict[str, Any]:
    """``b`` against ``a``, operator by operator (kernels matched by node, summed over runs):
    cycles in each, the difference and the ratio; nodes only one trace has are listed too."""
    ra = {row["node"]: row for row in operators(a)}
    rb = {row["node"]: row for row in operators(b)}
    rows = []
    for node in sorted(set(ra) | set(rb)):
        ca = ra[node]["cycles"] if node in ra else None
        cb = rb[node]["cycles"] if node in rb else None
        rows.append({"node": node, "op": (ra.get(node) or rb.get(node))["op"], "a": ca, "b": cb,
                     "delta": None if ca is None or cb is None else cb - ca,
                     "ratio": None if not ca or cb is None else cb / ca})
    rows.sort(key=lambda r: -abs(r["delta"] or 0))
    return {"a": {"model": a.model, "config": a.config.name, "makespan_cycles": a.makespan},
            "b": {"model": b.model, "config": b.config.name, "makespan_cycles": b.makespan},
            "makespan_delta": b.makespan - a.makespan,
            "makespan_ratio": b.makespan / a.makespan if a.makespan else None,
            "operators": rows}


def format_report(rep: dict[str, Any]) -> str:
    """``report()`` as text."""
    out = [f"trace of {rep['model'] or '?'} on {rep['config']}: {rep['records']} records, "
           f"makespan {rep['makespan_cycles']:,} cycles = {rep['makespan_us']:.2f} us"]
    out.append("utilization: " + ", ".join(f"{e} {100 * u:.0f}%"
                                           for e, u in rep["utilization"].items()))
    out.append(f"DMA {rep['dma_cycles']:,} cycles, compute {rep['compute_cycles']:,} cycles, "
               f"overlapped {rep['overlap_cycles']:,} ({100 * rep['overlap_of_dma']:.0f}% of "
               "DMA time)")
    out.append(f"critical path ({len(rep['critical_path'])} records):")
    previous = None
    for step in rep["critical_path"]:
        if step["kind"] in ("dma", "kernel"):  # commands and host steps only wrap these
            held = (f"  (waited for {step['engine']} held by {previous['name']})"
                    if step.get("via") == "engine" and previous else "")
            out.append(f"  {step['start']:>10,} {step['cycles']:>9,}  {step['kind']:<7} "
                       f"{step['engine']:<8} {step['name']}{held}")
        previous = step
    out.append("top operators by time:")
    for agg in rep["top_ops"]:
        out.append(f"  {agg['op']:<22} {agg['cycles']:>10,} cycles {100 * agg['share']:5.1f}% "
                   f"({agg['launches']} launches)")
    out.append("roofline (per node): intensity ops/B, ridge, bound")
    for row in rep["operators"]:
        out.append(f"  {row['node'][:32]:<32} {row['op']:<18} {row['intensity']:9.2f} "
                   f"{row['ridge']:8.2f}  {row['bound']}")
    if rep["energy"]:
        out.append("energy: " + ", ".join(f"{k} {v:.4g}" for k, v in rep["energy"].items()))
    return "\n".join(out)


def format_diff(d: dict[str, Any]) -> str:
    """``diff()`` as text."""
    ratio = d["makespan_ratio"]
    out = [f"A: {d['a']['model']} on {d['a']['config']}, {d['a']['makespan_cycles']:,} cycles",
           f"B: {d['b']['model']} on {d['b']['config']}, {d['b']['makespan_cycles']:,} cycles",
           f"makespan delta {d['makespan_delta']:+,} cycles"
           + (f" (x{ratio:.3f})" if ratio is not None else "")]
    for row in d["operators"]:
        a = "-" if row["a"] is None else f"{row['a']:,}"
        b = "-" if row["b"] is None else f"{row['b']:,}"
        delta = "" if row["delta"] is None else f"{row['delta']:+,}"
        out.append(f"  {row['node'][:32]:<32} {row['op']:<18} {a:>10} {b:>10} {delta:>10}")
    return "\n".join(out)
