"""Recording many runs into one trace: what a profiling session keeps.

A device's :class:`~npu_sim.trace.recorder.TraceRecorder` holds the records of the current run
(the EP runtime clears it before each one). A :class:`Recording` takes each run's records as the
run finishes (:meth:`Recording.add_run`) and stitches them into one dependency graph:

- ids are renumbered from 0 in recording order;
- each run ends with a ``sync`` record on engine ``host`` (``run <name>``) that depends on the
  run's last records (``completion``), and the records of the next run that wait for nothing
  else, in it or in an earlier run, depend on it (``host``): the host submits a partition once
  the previous one finished. A record that waits for one of an earlier run (a streamed weight
  upload chained to the one before it, which landed during that run) keeps that edge instead;
- an edge between two kernels (and their commands) is told apart by address: ``data`` when the
  later kernel reads memory the earlier one wrote, otherwise ``arena`` (the compiler ordered
  them because the arena reuses memory the earlier one used);
- a record that waited for an engine (``start > ready``) depends on the record that held it
  (``engine``, :func:`.control.engine_edges`): derived here, after the run, so the device's
  hot path pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..config import DeviceConfig
from .control import engine_edges
from .format import Trace
from .recorder import TraceRecord


class Recording:
    """The records of every run while profiling is on, as one trace (see the module doc)."""

    def __init__(self, config: DeviceConfig, model: str = "", sdk_version: str = "",
                 meta: Mapping[str, Any] | None = None) -> None:
        self.config = config
        self.model = model
        self.sdk_version = sdk_version
        self.meta = dict(meta or {})
        self._runs: list[tuple[str, Iterable[TraceRecord], int, int]] = []

    def __len__(self) -> int:
        """Runs recorded."""
        return len(self._runs)

    def add_run(self, name: str, records: Iterable[TraceRecord], start: int, end: int) -> None:
        """Keep one run's records (in id order; a recorder's :meth:`~TraceRecorder.snapshot`
        keeps even building them for later): stitching waits for :meth:`trace`, so a run costs
        the session next to nothing."""
        self._runs.append((name, records, int(start), int(end)))

    def trace(self) -> Trace:
        """Everything recorded so far as one :class:`Trace` (see the module doc).

        Dependencies on records of an earlier run are kept; on records not recorded (before
        profiling started), dropped.
        """
        out: list[TraceRecord] = []
        last_host: int | None = None
        new_id: dict[int, int] = {}  # the device's record ids -> the trace's, over all runs
        for name, records, start, end in self._runs:
            last_host = _stitch(out, name, tuple(records), start, end, last_host, new_id)
        return Trace(self.config, tuple(out), self.model, self.sdk_version, dict(self.meta))


def _stitch(out: list[TraceRecord], name: str, records: tuple[TraceRecord, ...], start: int,
            end: int, last_host: int | None, new_id: dict[int, int]) -> int:
    """Append one run to ``out`` renumbered, with its host record; returns that record's id.
    ``new_id`` maps the device's ids of the runs stitched so far to the trace's, and gets this
    run's: a record may depend on one of an earlier run (a streamed weight upload that started
    while that run was going and landed after it, chained to the upload before it)."""
    base = len(out)
    new_id.update((r.id, base + i) for i, r in enumerate(records))
    kinds = _classify_kernel_edges(list(records))
    held = engine_edges(records)
    depended: set[int] = set()
    for rec in records:
        edges = [(new_id[d], kinds.get((rec.id, d), why)) for d, why in rec.edges
                 if d in new_id]
        waits = [e for e in edges if e[1] != "completion"]
        if not waits and last_host is not None:  # nothing before it in this run
            edges.append((last_host, "host"))
        depended.update(d for d, _ in edges)  # engine edges make no record less of a sink
        edges.extend((new_id[d], "engine") for d in held.get(rec.id, ()))
        edges.sort()
        out.append(rec.with_edges(edges, id=new_id[rec.id]))
    sinks = [base + i for i in range(len(records)) if base + i not in depended]
    host = [(last_host, "host")] if last_host is not None else []
    edges = sorted(host + [(s, "completion") for s in sinks])
    hid = len(out)
    out.append(TraceRecord(
        hid, "sync", "host", "host", f"run {name}", start, end,
        tuple(d for d, _ in edges), {"run": name}, tuple(w for _, w in edges), start, start))
    return hid


def _overlaps(a: list, b: list) -> bool:
    return any(x < y + m and y < x + n for x, n in a for y, m in b)


def _classify_kernel_edges(records: list[TraceRecord]) -> dict[tuple[int, int], str]:
    """``(record id, dependency id) -> why`` overrides: a DMA or kernel record's edges take
    the tags of its command's (``barrier``...), and edges between kernel commands, and from a
    kernel to the command of a kernel it follows, become ``data`` or ``arena``."""
    by_id = {r.id: r for r in records}
    kernel_of: dict[int, TraceRecord] = {}  # command record id -> its kernel record
    out: dict[tuple[int, int], str] = {}
    for r in records:
        if r.kind != "command":
            continue
        for d, why in r.edges:
            if why != "completion" or d not in by_id:
                continue
            device = by_id[d]
            if device.kind == "kernel":
                kernel_of[r.id] = device
            for dd, dwhy in r.edges:
                if dwhy != "completion":
                    out[(device.id, dd)] = dwhy
    for cmd_id, later in kernel_of.items():
        cmd = by_id[cmd_id]
        for d, why in cmd.edges:
            earlier = kernel_of.get(d)
            if why != "data" or earlier is None:
                continue
            reads, writes = later.work.get("reads"), earlier.work.get("writes")
            if reads is None or writes is None:
                continue
            kind = "data" if _overlaps(writes, reads) else "arena"
            out[(cmd_id, d)] = kind
            out[(later.id, d)] = kind
    return out
