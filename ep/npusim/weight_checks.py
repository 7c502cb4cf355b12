"""Checking a context binary's weights: their blocks' CRC-32s, on a thread while the load goes on.

The WEIGHT_CHECKSUMS section stores one CRC-32 per block of the weights section
(:func:`checksum_table`). :class:`BlockChecks` checks runs of blocks (:func:`_runs`) on the
checksum thread (:func:`_pool`) while the loading thread decodes the records and places the
weights; whoever waits computes the runs the thread has not started. A bad run is then located
block by block, and reported as :class:`ep.errors.InvalidGraph` naming the first bad block, on
the first wait and on every later one.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import struct
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ep.errors import InvalidGraph
from firmware_model.upload import drop_resident, host_address

from . import binary_layout as L

_WORKERS = 1
"""One checksum thread: on the two cores these loads are measured on, a second one took the
core the loading thread needed (BERT's load spent 3-7 ms waiting to be scheduled)."""


_SEGMENT = 448 << 20
"""The most bytes of weight blocks one CRC-32 call checks (but for one block larger than this,
up to ``L.MAX_BLOCK``, checked alone). A run of blocks is checked by one call and compared with
the blocks' stored CRC-32s combined (``L.crc32_combine``, ISA-L's); a mismatch is then located
block by block, and reported as before.

What a run's check guarantees: CRC-32 has Hamming distance 3 below 2^32 bits (512 MiB), so it
detects every error of up to 2 bits in the run and every burst of up to 32 bits, and misses any
other error pattern with probability 2^-32. That is weaker than a check per block for patterns
of 3 or more bit errors spread over several blocks: the blocks' checks catch such a pattern
whenever one block holds at most 2 of its bits (or only a burst of up to 32), the run's may not
(4 flipped bits in 4 different 4 KiB blocks of a 128 KiB run can cancel out). Runs are kept for
speed: a call per block made BERT's load wait on the GIL between calls (``_HEAD``)."""

_HEAD = 1 / 2
"""The share of the weights the thread checks in its first call. A call releases the GIL once;
between calls the thread needs it back, and waits up to the 5 ms switch interval while the
loading thread runs Python (a call per 4 MiB block kept BERT's thread waiting more than
working). So the thread checks a large first run in one call while the load goes on, and the
rest in ``_TAIL`` runs that the loading thread, once it waits, shares with it (from the back;
neither holds the GIL long then). Half, not more: the loading thread reaches its wait a few
milliseconds in and then checks as fast as the thread, so with BERT's or GPT-2's 400-odd MiB
the thread's first run was the load's critical path (three quarters: BERT's loads 36-43 ms and
GPT-2's 43-44 ms, medians of 12 alternating in one process; half: 28-32 and 29-33)."""

_TAIL = 8
"""The runs the weights after the first call are split into (see ``_HEAD``)."""

_WHOLE = 64 << 20
"""Weights up to this size are checked in one call: about 3 ms, less than the rest of a load
takes, so a tail would only wait for the loading thread (EfficientNet's 21 MiB)."""


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """The checksum thread (``_WORKERS``, one), verifying weight blocks beside the loading
    thread (``L.crc32`` releases the GIL); started once, not per load: starting threads per
    load cost ~2.5 ms of a ~20 ms EPContext load, more on a busy machine."""
    return ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="npu_sim-crc")


def _post(work: Callable[..., int], *args: object) -> Future[int]:
    """``work(*args)`` queued on the checksum thread. Once the interpreter is exiting (in an
    ``atexit`` handler) the pool takes no more work: then a future that never runs, which the
    waiter cancels and computes itself (:meth:`BlockChecks._outcome`), as in a forked child."""
    try:
        return _pool().submit(work, *args)
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        return Future()


def start_thread() -> None:
    """Start the checksum thread now, if it is not running (a process that has just written a
    context binary is about to load one: its first load need not start the thread)."""
    _post(int)


if hasattr(os, "register_at_fork"):
    # A forked child has none of the parent's threads: the parent's pool would queue its checks
    # for a thread that never comes (each load then checked inline by the waiter, and the queued
    # items kept views of every binary opened there). The child starts a thread of its own.
    os.register_at_fork(after_in_child=_pool.cache_clear)


@dataclass(frozen=True)
class _Block:
    """One checksummed block of the weights section: file range ``[start, end)``."""

    section: int  # index in the section table
    index: int
    start: int
    end: int
    offset: int  # of the block in the section
    crc32: int

    def error(self, computed: int) -> InvalidGraph:
        return InvalidGraph(
            f"checksum mismatch in section #{self.section} (weights), block {self.index} "
            f"(bytes [{self.offset}, {self.offset + self.end - self.start}) of the section): "
            f"stored crc32 0x{self.crc32:08x}, computed 0x{computed:08x}"
        )


