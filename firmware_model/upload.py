"""Uploading a program's weights to its WEIGHTS region: few, large DMAs straight from host memory.

A loader moves weights the way they lie. The weights of a program loaded from a context binary
are read-only views into one mapped file, laid out as the program's WEIGHTS region is (same
order, same padding), so a whole run of them is one contiguous host range going to one
contiguous HBM range: one DMA, which the device chunks at ``dma_chunk_bytes``. The bytes moved
are the weights plus the padding between them; nothing is copied on the host.
"""

from __future__ import annotations

import contextlib
import mmap
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np
import simpy

from npu_sim.dma import DMA_ALIGNMENT
from npu_sim.hbm import DeviceBuffer

from .commands import Dma
from .program import Program

if TYPE_CHECKING:
    from .processor import Firmware

_MAX_GAP = 4096
"""Largest gap (bytes) a coalesced weight upload carries between two weights: alignment padding,
not data worth a transfer of its own."""


def upload_weights(fw: Firmware, program: Program, base: int) -> None:
    """DMA every weight straight from its own host memory to ``base + offset``.

    The weights are usually read-only views into a mapped context binary. Weights whose host
    bytes lie in one buffer at the same distances as their HBM ranges (the context binary lays a
    program's weights out as its WEIGHTS region does, with the same padding) go as one DMA, as a
    real loader moves them: the device then chunks it at ``dma_chunk_bytes``. Such a run carries
    the host's bytes between its weights (fewer than ``_MAX_GAP``; zero padding in a context
    binary). Each run's host range is mapped once (no copy). A weight at an offset that is not
    DMA-aligned goes alone, through a small staging window that starts at the aligned address
    below it and holds the bytes that belong there (a neighbouring weight's, or zeros). Other
    gaps are not written: fresh HBM reads as zeros.
    """
    device = fw.device
    spans: dict[int, tuple[int, np.ndarray]] = {}  # offset -> (end, host bytes), one per range
    for i, data in program.weights.items():
        host = host_bytes(data)
        if host.size:
            spans.setdefault(program.tensors[i].offset, (program.tensors[i].offset + host.size,
                                                         host))
    order = sorted(spans)
    maps: dict[tuple[int, int], int] = {}  # (host address, bytes) -> iova
    dmas: list[tuple[int, int, int]] = []  # (iova, HBM address, bytes)
    try:
        for start, host in _upload_runs(spans, order, _owner_of(program)):
            key = (host_address(host), host.size)
            if key not in maps:
                maps[key] = device.map_host(host, share=True)
            dmas.append((maps[key], base + start, host.size))
        fw.run([Dma(n, src, dst, size) for n, (src, dst, size) in enumerate(dmas)])
    finally:
        for iova in maps.values():
            device.unmap_host(iova)
    for data in program.weights.values():
        drop_resident(data)


def stream_weights(fw: Firmware, program: Program,
                   placed: Sequence[tuple[int, np.ndarray, int]], buffer: DeviceBuffer,
                   after: simpy.Event | None = None) -> tuple[dict[int, simpy.Event],
                                                              simpy.Event | None]:
    """Start uploading each ``(offset, host bytes, tensor)`` of ``placed`` (a non-empty weight
    of ``program``, its bytes going to ``buffer`` at ``offset``), without waiting: one
    asynchronous DMA per weight (chunked by the device at ``dma_chunk_bytes``), in the order
    the program's launches first read them, each queued behind the previous (and the first
    behind ``after``), so the channels carry one weight at a time and a run's own DMAs are not
    stuck behind all of them. Returns each weight tensor's arrival event and the last upload's.
    A kernel given those events as dependencies starts as soon as its weights are in HBM
    (weight streaming). The ranges of ``placed`` do not overlap (the loader refuses weights
    that overlap other than exactly, and the weight store passes one tensor per range), so a
    DMA-aligned weight is one transfer of its own bytes; one at an unaligned offset goes with
    its staging window (see :func:`upload_weights`), which may hold a weight before it."""
    launches = program.launches
    first_use: dict[int, int] = {}
    for k, launch in enumerate(launches):
        for t in launch.inputs:
            if t not in first_use:
                first_use[t] = k
    late = len(launches)
    placed = sorted(placed, key=itemgetter(0))
    runs: list[tuple[int, int, np.ndarray, tuple[int, ...]]] = []  # (rank, start, host, tensors)
    spans: dict[int, tuple[int, np.ndarray]] = {}  # for staging windows: offset -> (end, host)
    order: list[int] = []
    for k, (offset, host, tensor) in enumerate(placed):
        if not offset % DMA_ALIGNMENT:
            runs.append((first_use.get(tensor, late), offset, host, (tensor,)))
            continue
        if not spans:
            order = [o for o, _, _ in placed]
            spans = {o: (o + h.size, h) for o, h, _ in placed}
        start = offset - offset % DMA_ALIGNMENT
        covered = [t for _, _, t in placed[bisect_left(order, start):k + 1]]
        runs.append((min(first_use.get(t, late) for t in covered), start,
                     _staging(spans, order, k, start), tuple(covered)))
    runs.sort(key=itemgetter(0))  # stable: runs first read together keep their HBM order
    arrivals = fw.device.memcpy_h2d_chain(buffer, [(host, start) for _, start, host, _ in runs],
                                          after=after, share=True)
    events: dict[int, simpy.Event] = {}
    for (_, _, _, tensors), arrived in zip(runs, arrivals, strict=True):
        for t in tensors:
            events[t] = arrived
    drop = _DropLanded(program.weights, [tensors for *_, tensors in runs])
    for arrived in arrivals:
        arrived.callbacks.append(drop)
    return events, arrivals[-1] if arrivals else after


