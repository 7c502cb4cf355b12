"""Device memory (HBM): an address allocator plus lazily backed contents.

Addresses run from 0 to ``hbm_bytes`` (rounded down to ``hbm_alignment``). Every request is
rounded up to ``hbm_alignment``, so every block starts aligned. Free memory is a
:class:`FreeList` of address-ordered blocks, indexed twice (by address for coalescing, by size
for fits); freeing a block merges it with free neighbours.

How a block is chosen is an :class:`Allocator` strategy. The public ``alloc``/``free`` of the
base class do the bookkeeping; a strategy fills two small hooks, ``_take(size)`` and
``_give(start, size)``:

- ``first_fit``: the lowest-addressed block that fits;
- ``best_fit``: the smallest block that fits (lowest address among equals);
- ``mru``: a caching allocator in the style of PPLNN: a freed block is parked in a cache keyed
  by its size and handed back, most recently freed first, to the next request of that size;
  a miss falls through to best fit, and when best fit fails the cache is released (its blocks
  coalesce) and the request retried before giving up.

Contents are real bytes. An allocation gets a numpy ``uint8`` array the first time it is
written or viewed; until then it reads as zeros, so a 16 GiB device costs nothing until used.
Freshly allocated memory always reads as zeros (the simulator does not model stale data).
An allocation whose first contents arrive by DMA from immutable host memory (weights in a
mapped file) refers to that memory instead (:mod:`npu_sim.pieces`) until something else writes
it: :meth:`Hbm.peek` reads it without a copy, :meth:`Hbm.view` gives it real memory first.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import DeviceConfig
from .errors import ConfigError, DmaFault, HbmOutOfMemory, InvalidFree, format_bytes
from .pieces import Pieces

_owner_ids = itertools.count(1)

_VIEW_ALIGNMENT = 16
"""Host bytes HBM refers to must sit at the device address's offset modulo this, the largest
alignment a numpy dtype asks for (complex128), so a kernel's typed view of them is aligned
whenever its device address is (a compiled program aligns every weight to 64). A context
binary, mapped or embedded in the model as a ``bytes`` attribute, passes; the raw data of an
ONNX file's initializers usually does not."""


@dataclass(eq=False)
class DeviceBuffer:
    """One live (or freed) HBM allocation.

    ``nbytes`` is what was requested, ``size`` the aligned size actually reserved, and
    ``device_id`` the token of the :class:`Hbm` (device) that owns it.
    """

    address: int
    nbytes: int
    size: int
    device_id: int
    freed: bool = False

    @property
    def end(self) -> int:
        """One past the last reserved byte."""
        return self.address + self.size


class FreeList:
    """Free blocks, address-ordered, with a by-size index; inserting coalesces neighbours."""

    def __init__(self, capacity: int) -> None:
        self.starts: list[int] = []  # sorted block starts
        self.sizes: dict[int, int] = {}  # start -> size
        self.by_size: list[tuple[int, int]] = []  # sorted (size, start)
        self.total = 0
        if capacity:
            self._add(0, capacity)

    def _add(self, start: int, size: int) -> None:
        insort(self.starts, start)
        self.sizes[start] = size
        insort(self.by_size, (size, start))
        self.total += size

    def _remove(self, start: int) -> int:
        size = self.sizes.pop(start)
        del self.starts[bisect_left(self.starts, start)]
        del self.by_size[bisect_left(self.by_size, (size, start))]
        self.total -= size
        return size

    def carve(self, start: int, size: int) -> None:
        """Take ``size`` bytes from the front of the free block at ``start``."""
        block = self._remove(start)
        if block > size:
            self._add(start + size, block - size)

    def insert(self, start: int, size: int) -> None:
        """Return ``[start, start + size)`` to the free list, merging with its neighbours."""
        i = bisect_left(self.starts, start)
        if i < len(self.starts) and self.starts[i] == start + size:
            size += self._remove(start + size)
        if i > 0:
            prev = self.starts[i - 1]
            if prev + self.sizes[prev] == start:
                start, size = prev, size + self._remove(prev)
        self._add(start, size)

    def smallest_fit(self, size: int) -> int | None:
        """Start of the smallest block of at least ``size`` bytes (lowest address on ties)."""
        i = bisect_left(self.by_size, (size, -1))
        return self.by_size[i][1] if i < len(self.by_size) else None

    def lowest_fit(self, size: int) -> int | None:
        """Start of the lowest-addressed block of at least ``size`` bytes."""
        i = bisect_left(self.by_size, (size, -1))
        fits = self.by_size[i:]
        if not fits:
            return None
        # Fewer candidates than free blocks: scan whichever list is shorter.
        if len(fits) * 4 < len(self.starts):
            return min(s for _, s in fits)
        sizes = self.sizes
        return next(s for s in self.starts if sizes[s] >= size)

    @property
    def largest(self) -> int:
        return self.by_size[-1][0] if self.by_size else 0

    def copy(self) -> FreeList:
        other = FreeList(0)
        other.starts, other.sizes = list(self.starts), dict(self.sizes)
        other.by_size, other.total = list(self.by_size), self.total
        return other


