"""Exporting a trace for other tools: Chrome/Perfetto trace JSON and ONNX Runtime profile JSON.

An exporter is a small class: :class:`Exporter` checks the arguments, loads the trace and writes
the file atomically; a subclass fills :meth:`Exporter._events` (the JSON document) and registers
itself with :func:`register`. :func:`export` picks one by name.

- ``perfetto``: one process per device; one lane (tid) per engine: the host, each firmware
  queue, each core's systolic array and vector unit, each DMA channel. Every record is an ``X``
  slice (``ts``/``dur`` in microseconds, cycles in ``args``); slices on a lane never overlap (a
  lane whose records overlap, such as a firmware queue running commands concurrently, is split
  into numbered sub-lanes). Every dependency edge is a flow (``s`` bound to the middle of the
  dependency's slice, ``f`` with ``"bp": "e"`` at the dependent's start, one id per edge).
  Counter tracks: HBM bandwidth (GB/s, from the kernels' HBM bytes), DMA queue depth
  (transfers ready and not finished), DMA bytes in flight.
- ``ort``: ONNX Runtime's profile, a bare JSON array of ``X`` events: a ``Session`` event per
  run (``model_run``) and a ``Node`` event ``<node>_kernel_time`` per kernel with ``op_name``,
  ``provider``, ``node_index``, ``input_type_shape`` and ``output_type_shape``, integer
  microseconds of simulated time.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..files import write_atomic
from .format import Trace, load
from .recorder import TraceRecord

EXPORTERS: dict[str, type[Exporter]] = {}


def register(cls: type[Exporter]) -> type[Exporter]:
    """Class decorator: make ``cls`` available to :func:`export` under ``cls.name``."""
    EXPORTERS[cls.name] = cls
    return cls


def export(trace: Trace | str | os.PathLike[str], format: str, path: str | os.PathLike[str],
           **options: Any) -> str:
    """Write ``trace`` (loaded or a path) as ``format`` to ``path``; returns ``str(path)``."""
    cls = EXPORTERS.get(format)
    if cls is None:
        raise TraceError("export", f"format={format!r}; expected one of {sorted(EXPORTERS)}")
    return str(cls(**options).write(load(trace), path))


class Exporter(ABC):
    """Template: :meth:`write` loads, builds with :meth:`_events` and writes atomically."""

    name = ""

    def write(self, trace: Trace, path: str | os.PathLike[str]) -> Path:
        """Write the export of ``trace`` to ``path`` (never half-written)."""
        document = self._events(trace)
        text = json.dumps(document, separators=(",", ":"))
        return write_atomic(path, [text.encode("utf-8")])

    @abstractmethod
    def _events(self, trace: Trace) -> Any:
        """The JSON document of ``trace``."""


# -- Perfetto -----------------------------------------------------------------------------------


def lane_of(rec: TraceRecord) -> list[str]:
    """The engine lanes ``rec`` occupies: ``core<i>.array``/``.vector`` for each core of a
    kernel, the channel of a DMA chunk, the queue of a command, ``host``."""
    if rec.kind == "kernel":
        unit = "vector" if rec.work.get("unit") == "vector" else "array"
        cores = rec.work.get("core_ids") or [rec.engine.removeprefix("core")]
        return [f"core{c}.{unit}" for c in cores]
    return [rec.engine]


def _lane_order(lane: str) -> tuple[int, str]:
    head = lane.split(".", 1)[0].rstrip("0123456789")
    rank = {"host": 0, "fw": 1, "core": 2, "dma": 3}.get(head, 4)
    digits = "".join(ch for ch in lane.split(".", 1)[0] if ch.isdigit())
    return rank, f"{int(digits or 0):04d}{lane}"


def _pack(slices: list[tuple[int, int, int]]) -> dict[int, int]:
    """Record id -> sub-lane (0, 1, ...) so that slices on one sub-lane never overlap."""
    ends: list[int] = []
    where: dict[int, int] = {}
    for start, end, rid in sorted(slices):
        for k, free_at in enumerate(ends):
            if free_at <= start:
                ends[k] = end
                where[rid] = k
                break
        else:
            where[rid] = len(ends)
            ends.append(end)
    return where


@register
class PerfettoExporter(Exporter):
    """Chrome trace-event JSON as the Perfetto UI and ``chrome://tracing`` read it."""

    name = "perfetto"
    pid = 1

    def _events(self, trace: Trace) -> dict[str, Any]:
        cfg = trace.config
        origin = trace.start

        def us(cycles: float) -> float:
            # Whole nanoseconds: slices that touch in cycles touch exactly in the file, so
            # rounding never makes neighbours on a lane overlap.
            return round((cycles - origin) / cfg.clock_ghz) / 1000

        placed = self._place(trace.records)
        lanes = sorted({lane for _, lane in placed}, key=_lane_order)
        tids = {lane: i + 1 for i, lane in enumerate(lanes)}
        events: list[dict[str, Any]] = [
            {"ph": "M", "pid": self.pid, "name": "process_name",
             "args": {"name": f"npu {cfg.name} ({trace.model or 'trace'})"}},
        ]
        for lane, tid in tids.items():
            events.append({"ph": "M", "pid": self.pid, "tid": tid, "name": "thread_name",
                           "args": {"name": lane}})
            events.append({"ph": "M", "pid": self.pid, "tid": tid, "name": "thread_sort_index",
                           "args": {"sort_index": tid}})
        by_id = trace.by_id()
        first_lane: dict[int, int] = {}
        for rid, lane in placed:
            rec = by_id[rid]
            tid = tids[lane]
            first_lane.setdefault(rid, tid)
            events.append({
                "ph": "X", "pid": self.pid, "tid": tid, "name": rec.name, "cat": rec.kind,
                "ts": us(rec.start), "dur": round(us(rec.end) - us(rec.start), 3),
                "args": {"id": rid, "start_cycle": rec.start, "end_cycle": rec.end,
                         "cycles": rec.cycles, "ready_cycle": rec.ready, "scope": rec.scope,
                         **_summary(rec.work)},
            })
        flow = 0
        for rec in trace.records:
            for d, why in rec.edges:
                dep = by_id[d]
                flow += 1
                # Leave from the middle of the dependency's slice; arrive at the dependent's
                # start, or for a completion (the dependent spans its dependency) at the
                # dependency's middle, inside the dependent.
                leave = (dep.start + dep.end) // 2
                arrive = max(rec.start, leave) if why == "completion" else rec.start
                events.append({"ph": "s", "pid": self.pid, "tid": first_lane[d], "id": flow,
                               "name": why, "cat": "dep", "ts": us(leave)})
                events.append({"ph": "f", "bp": "e", "pid": self.pid, "tid": first_lane[rec.id],
                               "id": flow, "name": why, "cat": "dep", "ts": us(arrive)})
        events.extend(self._counters(trace, us))
        return {"traceEvents": events,
                "metadata": {"npu-sim-trace": trace.model, "config": cfg.name,
                             "config_digest": cfg.digest, "clock_ghz": cfg.clock_ghz}}

    @staticmethod
    def _place(records: tuple[TraceRecord, ...]) -> list[tuple[int, str]]:
        """``(record id, lane)`` for each record on each of its lanes; a lane whose slices
        would overlap is split into sub-lanes ``<lane> #<n>``."""
        per_lane: dict[str, list[tuple[int, int, int]]] = {}
        for r in records:
            for lane in lane_of(r):
                per_lane.setdefault(lane, []).append((r.start, r.end, r.id))
        placed = []
        for lane, slices in per_lane.items():
            sub = _pack(slices)
            placed.extend((rid, lane if sub[rid] == 0 else f"{lane} #{sub[rid]}")
                          for _, _, rid in slices)
        return sorted(placed)

    @staticmethod
    def _counters(trace: Trace, us) -> Iterator[dict[str, Any]]:
        cfg = trace.config
        deltas: dict[str, dict[int, float]] = {"HBM bandwidth (GB/s)": {},
                                               "DMA queue depth": {},
                                               "DMA bytes in flight": {}}
        for r in trace.records:
            if r.kind == "kernel" and r.cycles:
                rate = r.work.get("hbm_bytes", 0) / cfg.cycles_to_us(r.cycles) / 1e3
                _step(deltas["HBM bandwidth (GB/s)"], r.start, r.end, rate)
            elif r.kind == "dma":
                _step(deltas["DMA bytes in flight"], r.start, r.end, r.work.get("bytes", 0))
                w = r.work  # a transfer is queued from ready until its last chunk lands
                if w.get("chunk", 0) == 0:
                    _add(deltas["DMA queue depth"], max(r.ready, 0), 1)
                if w.get("chunk", 0) == w.get("chunks", 1) - 1:
                    _add(deltas["DMA queue depth"], r.end, -1)
        for name, steps in deltas.items():
            level = 0.0
            for t in sorted(steps):
                level += steps[t]
                yield {"ph": "C", "pid": 1, "name": name, "ts": us(t),
                       "args": {"value": round(max(level, 0.0), 6)}}