class _DropLanded:
    """The callback on every arrival of a chain of weight uploads: once a transfer has landed,
    :func:`drop_resident` the host pages of the weights it carried. One object for the chain:
    its arrivals are processed in order, each after the previous one."""

    __slots__ = ("_weights", "_runs", "_landed")

    def __init__(self, weights: Mapping[int, bytes], runs: list[tuple[int, ...]]) -> None:
        self._weights = weights
        self._runs = runs
        self._landed = 0

    def __call__(self, _arrival: simpy.Event) -> None:
        tensors = self._runs[self._landed]
        self._landed += 1
        for t in tensors:
            drop_resident(self._weights[t])


def drop_resident(data: bytes | bytearray | memoryview) -> None:
    """Let the OS drop the host pages of ``data`` from this process's resident set, when
    ``data`` is a read-only view of a file mapping (a context binary, an external weight file)
    whose bytes have been used (uploaded, checksummed): they stay in the page cache and fault in
    again if read. Peak host memory of a loaded model is then about one copy of its weights (the
    device's), not two. Anything else (bytes, arrays, a writable or private mapping, whose pages
    may hold the only copy) is left alone."""
    if not isinstance(data, memoryview) or not data.readonly or \
            not isinstance(data.obj, mmap.mmap) or data.obj.closed:
        return
    mapping = data.obj
    try:
        base = host_address(np.frombuffer(mapping, np.uint8))
        start = host_address(host_bytes(data)) - base
    except (BufferError, TypeError, ValueError):
        return
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, (start + data.nbytes) // page * page
    if hi > lo:
        with contextlib.suppress(OSError, ValueError):
            mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _owner_of(program: Program) -> dict[int, tuple[int, np.ndarray]]:
    """For each weight's host address: ``(id of the buffer it views, that whole buffer)``.

    Only weights that view the same exporting object (a mapped file, a bytes object, an array)
    may be moved together: adjacent addresses in different objects are not one buffer."""
    owners: dict[int, tuple[int, np.ndarray]] = {}
    for data in program.weights.values():
        if not isinstance(data, memoryview) or data.obj is None:
            continue
        try:
            whole = np.frombuffer(data.obj, np.uint8)
        except (BufferError, TypeError, ValueError):
            continue
        address, low = host_address(host_bytes(data)), host_address(whole)
        if low <= address and address + len(data) <= low + whole.size:  # a view, not a copy
            owners[address] = (id(data.obj), whole)
    return owners


def host_address(host: np.ndarray) -> int:
    """The host memory address of ``host``'s first byte."""
    return host.__array_interface__["data"][0]


def _upload_runs(spans: dict[int, tuple[int, np.ndarray]], order: list[int],
                 owners: dict[int, tuple[int, np.ndarray]]) -> list[tuple[int, np.ndarray]]:
    """The uploads as ``(HBM offset, host bytes)``: maximal runs of DMA-aligned weights that are
    contiguous (same gaps, each under ``_MAX_GAP``) in one host buffer and in HBM, and each
    unaligned weight alone with its staging window."""
    out: list[tuple[int, np.ndarray]] = []
    run: list[int] = []  # [HBM start, HBM end, owner id, host address of start, host end]

    def close_run() -> None:
        if run:
            start, end, _, lo, _ = run
            owner = owners.get(lo)
            if owner is None:  # one weight not in a known buffer: its own bytes
                out.append((start, spans[start][1]))
            else:
                first = lo - host_address(owner[1])
                out.append((start, owner[1][first:first + end - start]))
            run.clear()

    for k, offset in enumerate(order):
        end, host = spans[offset]
        if offset % DMA_ALIGNMENT:
            close_run()
            start = offset - offset % DMA_ALIGNMENT
            out.append((start, _staging(spans, order, k, start)))
            continue
        address = host_address(host)
        owner = owners.get(address)
        if run and owner is not None and owner[0] == run[2] \
                and address - run[4] == offset - run[1] and 0 <= offset - run[1] < _MAX_GAP:
            run[1], run[4] = end, address + host.size
            continue
        close_run()
        run.extend((offset, end, owner[0] if owner else None, address, address + host.size))
    close_run()
    return out


def host_bytes(data: bytes | bytearray | memoryview) -> np.ndarray:
    """``data`` as a flat ``uint8`` array sharing its memory (a copy only if not contiguous)."""
    try:
        return np.frombuffer(data, np.uint8)
    except (BufferError, ValueError):
        return np.frombuffer(bytes(data), np.uint8)


def _staging(spans: dict[int, tuple[int, np.ndarray]], order: list[int], k: int,
             start: int) -> np.ndarray:
    """The bytes of HBM range ``[start, end of span k)``: span ``k`` and whatever of the
    spans before it reaches into the (at most 3-byte) aligned head; zeros elsewhere."""
    offset = order[k]
    end, host = spans[offset]
    window = np.zeros(end - start, np.uint8)
    window[offset - start:] = host
    j = k - 1
    while j >= 0 and spans[order[j]][0] > start:
        prev = order[j]
        prev_end, prev_host = spans[prev]
        lo = max(prev, start)
        window[lo - start:prev_end - start] = prev_host[lo - prev:prev_end - prev]
        j -= 1
    return window