class Allocator:
    """Address allocation over one :class:`FreeList`: a template for strategies.

    :meth:`alloc` and :meth:`free` take aligned sizes (the caller validates them). A strategy
    implements ``_take(size) -> start | None`` and may override ``_give(start, size)``.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.free_list = FreeList(capacity)

    def alloc(self, size: int) -> int | None:
        """Reserve ``size`` bytes; the start address, or None (state unchanged) if none fit."""
        return self._take(size)

    def free(self, start: int, size: int) -> None:
        """Release a block previously returned by :meth:`alloc`."""
        self._give(start, size)

    @property
    def cached_bytes(self) -> int:
        """Bytes held in a strategy's cache: neither in use nor in the free list."""
        return 0

    def release_cache(self) -> None:
        """Return every cached block to the free list (a no-op without a cache)."""

    def _take(self, size: int) -> int | None:
        raise NotImplementedError

    def _give(self, start: int, size: int) -> None:
        self.free_list.insert(start, size)


class FirstFit(Allocator):
    """The lowest-addressed free block that fits."""

    def _take(self, size: int) -> int | None:
        start = self.free_list.lowest_fit(size)
        if start is not None:
            self.free_list.carve(start, size)
        return start


class BestFit(Allocator):
    """The smallest free block that fits, which keeps large blocks whole."""

    def _take(self, size: int) -> int | None:
        start = self.free_list.smallest_fit(size)
        if start is not None:
            self.free_list.carve(start, size)
        return start