class ChecksumTable(NamedTuple):
    """The WEIGHT_CHECKSUMS section, checked against the weights section it describes
    (:func:`checksum_table`): the block size and each block's stored CRC-32."""

    section: int  # the weights section's index in the section table
    weights: L.SectionEntry
    block: int
    crcs: tuple[int, ...]

    def blocks(self) -> list[_Block]:
        """The weights section's blocks, in order (made only for a load that checks them:
        BERT's 105 took 0.26 ms of a 3.6 ms load that trusted its file)."""
        section, weights, block = self.section, self.weights, self.block
        return [_Block(section, i, weights.offset + i * block,
                       weights.offset + min((i + 1) * block, weights.length), i * block, crc)
                for i, crc in enumerate(self.crcs)]


def checksum_table(view: memoryview, section: int, weights: L.SectionEntry,
                   checksums: L.SectionEntry) -> ChecksumTable:
    """The weights section's block table, from the (already verified) WEIGHT_CHECKSUMS
    section, which must describe exactly this weights section (at ``section`` in the table)."""
    body = view[checksums.offset : checksums.offset + checksums.length]
    where = "section weight_checksums"
    if len(body) < L.CHECKSUMS_HEAD.size:
        raise InvalidGraph(f"{where}: {len(body)} bytes, shorter than its "
                           f"{L.CHECKSUMS_HEAD.size}-byte head")
    block, count = L.CHECKSUMS_HEAD.unpack_from(body, 0)
    if not L.MIN_BLOCK <= block <= L.MAX_BLOCK or block & (block - 1):
        raise InvalidGraph(f"{where}: block size {block} is not a power of two in "
                           f"[{L.MIN_BLOCK}, {L.MAX_BLOCK}]")
    expected = -(-weights.length // block)
    if count != expected:
        raise InvalidGraph(f"{where}: {count} blocks, expected {expected} for {weights.length} "
                           f"bytes of weights in blocks of {block}")
    if len(body) != L.CHECKSUMS_HEAD.size + 4 * count:
        raise InvalidGraph(f"{where}: {len(body)} bytes, expected "
                           f"{L.CHECKSUMS_HEAD.size + 4 * count} for {count} checksums")
    return ChecksumTable(section, weights, block,
                         struct.unpack_from(f"<{count}I", body, L.CHECKSUMS_HEAD.size))


def _runs(blocks: list[_Block]) -> list[list[_Block]]:
    """Consecutive blocks grouped into runs, one block at least each: a first run of about
    ``_HEAD`` of the bytes (all up to ``_WHOLE``), then runs of a ``_TAIL``-th of the rest; none
    over ``_SEGMENT`` but a single block larger than it (a file's blocks may be up to
    ``L.MAX_BLOCK``, 1 GiB), which is a run alone, checked against its own stored CRC-32."""
    if not blocks:
        return []
    total = blocks[-1].end - blocks[0].start
    limit = min(max(int(total * _HEAD), _WHOLE), _SEGMENT)
    tail = min(max(-(-(total - limit) // _TAIL), 1), _SEGMENT)
    runs: list[list[_Block]] = []
    for block in blocks:
        if runs and block.end - runs[-1][0].start <= limit:
            runs[-1].append(block)
        else:
            limit = limit if not runs else tail
            runs.append([block])
    return runs


def _combined(run: list[_Block]) -> int:
    """The CRC-32 of a run of blocks, from their stored CRC-32s."""
    crc = run[0].crc32
    for block in run[1:]:
        crc = L.crc32_combine(crc, block.crc32, block.end - block.start)
    return crc


class BlockChecks:
    """The weights section's CRC-32s, one call per run of blocks (see ``_HEAD``), on the
    checksum thread; whoever waits computes the runs the thread has not started yet itself
    instead of idling. Every size goes to the thread: checked inline before decoding, MobileNet-
    V3's 10 MiB made its load 5.0 -> 5.4 ms and EfficientNet's 21 MiB 7.0 -> 8.3 ms (medians)."""

    def __init__(self, view: memoryview, blocks: list[_Block], mapping: mmap.mmap | None) -> None:
        """``mapping``: the file mapping ``view`` covers from its first byte, if any."""
        self._pid = os.getpid()
        self._runs = _runs(blocks)
        self._mapping = mapping
        self._views = [view[run[0].start : run[-1].end] for run in self._runs]
        self._futures: list[Future[int]] | None = [
            _post(_crc32_then_drop, v, mapping, run[0].start)
            for v, run in zip(self._views, self._runs, strict=True)]
        self._error: InvalidGraph | None = None
        if self._futures:
            time.sleep(0)  # hand the GIL over: the thread starts now, not 5 ms into decoding

    def wait(self) -> None:
        """Every run checked; raise the first bad block's error (the views into the binary are
        released first), or, when no block of a bad run is bad read again, that run's. Later
        calls raise that error again, or return at once."""
        if self._futures is not None:
            futures, self._futures = self._futures, None
            views, self._views = self._views, []
            self._error = self._outcome(futures, views)
            self._mapping = None  # the binary's close() unmaps once its views are gone
        if self._error is not None:
            raise InvalidGraph(self._error.message)

    def _outcome(self, futures: list[Future[int]], views: list[memoryview]) -> InvalidGraph | None:
        crcs: list[int | None] = [None] * len(futures)
        forked = os.getpid() != self._pid  # the thread running a run is the parent's: gone
        for k in reversed(range(len(futures))):  # from the back, while the thread goes on
            if forked or futures[k].cancel():
                crcs[k] = _crc32_then_drop(views[k], self._mapping, self._runs[k][0].start)
        expected = [_combined(run) for run in self._runs]  # while the thread finishes its run
        crcs = [f.result() if crc is None else crc for f, crc in zip(futures, crcs, strict=True)]
        bad = next((k for k in range(len(crcs)) if crcs[k] != expected[k]), None)
        if bad is None:
            views.clear()
            return None
        # the error path: the first bad block of the first bad run, read again
        run, whole = self._runs[bad], views[bad]
        base = run[0].start
        block_crcs = [L.crc32(whole[b.start - base : b.end - base]) for b in run]
        views.clear()
        del whole
        first = next((k for k, b in enumerate(run) if block_crcs[k] != b.crc32), None)
        return run[first].error(block_crcs[first]) if first is not None else \
            _changed_error(run, crcs[bad], expected[bad])


def _changed_error(run: list[_Block], computed: int, expected: int) -> InvalidGraph:
    """A run whose CRC-32 was wrong while each of its blocks, read again, is right: its bytes
    changed between the reads (a file rewritten under its mapping)."""
    first, last = run[0], run[-1]
    return InvalidGraph(
        f"checksum mismatch in section #{first.section} (weights), bytes [{first.offset}, "
        f"{last.offset + last.end - last.start}) of the section (blocks {first.index} to "
        f"{last.index}): computed crc32 0x{computed:08x}, the blocks' stored crc32s combine to "
        f"0x{expected:08x}, but every block matched when read again: the bytes changed while "
        "they were checked (was the file modified during the load?)"
    )


def _crc32_then_drop(block: memoryview, mapping: mmap.mmap | None, start: int) -> int:
    """The CRC-32 of a run of weight blocks; a mapped run's pages then leave the resident set (they
    stay in the page cache): opening a binary does not hold its weights in memory twice.

    ``block`` is ``mapping[start:...]`` when the binary was opened from a file: its pages are
    dropped by address (:func:`_dontneed`); without ``mapping`` (bytes given to ``from_bytes``),
    ``drop_resident`` finds out whether they are a mapping's (about 20-90 us of numpy, which the
    thread ran holding the GIL the loading thread needs)."""
    crc = L.crc32(block)
    if mapping is None:
        drop_resident(block)
        return crc
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, (start + len(block)) // page * page
    if hi > lo:
        _dontneed(mapping, block, start, lo, hi)
    return crc


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (AttributeError, OSError):
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _libc_madvise() if hasattr(mmap, "MADV_DONTNEED") else None
"""libc's ``madvise``, called through ctypes, which releases the GIL: ``mmap.madvise`` holds it,
and dropping a run's pages takes about as long as faulting them in (0.1 ms for MobileNet-V3's
10 MiB), which the loading thread spent waiting for the GIL."""


def _dontneed(mapping: mmap.mmap, block: memoryview, start: int, lo: int, hi: int) -> None:
    """``MADV_DONTNEED`` over bytes ``[lo, hi)`` of ``mapping`` (page-aligned, within
    ``block``, which is ``mapping[start:...]`` and keeps the mapping open meanwhile)."""
    if _MADVISE is None:
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None or not hasattr(mapping, "madvise"):
            return  # the platform cannot drop pages: they stay resident until evicted
        with contextlib.suppress(OSError, ValueError):  # closed: nothing left to drop
            mapping.madvise(advice, lo, hi - lo)
        return
    base = host_address(np.frombuffer(block, np.uint8)) - start
    _MADVISE(base + lo, hi - lo, mmap.MADV_DONTNEED)  # a failure leaves the pages resident
