"""Weights resident in HBM, one copy per distinct content for every program on the device.

Sessions that share EP contexts, several programs of one context binary (a prefill and a decode
graph of one model) and several instances of one compiled model all read the same weights. A
real driver keeps one device copy of each and counts its users; so does :class:`WeightStore`,
one per :class:`~firmware_model.processor.Firmware` (that is, per device):

* :meth:`WeightStore.place` gives every WEIGHTS tensor of a program an HBM address. A weight
  whose bytes are already resident (the same host memory, or equal content) is not allocated or
  uploaded again; the others go into one new block, uploaded through the DMA engine as the
  loader always did (in runs contiguous on host and device, chunked at ``dma_chunk_bytes``). The
  first program of a content set therefore loads exactly as before: one block laid out as its
  WEIGHTS region, one coalesced upload.
* :meth:`WeightStore.release` drops a program's references; a block is freed with its last user,
  whatever order programs are unloaded in.
* Content identity is checked without hashing when it can be: two weights viewing the same host
  memory are equal. Otherwise SHA-256 digests are computed, lazily, only for weights whose size
  matches a resident one, so a program that shares nothing hashes nothing.

* Streaming (``place(..., stream=True)``): the uploads are started and left in flight, one DMA
  per weight in the order the program first reads them, each queued behind the previous one;
  :attr:`Placement.ready` holds their arrival events, which the firmware adds to the
  dependencies of the kernels that read them. Releasing runs the clock until a program's
  uploads in flight have landed.
* Caller-provided memory (``place(..., pinned={tensor: (buffer, offset)})``): those weights
  are uploaded into the caller's buffer, which is never freed here.

Counters (in ``Firmware.stats()``): ``hbm.weights.bytes``, the resident weight bytes (each
distinct content once); ``hbm.weights.user_bytes``, those in caller-provided memory;
``hbm.weights.references``, the weight tensors of loaded programs pointing at them;
``hbm.weights.shared_bytes``, the bytes programs did not upload because they were resident.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import simpy

from npu_sim.errors import InvalidCommand
from npu_sim.hbm import DeviceBuffer

from .program import Program, Region
from .upload import host_address, host_bytes, stream_weights, upload_weights

if TYPE_CHECKING:
    from .processor import Firmware

_ALIGN = 64
"""Alignment of a weight placed in a compacted block (kernels read any dtype from it)."""

Key = tuple[int, int]
"""A program's weight: (offset in its WEIGHTS region, bytes)."""


@dataclass(eq=False)
class _Block:
    buffer: DeviceBuffer
    users: int = 0
    owned: bool = True
    """False for memory the caller provided (``pinned``): used, never freed here."""


@dataclass(eq=False, slots=True)
class _Resident:
    """One distinct weight content in HBM."""

    address: int
    nbytes: int
    host: np.ndarray
    block: _Block
    users: int = 0
    digest: bytes | None = None
    ready: simpy.Event | None = None
    """The arrival of its upload when it was streamed (None: uploaded before placing ended)."""
    host_address: int | None = None
    """The address of ``host``, once known (worked out when the store first looks it up)."""
    gone: bool = False
    """Forgotten by the store (indexed or not)."""

    def sha256(self) -> bytes:
        if self.digest is None:
            self.digest = hashlib.sha256(self.host).digest()
        return self.digest


@dataclass
class Placement:
    """Where a loaded program's weights live: tensor index -> HBM address."""

    addresses: dict[int, int] = field(default_factory=dict)
    residents: list[_Resident] = field(default_factory=list)
    private: DeviceBuffer | None = None
    """A program that cannot share (DMAs read its WEIGHTS region as a whole) keeps its region."""
    region: DeviceBuffer | None = None
    """The buffer holding the program's whole WEIGHTS region as compiled, when it has one (it
    shares nothing, or loaded first): what a region-relative address resolves against."""
    ready: dict[int, simpy.Event] = field(default_factory=dict)
    """Weight tensor -> the arrival of its streamed upload, while it may still be in flight."""


