"""Control edges derived from a run's timeline after it ran: which engine a record waited for.

A record whose ``start`` is later than its ``ready`` waited for an engine: a kernel for the
cores it runs on (its ``work["core_ids"]``), a DMA chunk for a channel (its ``engine``). The
engine was held by the record that released it at ``start``: the earlier record on the same
engine whose ``end`` is the latest at or before ``start``. When that end is after ``ready`` the
record got an ``engine`` edge to it, one per awaited engine (a kernel on four cores may name up
to four holders). The device's hot path records nothing of this; :mod:`.capture` derives the
edges when it stitches a run's records into a trace.

Queue order adds no edge of its own: the firmware starts each command when its own dependencies
and its submission's last BARRIER are done, never after the previous command of its queue, and
the chunks of a DMA transfer share their transfer's dependencies and take channels first come
first served (a start order, not a finish-to-start one), so where a chunk waited behind another
its ``engine`` edge names it. ``docs/trace_format.md`` says so.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterable, Sequence

from .recorder import TraceRecord


def engines_held(rec: TraceRecord) -> tuple[str, ...]:
    """The engines ``rec`` held while it ran: a kernel's cores, otherwise its ``engine``."""
    cores = rec.work.get("core_ids") if rec.kind == "kernel" else None
    if cores:
        return tuple(f"core{c}" for c in cores)
    return (rec.engine,)


def engine_edges(records: Sequence[TraceRecord]) -> dict[int, tuple[int, ...]]:
    """``record id -> ids of the records it waited for the engines of`` (see the module doc),
    for the records of one run in id order; only records that waited appear."""
    held: dict[str, list[tuple[int, int]]] = {}  # engine -> (end, id) of its records, sorted
    out: dict[int, tuple[int, ...]] = {}
    for rec in records:
        engines = engines_held(rec)
        if 0 <= rec.ready < rec.start:
            found = set()
            for engine in engines:
                ends = held.get(engine)
                if not ends:
                    continue
                i = bisect_right(ends, (rec.start, rec.id)) - 1
                if i >= 0 and ends[i][0] > rec.ready:
                    found.add(ends[i][1])
            found.difference_update(rec.deps)  # an edge it already has keeps its reason
            if found:
                out[rec.id] = tuple(sorted(found))
        for engine in engines:
            insort(held.setdefault(engine, []), (rec.end, rec.id))
    return out


def without(edges: Iterable[tuple[int, str]], whys: frozenset[str]) -> tuple[int, ...]:
    """The dependency ids of ``edges`` whose reason is not in ``whys``."""
    return tuple(d for d, why in edges if why not in whys)
