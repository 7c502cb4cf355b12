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


@dataclass(eq=False)
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


class WeightStore:
    """The device's resident weights (see the module docstring)."""

    def __init__(self, firmware: Firmware) -> None:
        # Weakly: the firmware owns the store; a cycle would keep a dead session's device (and
        # its HBM backing) alive until the cyclic garbage collector ran.
        self._firmware = weakref.ref(firmware)
        self._by_host: dict[tuple[int, int], _Resident] = {}
        self._by_size: dict[int, list[_Resident]] = {}
        self.shared_bytes = 0
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
        device = self.firmware.device
        weights = [i for i, t in enumerate(program.tensors) if t.region == Region.WEIGHTS]
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
        for i in weights:
            size = len(memoryview(program.weights[i]).cast("B"))
            if size:
                by_offset.setdefault((program.tensors[i].offset, size), []).append(i)
            else:
                empty.append(i)
        found: dict[Key, _Resident] = {}
        missing: list[Key] = []
        user: dict[Key, tuple[DeviceBuffer, int]] = {}
        hosts: dict[Key, tuple[np.ndarray, int]] = {}  # host bytes and their address, once
        for key, indices in by_offset.items():
            host = host_bytes(program.weights[indices[0]])
            hosts[key] = host, host_address(host)
            where = next((pinned[i] for i in indices if i in pinned), None) if pinned else None
            if where is not None:
                hit = self._by_host.get((hosts[key][1], host.size))
                if hit is not None and hit.address == where[0].address + where[1]:
                    found[key] = hit
                else:
                    user[key] = where
                continue
            hit = self._find(*hosts[key])
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
                found[key] = self._upload_pinned(*hosts[key], buffer, offset, stream)
        except BaseException:
            self._undo([r for k, r in found.items() if k not in before])
            raise
        for key, indices in by_offset.items():
            resident = found[key]
            resident.users += 1
            resident.block.users += 1
            placement.residents.append(resident)
            for i in indices:
                placement.addresses[i] = resident.address
                if resident.ready is not None and not resident.ready.processed:
                    placement.ready[i] = resident.ready
            if key in before:
                self.shared_bytes += resident.nbytes
        return placement

    def _find(self, host: np.ndarray, address: int) -> _Resident | None:
        hit = self._by_host.get((address, host.size))
        if hit is not None:
            return hit
        candidates = self._by_size.get(host.size, ())
        if not candidates:
            return None
        digest = hashlib.sha256(host).digest()
        return next((c for c in candidates if c.sha256() == digest), None)

    def _upload(self, program: Program, by_offset: dict[Key, list[int]], missing: list[Key],
                found: dict[Key, _Resident], placement: Placement, stream: bool,
                hosts: dict[Key, tuple[np.ndarray, int]]) -> None:
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
            moved = {i: dataclasses.replace(program.tensors[i], offset=layout[k])
                     for k in missing for i in by_offset[k] if layout[k] != k[0]}
            staged = dataclasses.replace(
                program, tensors=tuple(moved.get(i, t) for i, t in enumerate(program.tensors)),
                weights={by_offset[k][0]: program.weights[by_offset[k][0]] for k in missing})
            if stream:
                events, self._tail = stream_weights(self.firmware, staged, block.buffer,
                                                    self._tail)
            else:
                events = {}
                upload_weights(self.firmware, staged, block.buffer.address)
        except BaseException:
            device.free(block.buffer)
            raise
        if whole:
            placement.region = block.buffer
        for key in missing:
            host, address = hosts[key]
            resident = _Resident(block.buffer.address + layout[key], host.size, host, block,
                                 ready=events.get(by_offset[key][0]))
            found[key] = resident
            self._remember(resident, address)

    def _upload_pinned(self, host: np.ndarray, address: int, buffer: DeviceBuffer, offset: int,
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
        self._remember(resident, address)
        return resident

    def _remember(self, resident: _Resident, address: int) -> None:
        """Know ``resident`` by its host bytes' ``address`` and size, and by its size."""
        self._by_host[(address, resident.nbytes)] = resident
        self._by_size.setdefault(resident.nbytes, []).append(resident)

    def _undo(self, created: list[_Resident]) -> None:
        """Forget residents a failed placement created (nobody uses them yet)."""
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
        key = (host_address(resident.host), resident.nbytes)
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
        residents = {id(r): r for r in self._by_host.values()}
        for same in self._by_size.values():
            residents.update((id(r), r) for r in same)
        return {"hbm.weights.bytes": sum(r.nbytes for r in residents.values()),
                "hbm.weights.user_bytes": sum(r.nbytes for r in residents.values()
                                              if not r.block.owned),
                "hbm.weights.references": sum(r.users for r in residents.values()),
                "hbm.weights.shared_bytes": self.shared_bytes}
