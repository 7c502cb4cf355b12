"""Control edges derived from a run's timeline after it ran: which engine a record waited for.

A record whose ``start`` is later than its ``ready`` waited for an engine: a kernel for the
cores it runs on (its ``work["core_ids"]``), a DMA chunk for a channel (its ``engine``). The
engine was held by the record that released it at ``start``: the earlier record on the same
engine whose ``end`` is the latest at or before ``start``. When that end is after ``ready`` the
record got an ``engine`` edge to it, one per awaited engine (a kernel on four cores may name up
to four holders). The device's hot path records nothing of this; :mod:`.capture` derives the
edges when it stitches a run's records into a trace, and elastic replay, which ignores them,
re-derives them from its re-timed records when those are built (:func:`rederived`).

Queue order adds no edge of its own: the firmware starts each command when its own dependencies
and its submission's last BARRIER are done, never after the previous command of its queue, and
the chunks of a DMA transfer share their transfer's dependencies and take channels first come
first served (a start order, not a finish-to-start one), so where a chunk waited behind another
its ``engine`` edge names it. ``docs/trace_format.md`` says so.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence

from .recorder import TraceRecord

DERIVED = frozenset({"engine", "order"})
"""The edge reasons derived from a timeline: elastic replay ignores them and re-derives them."""


def engines_held(rec: TraceRecord) -> tuple[str, ...]:
    """The engines ``rec`` held while it ran: a kernel's cores, otherwise its ``engine``."""
    cores = rec.work.get("core_ids") if rec.kind == "kernel" else None
    if cores:
        return tuple(f"core{c}" for c in cores)
    return (rec.engine,)


def engine_edges(records: Sequence[TraceRecord]) -> dict[int, tuple[int, ...]]:
    """``record id -> ids of the records it waited for the engines of`` (see the module doc);
    only records that waited appear. Each holder has a lower id than the record (it is on an
    earlier line of a trace): the latest-ending such record, ending in ``(ready, start]``."""
    lanes: dict[str, list[tuple[int, int]]] = {}  # engine -> (end, id) of its records, sorted
    for rec in records:
        for engine in engines_held(rec):
            lanes.setdefault(engine, []).append((rec.end, rec.id))
    for lane in lanes.values():
        lane.sort()
    out: dict[int, tuple[int, ...]] = {}
    for rec in records:
        if not 0 <= rec.ready < rec.start:
            continue
        found = set()
        for engine in engines_held(rec):
            lane = lanes[engine]
            i = bisect_right(lane, (rec.start, math.inf)) - 1
            while i >= 0 and lane[i][0] > rec.ready:
                if lane[i][1] < rec.id:
                    found.add(lane[i][1])
                    break
                i -= 1
        found.difference_update(rec.deps)  # an edge it already has keeps its reason
        if found:
            out[rec.id] = tuple(sorted(found))
    return out


def rederived(records: Sequence[TraceRecord]) -> tuple[TraceRecord, ...]:
    """``records`` (re-timed by a replay) with their ``engine`` and ``order`` edges replaced by
    the ``engine`` edges their own times imply: the recorded ones named who held an engine
    under the recording config."""
    stripped = [r if not DERIVED.intersection(r.why) else r.with_edges(
        [(d, why) for d, why in r.edges if why not in DERIVED]) for r in records]
    held = engine_edges(stripped)
    return tuple(r if r.id not in held else r.with_edges(
        sorted([*r.edges, *((d, "engine") for d in held[r.id])])) for r in stripped)


def without(edges: Iterable[tuple[int, str]], whys: frozenset[str]) -> tuple[int, ...]:
    """The dependency ids of ``edges`` whose reason is not in ``whys``."""
    return tuple(d for d, why in edges if why not in whys)