def _add(steps: dict[int, float], t: int, value: float) -> None:
    steps[t] = steps.get(t, 0.0) + value


def _step(steps: dict[int, float], start: int, end: int, value: float) -> None:
    _add(steps, start, value)
    _add(steps, end, -value)


def _summary(work: dict[str, Any]) -> dict[str, Any]:
    """The work fields worth showing in a slice's details."""
    keep = ("op", "node", "macs", "bytes", "hbm_bytes", "cores", "direction", "chunk", "chunks",
            "inputs", "outputs", "command", "status", "energy", "run")
    return {k: work[k] for k in keep if k in work}


# -- ONNX Runtime profile -------------------------------------------------------------------------

_ORT_TYPES = {"float32": "float", "float64": "double"}


def _ort_shapes(specs: list) -> list[dict[str, list[int]]]:
    return [{_ORT_TYPES.get(s[1], s[1]): list(s[0])} for s in specs if s is not None]


def ort_events(trace: Trace, pid: int = 1, provider: str = "NpuSimExecutionProvider"
               ) -> list[dict[str, Any]]:
    """The trace as ONNX Runtime profile events (simulated time, integer microseconds)."""
    cfg = trace.config
    origin = trace.start

    def us(cycles: int) -> int:
        return int(round(cfg.cycles_to_us(cycles - origin)))

    events: list[dict[str, Any]] = []
    index = 0
    for r in trace.records:
        if r.kind == "sync" and r.engine == "host":
            events.append({"cat": "Session", "pid": pid, "tid": pid, "dur": us(r.end) - us(r.start),
                           "ts": us(r.start), "ph": "X", "name": "model_run",
                           "args": {"partition": str(r.work.get("run", "")),
                                    "cycles": r.cycles}})
        elif r.kind == "kernel":
            w = r.work
            node = str(w.get("node") or r.name)
            outputs = [s for s in w.get("outputs", []) if s is not None]
            events.append({
                "cat": "Node", "pid": pid, "tid": pid, "dur": us(r.end) - us(r.start),
                "ts": us(r.start), "ph": "X", "name": f"{node}_kernel_time",
                "args": {"op_name": str(w.get("op", "")), "provider": provider,
                         "node_index": str(index),
                         "input_type_shape": _ort_shapes(w.get("inputs", [])),
                         "output_type_shape": _ort_shapes(outputs),
                         "output_size": str(_nbytes(outputs)),
                         "cycles": r.cycles, "clock": "simulated"},
            })
            index += 1
    return events


def _nbytes(specs: list) -> int:
    from ..dtypes import itemsize

    total = 0
    for shape, dtype in specs:
        n = 1
        for d in shape:
            n *= int(d)
        total += n * itemsize(dtype)
    return total


@register
class OrtExporter(Exporter):
    """ONNX Runtime's profile format (a bare JSON array)."""

    name = "ort"

    def _events(self, trace: Trace) -> list[dict[str, Any]]:
        return ort_events(trace)