class MruCache(BestFit):
    """PPLNN-style caching: reuse the most recently freed block of the same size."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._cache: dict[int, list[int]] = {}
        self._cached = 0

    @property
    def cached_bytes(self) -> int:
        return self._cached

    def _take(self, size: int) -> int | None:
        parked = self._cache.get(size)
        if parked:
            self._cached -= size
            return parked.pop()
        start = super()._take(size)
        if start is None and self._cached:
            # Flush the cache so its blocks coalesce, and retry; undo the flush if that fails.
            saved, cache, cached = self.free_list.copy(), self._cache, self._cached
            self.release_cache()
            start = super()._take(size)
            if start is None:
                self.free_list, self._cache, self._cached = saved, cache, cached
        return start

    def _give(self, start: int, size: int) -> None:
        self._cache.setdefault(size, []).append(start)
        self._cached += size

    def release_cache(self) -> None:
        cache, self._cache, self._cached = self._cache, {}, 0
        for size, starts in cache.items():
            for start in starts:
                self.free_list.insert(start, size)


ALLOCATORS: dict[str, type[Allocator]] = {
    "first_fit": FirstFit,
    "best_fit": BestFit,
    "mru": MruCache,
}
"""Allocator strategies by name."""


class Hbm:
    """The device's HBM: allocation, ownership checks, statistics and contents.

    ``allocator`` names a strategy in :data:`ALLOCATORS`. ``device_id`` is the owner token put
    on every :class:`DeviceBuffer` (a fresh one when omitted), so a buffer of another device is
    recognised and refused.
    """

    def __init__(
        self,
        config: DeviceConfig,
        allocator: str = "best_fit",
        scope: str = "npu.hbm",
        *,
        device_id: int | None = None,
    ) -> None:
        if allocator not in ALLOCATORS:
            raise ConfigError("allocator", allocator, f"one of {sorted(ALLOCATORS)}")
        self.config = config
        self.scope = scope
        self.alignment = config.hbm_alignment
        self.capacity = config.hbm_bytes // self.alignment * self.alignment
        self.device_id = next(_owner_ids) if device_id is None else device_id
        self.strategy = allocator
        self._alloc = ALLOCATORS[allocator](self.capacity)
        self._live: dict[int, DeviceBuffer] = {}  # address -> buffer
        self._live_starts: list[int] = []  # sorted addresses of live buffers
        # address -> bytes, created on first touch; Pieces while they refer to host memory
        self._backing: dict[int, np.ndarray | Pieces] = {}
        self._in_use = 0
        self._peak = 0
        self._alloc_calls = 0
        self._free_calls = 0

    # -- allocation ---------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> DeviceBuffer:
        """Allocate ``nbytes`` (rounded up to the alignment); raises :class:`HbmOutOfMemory`."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise InvalidFree(self.scope, f"malloc(nbytes={nbytes!r}): expected a positive int")
        nbytes = int(nbytes)
        size = -(-nbytes // self.alignment) * self.alignment
        start = self._alloc.alloc(size) if size <= self.capacity else None
        if start is None:
            fl = self._alloc.free_list
            raise HbmOutOfMemory(self.scope, size, fl.total, fl.largest)
        self._alloc_calls += 1
        buf = DeviceBuffer(start, nbytes, size, self.device_id)
        self._live[start] = buf
        insort(self._live_starts, start)
        self._in_use += size
        self._peak = max(self._peak, self._in_use)
        return buf

    def free(self, buf: DeviceBuffer) -> None:
        """Release ``buf``; a double free or a foreign buffer raises :class:`InvalidFree`."""
        if not isinstance(buf, DeviceBuffer):
            raise InvalidFree(self.scope, f"free({buf!r}): expected a DeviceBuffer")
        if buf.device_id != self.device_id or (not buf.freed and self._live.get(buf.address)
                                               is not buf):
            raise InvalidFree(self.scope, f"free({buf!r}): not a live allocation of this device "
                                          f"(device_id {self.device_id})")
        if buf.freed:
            raise InvalidFree(self.scope, f"free({buf!r}): double free")
        del self._live[buf.address]
        del self._live_starts[bisect_left(self._live_starts, buf.address)]
        self._backing.pop(buf.address, None)
        self._alloc.free(buf.address, buf.size)
        buf.freed = True
        self._in_use -= buf.size
        self._free_calls += 1

    def release_cache(self) -> None:
        """Return blocks held by a caching strategy to the free list (coalescing them)."""
        self._alloc.release_cache()

    @property
    def buffers(self) -> list[DeviceBuffer]:
        """Live buffers in address order."""
        return [self._live[a] for a in self._live_starts]

    # -- statistics ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters with stable names (see ``docs/device_config.md``)."""
        fl = self._alloc.free_list
        return {
            "hbm.capacity": self.capacity,
            "hbm.bytes_in_use": self._in_use,
            "hbm.peak_bytes_in_use": self._peak,
            "hbm.free_bytes": fl.total,
            "hbm.largest_free_block": fl.largest,
            "hbm.free_blocks": len(fl.starts),
            "hbm.fragmentation": 1.0 - fl.largest / fl.total if fl.total else 0.0,
            "hbm.allocations": len(self._live),
            "hbm.alloc_calls": self._alloc_calls,
            "hbm.free_calls": self._free_calls,
            "hbm.cached_bytes": self._alloc.cached_bytes,
            "hbm.mapped_bytes": sum(p.shared for p in self._backing.values()
                                    if isinstance(p, Pieces)),
        }

    def reset_stats(self) -> None:
        """Zero the call counters; the peak restarts from the bytes in use now."""
        self._alloc_calls = self._free_calls = 0
        self._peak = self._in_use

    # -- contents -----------------------------------------------------------------------------

    def locate(self, address: int, nbytes: int) -> DeviceBuffer:
        """The live allocation holding all of ``[address, address + nbytes)``, else DmaFault."""
        i = bisect_right(self._live_starts, address) - 1
        buf = self._live[self._live_starts[i]] if i >= 0 else None
        if buf is not None and nbytes >= 0 and address + nbytes <= buf.end:
            return buf
        raise DmaFault(self.scope, f"range [{address:#x}, +{nbytes}) is not inside one live "
                                   f"allocation; nearest: {self._nearest(address)}")

    def _nearest(self, address: int) -> str:
        if not self._live_starts:
            return "none (nothing allocated)"
        i = bisect_right(self._live_starts, address)
        cands = [self._live[self._live_starts[j]] for j in (i - 1, i)
                 if 0 <= j < len(self._live_starts)]
        buf = min(cands, key=lambda b: 0 if b.address <= address < b.end
                  else min(abs(address - b.address), abs(address - b.end)))
        return f"[{buf.address:#x}, {buf.end:#x}) ({format_bytes(buf.size)})"

    def view(self, address: int, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` view of ``nbytes`` at ``address`` inside one live allocation
        (an allocation referring to host memory gets real memory first: copy-on-write)."""
        buf = self.locate(address, nbytes)
        offset = address - buf.address
        return self._dense(buf)[offset:offset + nbytes]

    def peek(self, address: int, nbytes: int) -> np.ndarray:
        """A ``uint8`` view of ``nbytes`` at ``address`` for reading only (never write through
        it). Where the allocation refers to host memory: the mapped host bytes themselves if one
        piece holds the range, else a private copy of the range alone, which becomes its piece
        (the rest of the allocation stays mapped); elsewhere the same view as :meth:`view`."""
        buf = self.locate(address, nbytes)
        backing = self._backing.get(buf.address)
        offset = address - buf.address
        if isinstance(backing, Pieces):
            found = backing.inside(offset, nbytes)
            if found is None:
                backing.copy(offset, backing.read(offset, nbytes))
                found = backing.inside(offset, nbytes)
            return found
        return self._dense(buf)[offset:offset + nbytes]

    def read(self, address: int, nbytes: int) -> np.ndarray:
        """A copy of ``nbytes`` at ``address`` (zeros where never written)."""
        buf = self.locate(address, nbytes)
        backing = self._backing.get(buf.address)
        offset = address - buf.address
        if backing is None:
            return np.zeros(nbytes, np.uint8)
        if isinstance(backing, Pieces):
            return backing.read(offset, nbytes)
        return backing[offset:offset + nbytes].copy()

    def write(self, address: int, data: Any) -> None:
        """Copy ``data`` (bytes-like or array, taken as raw bytes) to ``address``."""
        if isinstance(data, np.ndarray):
            raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        else:
            raw = np.frombuffer(bytes(data), np.uint8)
        self.view(address, raw.size)[:] = raw

    def store(self, address: int, data: np.ndarray) -> None:
        """Copy the ``uint8`` bytes ``data`` to ``address``, as a DMA does: into an allocation
        that refers to host memory they go as a private piece beside the shared ones (a
        staging window next to mapped weights does not copy the whole block)."""
        buf = self.locate(address, data.size)
        backing = self._backing.get(buf.address)
        offset = address - buf.address
        if isinstance(backing, Pieces):
            backing.copy(offset, data)
        else:
            self._dense(buf)[offset:offset + data.size] = data

    def share(self, address: int, root: np.ndarray, at: int, nbytes: int) -> None:
        """Bytes ``[address, address + nbytes)`` are now ``root[at:at + nbytes]``, a flat
        ``uint8`` host buffer whose bytes never change (:func:`npu_sim.pieces.immutable`):
        referred to, not copied, when the allocation holds no real memory yet and the host
        bytes are aligned as ``address`` is (modulo :data:`_VIEW_ALIGNMENT`); copied into it
        otherwise. A weight referred to at another alignment (inside an ONNX file's protobuf,
        where a tensor's bytes start anywhere) would be an unaligned array, which numpy copies
        on every use: GPT-2's runs took 1.8x as long."""
        if (root.ctypes.data + at - address) % _VIEW_ALIGNMENT:
            self.store(address, root[at:at + nbytes])  # misaligned: kernels would copy it
            return
        buf = self.locate(address, nbytes)
        backing = self._backing.get(buf.address)
        offset = address - buf.address
        if backing is None:
            backing = self._backing[buf.address] = Pieces()
        if isinstance(backing, Pieces):
            backing.share(offset, root, at, nbytes)
        else:
            backing[offset:offset + nbytes] = root[at:at + nbytes]

    def _dense(self, buf: DeviceBuffer) -> np.ndarray:
        backing = self._backing.get(buf.address)
        if isinstance(backing, np.ndarray):
            return backing
        dense = np.zeros(buf.size, np.uint8) if backing is None else backing.materialize(buf.size)
        self._backing[buf.address] = dense
        return dense
