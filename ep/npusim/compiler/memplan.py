"""Memory plan: where every activation lives in the arena, reusing memory by liveness.

Every activation tensor (graph inputs and outputs included: they live in the arena and the loader
DMAs them in and out) is a :class:`Buffer` with a size and a lifetime ``[first, last]`` in
launch steps: produced at ``first`` (graph inputs at -1, before the first launch), last read at
``last`` (graph outputs at the end). Two buffers whose lifetimes intersect must not overlap in
memory; buffers whose lifetimes are disjoint may share it.

:func:`plan_arena` places them with the greedy heuristic TFLite's ``GreedyMemoryPlanner`` and
PPLNN's compact planner use: largest first, each at the lowest-waste gap (best fit) among the
buffers already placed that are alive at the same time, else above them. Offsets and sizes are
rounded to the device's HBM alignment. The result reports three figures:

- ``peak``: the arena size this plan needs;
- ``lower_bound``: the largest total (aligned) size of buffers alive at one step, which no
  plan can beat;
- ``no_reuse``: the sum of every buffer's aligned size, what a plan without reuse would need.

Weights are not planned here: they go to the read-only WEIGHTS region, one after another,
stored once per distinct content (:func:`plan_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .lower import Lowered


def align_up(value: int, alignment: int) -> int:
    """``value`` rounded up to a multiple of ``alignment``."""
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class Buffer:
    """One arena allocation: ``size`` bytes alive from step ``first`` to step ``last``."""

    key: int
    size: int
    first: int
    last: int


@dataclass(frozen=True)
class ArenaPlan:
    """Offsets by buffer key, and the figures that judge the plan (see module docstring)."""

    offsets: Mapping[int, int]
    peak: int
    lower_bound: int
    no_reuse: int
    alignment: int

    @property
    def ratio(self) -> float:
        """``peak / lower_bound`` (1.0 is optimal; 1.0 for an empty arena)."""
        return self.peak / self.lower_bound if self.lower_bound else 1.0


def plan_arena(buffers: Sequence[Buffer], alignment: int) -> ArenaPlan:
    """Place ``buffers`` in one arena, greedy by size with best-fit gaps (see module doc)."""
    sizes = {b.key: align_up(max(b.size, 1), alignment) for b in buffers}
    order = sorted(buffers, key=lambda b: (-sizes[b.key], b.first, b.key))
    placed: list[tuple[int, int, Buffer]] = []  # (offset, aligned size, buffer)
    offsets: dict[int, int] = {}
    # The placed buffers' offsets, ends and lifetimes as arrays: finding those alive with a
    # buffer is O(n) per buffer in numpy, not in Python (a 3,000-kernel chain: 0.55 s of its
    # 1 s creation, checking 9 million pairs).
    starts, ends, firsts, lasts = (np.empty(len(order), np.int64) for _ in range(4))
    for k, buf in enumerate(order):
        need = sizes[buf.key]
        alive = np.flatnonzero((firsts[:k] <= buf.last) & (lasts[:k] >= buf.first))
        busy = sorted(zip(starts[alive].tolist(), ends[alive].tolist(), strict=True))
        best, best_waste, cursor = None, None, 0
        for start, end in busy:
            gap = start - cursor
            if gap >= need and (best_waste is None or gap - need < best_waste):
                best, best_waste = cursor, gap - need
            cursor = max(cursor, end)
        offset = cursor if best is None else best
        offsets[buf.key] = offset
        placed.append((offset, need, buf))
        starts[k], ends[k], firsts[k], lasts[k] = offset, offset + need, buf.first, buf.last
    peak = max((off + size for off, size, _ in placed), default=0)
    return ArenaPlan(offsets, peak, lower_bound(buffers, alignment),
                     sum(sizes.values()), alignment)


def lower_bound(buffers: Sequence[Buffer], alignment: int) -> int:
    """The largest total aligned size of buffers alive at the same step."""
    events: dict[int, int] = {}
    for b in buffers:
        size = align_up(max(b.size, 1), alignment)
        events[b.first] = events.get(b.first, 0) + size
        events[b.last + 1] = events.get(b.last + 1, 0) - size
    live = best = 0
    for step in sorted(events):
        live += events[step]
        best = max(best, live)
    return best


@dataclass(frozen=True)
class WeightsPlan:
    """Offsets of weight tensors in the WEIGHTS region; equal contents share one offset.

    ``blobs`` are read-only byte views of the weight arrays (no copy: a model's weights can
    be hundreds of megabytes).
    """

    offsets: Mapping[str, int]
    blobs: Mapping[str, memoryview]
    total_bytes: int
    distinct: int


SAMPLE_BYTES = 64
"""Bytes read at each end of a weight to tell most different contents apart without reading
the rest."""


def plan_weights(weights: Mapping[str, np.ndarray], alignment: int) -> WeightsPlan:
    """Lay the weights out one after another, aligned, each distinct content stored once.

    Contents are compared byte for byte, and only between weights of the same byte length
    whose first and last :data:`SAMPLE_BYTES` agree: weights of different contents almost
    always differ there (random or trained values), so most weights are never read in full.
    Hashing every weight of a shared length instead cost 0.2 s on a BERT-base (80 matrices of
    768 x 768).
    """
    blobs = {name: _byte_view(value) for name, value in weights.items()}
    offsets: dict[str, int] = {}
    stored: dict[tuple[int, bytes, bytes], list[tuple[np.ndarray, int]]] = {}
    cursor = 0
    for name, data in blobs.items():
        size = len(data)
        key = (size, bytes(data[:SAMPLE_BYTES]), bytes(data[-SAMPLE_BYTES:]))
        same = stored.setdefault(key, [])
        content = np.frombuffer(data, np.uint8)
        offset = next((at for other, at in same if np.array_equal(other, content)), None)
        if offset is None:
            offset = cursor
            same.append((content, offset))
            cursor = align_up(cursor + max(size, 1), alignment)
        offsets[name] = offset
    return WeightsPlan(offsets, blobs, cursor, sum(len(v) for v in stored.values()))


def _byte_view(value: np.ndarray) -> memoryview:
    """The bytes of ``value`` (little-endian hosts only, like the device), read-only, no copy
    unless it is not contiguous."""
    flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    flat.flags.writeable = False
    return memoryview(flat)


def liveness(lowered: Lowered) -> list[Buffer]:
    """The arena buffers of a lowered graph with their lifetimes in launch steps.

    A buffer is an activation and its views (:mod:`.lower`). It is born at its producer's step
    (-1 for graph inputs) and dies at its last reader's step (the end, ``len(launches)``, for
    graph outputs). A graph output that folded to a constant stays in the WEIGHTS region and
    the loader reads it from there.
    """
    end = len(lowered.launches)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i in lowered.inputs:
        first[lowered.tensors[i].buffer] = -1
    for step, launch in enumerate(lowered.launches):
        for t in launch.outputs:
            buf = lowered.tensors[t].buffer
            first.setdefault(buf, step)
            last[buf] = max(last.get(buf, step), step)
        for t in launch.inputs:
            if t >= 0 and not lowered.tensors[t].is_const:
                last[lowered.tensors[t].buffer] = step
    for t in lowered.outputs:
        if lowered.tensors[t].is_const:
            continue
        buf = lowered.tensors[t].buffer
        first.setdefault(buf, -1)
        last[buf] = end
    return [Buffer(b, buffer_bytes(lowered, b), first[b], last.get(b, first[b]))
            for b in sorted(first)]


def buffer_bytes(lowered: Lowered, buffer: int) -> int:
    """Bytes of the storage ``buffer`` (its root tensor's size)."""
    return lowered.tensors[buffer].nbytes