def _staged(program: Program, by_offset: dict[Key, list[int]], missing: list[Key],
            layout: dict[Key, int]) -> Program:
    """``program`` with only the ``missing`` weights (one tensor each), at their ``layout``
    offsets: what :func:`~.upload.upload_weights` moves into a new block."""
    moved = {i: dataclasses.replace(program.tensors[i], offset=layout[k])
             for k in missing for i in by_offset[k] if layout[k] != k[0]}
    return dataclasses.replace(
        program, tensors=tuple(moved.get(i, t) for i, t in enumerate(program.tensors)),
        weights={by_offset[k][0]: program.weights[by_offset[k][0]] for k in missing})


class WeightStore:
    """The device's resident weights (see the module docstring)."""

    def __init__(self, firmware: Firmware) -> None:
        # Weakly: the firmware owns the store; a cycle would keep a dead session's device (and
        # its HBM backing) alive until the cyclic garbage collector ran.
        self._firmware = weakref.ref(firmware)
        self._by_host: dict[tuple[int, int], _Resident] = {}
        self._by_size: dict[int, list[_Resident]] = {}
        # Residents placed since the indexes above were last read, in order (see _index).
        self._unindexed: list[_Resident] = []
        self.shared_bytes = 0
        self._changes = 0  # placements, releases and undone placements so far
        self._stats: tuple[int, dict[str, int]] | None = None  # stats() as of _changes
        self._tail: simpy.Event | None = None  # the last streamed upload: the next queues behind

    @property
    def firmware(self) -> Firmware:
        firmware = self._firmware()
        if firmware is None:
            raise RuntimeError("the firmware of this weight store is gone")
        return firmware

    # -- placing ------------------------------------------------------------------------------

    def place(self, program: Program, *, shareable: bool, stream: bool = False,
              pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None) -> Placement:
        """HBM addresses for every WEIGHTS tensor of ``program``, uploading what is missing.

        ``shareable`` is False for a program whose commands read its WEIGHTS region by address
        (a DMA out of it): such a program gets its whole region, laid out as compiled.
        ``stream``: start the uploads and return without waiting for them (one DMA per weight,
        in the order of first use; :attr:`Placement.ready` holds their arrival events, which
        the firmware makes each kernel wait for). ``pinned`` maps weight tensors to memory the
        caller allocated, ``(buffer, offset)``: they are uploaded there, and the buffer is
        never allocated or freed here (user-provided device memory).
        """
        self._changes += 1
        device = self.firmware.device
        in_weights = Region.WEIGHTS  # an enum member looked up once, not once a tensor
        weights = [i for i, t in enumerate(program.tensors) if t.region == in_weights]
        if not weights:
            return Placement()
        if pinned and not shareable:
            raise InvalidCommand("npu.fw.weights", f"program {program.name!r} addresses its "
                                 "WEIGHTS region as a whole (a DMA out of it), so its weights "
                                 "cannot live in caller-provided memory")
        if not shareable or any(i not in program.weights for i in weights):
            buffer = device.malloc(program.weights_bytes)  # timing-only or region-addressed
            try:
                upload_weights(self.firmware, program, buffer.address)
            except BaseException:
                device.free(buffer)
                raise
            return Placement({i: buffer.address + program.tensors[i].offset for i in weights},
                             private=buffer, region=buffer)
        # Weights at one offset with one size hold the same bytes (the loader checked it).
        # Empty weights need no memory: kernels never read them.
        by_offset: dict[Key, list[int]] = {}
        empty: list[int] = []
        hosts: dict[Key, np.ndarray] = {}  # the host bytes of each range, once
        tensors, data = program.tensors, program.weights
        for i in weights:
            host = host_bytes(data[i])
            if not host.size:
                empty.append(i)
                continue
            key = (tensors[i].offset, host.size)
            indices = by_offset.get(key)
            if indices is None:
                by_offset[key] = [i]
                hosts[key] = host
            else:
                indices.append(i)
        found: dict[Key, _Resident] = {}
        missing: list[Key] = []
        user: dict[Key, tuple[DeviceBuffer, int]] = {}
        self._index()
        if not pinned and not self._by_size:  # an empty store (the first program): all missing
            missing = list(by_offset)
        else:
            for key, indices in by_offset.items():
                host = hosts[key]
                where = next((pinned[i] for i in indices if i in pinned), None) if pinned else None
                if where is not None:
                    hit = self._at_host(host)
                    if hit is not None and hit.address == where[0].address + where[1]:
                        found[key] = hit
                    else:
                        user[key] = where
                    continue
                hit = self._find(host)
                if hit is None:
                    missing.append(key)
                else:
                    found[key] = hit
        placement = Placement(dict.fromkeys(empty, 0))
        before = set(found)
        try:
            if missing:
                self._upload(program, by_offset, missing, found, placement, stream, hosts)
            for key, (buffer, offset) in user.items():
                found[key] = self._upload_pinned(hosts[key], buffer, offset, stream)
        except BaseException:
            self._undo([r for k, r in found.items() if k not in before])
            raise
        addresses, ready, residents = placement.addresses, placement.ready, placement.residents
        for key, indices in by_offset.items():
            resident = found[key]
            resident.users += 1
            resident.block.users += 1
            residents.append(resident)
            arrival = resident.ready
            in_flight = arrival is not None and not arrival.processed
            for i in indices:
                addresses[i] = resident.address
                if in_flight:
                    ready[i] = arrival
            if key in before:
                self.shared_bytes += resident.nbytes
        return placement

    def _at_host(self, host: np.ndarray) -> _Resident | None:
        """The resident known by ``host``'s memory (address and size), if any."""
        self._index()
        if not self._by_host:  # nothing to find: the address need not be worked out
            return None
        return self._by_host.get((host_address(host), host.size))

    def _find(self, host: np.ndarray) -> _Resident | None:
        hit = self._at_host(host)
        if hit is not None:
            return hit
        candidates = self._by_size.get(host.size, ())
        if not candidates:
            return None
        digest = hashlib.sha256(host).digest()
        return next((c for c in candidates if c.sha256() == digest), None)

    def _upload(self, program: Program, by_offset: dict[Key, list[int]], missing: list[Key],
                found: dict[Key, _Resident], placement: Placement, stream: bool,
                hosts: dict[Key, np.ndarray]) -> None:
        """One block for the missing weights: the program's own layout when nothing of it is
        resident (one coalesced upload, as before), else the missing ones packed."""
        device = self.firmware.device
        whole = len(missing) == len(by_offset)
        if whole:
            layout = {key: key[0] for key in missing}
            size = program.weights_bytes
        else:
            layout, size = {}, 0
            for key in sorted(missing):
                size = -(-size // _ALIGN) * _ALIGN
                layout[key] = size
                size += key[1]
        block = _Block(device.malloc(size))
        try:
            if stream:
                events, self._tail = stream_weights(
                    self.firmware, program,
                    [(layout[k], hosts[k], by_offset[k][0]) for k in missing],
                    block.buffer, self._tail)
            else:
                events = {}
                upload_weights(self.firmware, _staged(program, by_offset, missing, layout),
                               block.buffer.address)
        except BaseException:
            device.free(block.buffer)
            raise
        if whole:
            placement.region = block.buffer
        for key in missing:
            host = hosts[key]
            resident = _Resident(block.buffer.address + layout[key], host.size, host, block,
                                 ready=events.get(by_offset[key][0]))
            found[key] = resident
            self._unindexed.append(resident)

    def _upload_pinned(self, host: np.ndarray, buffer: DeviceBuffer, offset: int,
                       stream: bool) -> _Resident:
        """One weight into caller-provided memory, streamed or waited for."""
        ready = self.firmware.device.memcpy_h2d_async(
            buffer, host, offset, deps=[] if self._tail is None or not stream else [self._tail],
            share=True)
        if stream:
            self._tail = ready
        else:
            self.settle([ready])
        resident = _Resident(buffer.address + offset, host.size, host,
                             _Block(buffer, owned=False), ready=ready if stream else None)
        self._unindexed.append(resident)
        return resident

    def _index(self) -> None:
        """Know every resident placed since the last call by its host bytes' address and size,
        and by its size, in the order they were placed. Done before the indexes are read or
        changed, so they are at every moment what indexing each resident when it was placed
        gave. So host addresses are worked out when first needed (a later placement's lookup,
        a release, stats), once each, not while a program loads: placing into an empty store
        looks nothing up."""
        if not self._unindexed:
            return
        # Re-entrant: a program's finalizer may release weights (and call this) whenever the
        # collector runs, which an allocation here can make it do. So the pending list is taken
        # first, and a resident is entered after the last allocation before it, if still there.
        pending, self._unindexed = self._unindexed, []
        for resident in pending:
            if resident.host_address is None:
                resident.host_address = host_address(resident.host)
            key = (resident.host_address, resident.nbytes)
            same = self._by_size.get(resident.nbytes)
            if same is None:
                same = self._by_size[resident.nbytes] = []
            if resident.gone:  # forgotten meanwhile
                if not same and self._by_size.get(resident.nbytes) is same:
                    del self._by_size[resident.nbytes]
                continue
            self._by_host[key] = resident  # from here on nothing the collector counts is made
            same.append(resident)

    def _undo(self, created: list[_Resident]) -> None:
        """Forget residents a failed placement created (nobody uses them yet)."""
        self._changes += 1
        self.settle([r.ready for r in created if r.ready is not None])
        for resident in created:
            self._forget(resident)
            block = resident.block
            if block.owned and block.users == 0 and not block.buffer.freed:
                self.firmware.device.free(block.buffer)

    def settle(self, events: list[simpy.Event]) -> None:
        """Run the clock until every upload in ``events`` has landed (a streamed upload still
        in flight must not write into memory that is freed or handed back to its owner)."""
        env = self.firmware.device.env
        while any(not e.processed for e in events):
            env.step()

    # -- releasing ----------------------------------------------------------------------------

    def release(self, placement: Placement) -> None:
        """Drop a program's references; free every block nobody uses any more (never one the
        caller provided). Uploads still in flight land first."""
        self._changes += 1
        if placement.private is not None and not placement.private.freed:
            self.firmware.device.free(placement.private)
        self.settle([r.ready for r in placement.residents if r.ready is not None])
        for resident in placement.residents:
            resident.users -= 1
            resident.block.users -= 1
            if resident.users == 0:
                self._forget(resident)
            block = resident.block
            if block.users == 0 and block.owned and not block.buffer.freed:
                self.firmware.device.free(block.buffer)
        placement.residents.clear()
        placement.addresses.clear()
        placement.ready.clear()

    def _forget(self, resident: _Resident) -> None:
        resident.gone = True  # an _index running (a finalizer's unload within it) skips it
        if resident in self._unindexed:  # never indexed: nothing more to undo
            self._unindexed.remove(resident)
            return
        key = (resident.host_address, resident.nbytes)
        if self._by_host.get(key) is resident:
            del self._by_host[key]
        same = self._by_size.get(resident.nbytes, [])
        if resident in same:
            same.remove(resident)
        if not same:
            self._by_size.pop(resident.nbytes, None)

    # -- counters -----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """``hbm.weights.bytes`` (resident, each content once), ``hbm.weights.references`` and
        ``hbm.weights.shared_bytes`` (not uploaded again because resident)."""
        # A run asks twice, before and after: counted once per change. A release may run while
        # counting (a finalizer the collector calls): the counts are then kept as of before it.
        if self._stats is None or self._stats[0] != self._changes:
            changes = self._changes
            self._index()
            # copies: a release may run here too, and must not change what is being iterated
            residents = {id(r): r for r in list(self._by_host.values())}
            for same in list(self._by_size.values()):
                residents.update((id(r), r) for r in list(same))
            self._stats = (changes, {
                "hbm.weights.bytes": sum(r.nbytes for r in residents.values()),
                "hbm.weights.user_bytes": sum(r.nbytes for r in residents.values()
                                              if not r.block.owned),
                "hbm.weights.references": sum(r.users for r in residents.values()),
                "hbm.weights.shared_bytes": self.shared_bytes})
        return dict(self._stats[1])
