"""DMA: channels that move bytes between host memory and HBM, or within HBM.

Addresses say where bytes live. HBM addresses start at 0; host memory the device may touch is
mapped through a :class:`HostMap` (the IOMMU) at I/O virtual addresses at or above
:data:`HOST_IOVA_BASE`. A transfer's direction follows from its two addresses: host to device
(h2d), device to host (d2h) or device to device (d2d).

Timing model. A transfer larger than ``dma_chunk_bytes`` is split into chunks. Each chunk takes
a free channel (``dma_channels`` of them, handed out first come first served), spends
``dma_setup_cycles`` on its own (descriptor fetch, translation), then holds a *link* for
``ceil(bytes / bytes_per_cycle)`` cycles: the host link (PCIe, one at a time, so more channels
hide setup latency but never beat the link bandwidth) or, for d2d, the HBM port, which moves
each byte twice (read and write). A chunk's bytes are copied when its link time ends (from a
host mapping made with ``share=True`` over immutable memory, HBM refers to them instead:
:mod:`npu_sim.pieces`; the timing, counters and trace are the same); chunk completions are
reported in order (a chunk's completion waits for its predecessor's), and the transfer's event
succeeds when the last chunk completes.

Energy. Every chunk's bytes pass through the DMA engine (``dma_pj_per_byte``), cross the host
link (``host_link_pj_per_byte``, h2d and d2h) and are written to or read from HBM
(``hbm_pj_per_byte``; a d2d copy reads and writes, so twice). The chunk's trace record carries
them as ``work["energy"]`` (picojoules by component) and they add to the counters
``dma.energy_fj.<component>`` and ``dma.<channel>.energy_fj``.

Faults. :meth:`DmaEngine.transfer` validates the whole descriptor before anything moves: both
ranges inside one live allocation / mapping, ``nbytes > 0``, the destination writable, and
device-side addresses aligned to :data:`DMA_ALIGNMENT` (4) bytes. Host-side addresses and the
size may be any byte. A bad descriptor raises :class:`~npu_sim.errors.DmaFault` and no byte
moves. If a buffer is freed while a transfer is in flight, the affected chunk faults and the
transfer's event fails with a ``DmaFault`` (earlier chunks have landed, as on hardware).
"""

from __future__ import annotations

import math
import weakref
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import simpy

from .config import DeviceConfig
from .cost.energy import femtojoules
from .dma_chain import UploadChain
from .errors import DmaFault
from .hbm import Hbm
from .pieces import immutable
from .trace.recorder import TraceRecorder, record_ids, tag

HOST_IOVA_BASE = 1 << 62
"""I/O virtual addresses at or above this are host memory mapped through :class:`HostMap`."""

DMA_ALIGNMENT = 4
"""Device-side DMA addresses must be multiples of this many bytes."""

_IOVA_PAGE = 4096


def _span(nbytes: int) -> int:
    """The I/O virtual address space a mapping of ``nbytes`` takes: whole pages and a guard."""
    return (-(-max(nbytes, 1) // _IOVA_PAGE) + 1) * _IOVA_PAGE


BYTES = np.dtype(np.uint8)
"""The dtype of a flat byte array (a mapping, a weight's host bytes): taken as it is."""

DMA_ENERGY = ("dma", "host_link", "hbm")
"""Energy components of a DMA chunk (see the module docstring)."""


def chunk_energy(config: DeviceConfig, nbytes: int, d2d: bool) -> dict[str, float]:
    """Picojoules by component to move ``nbytes`` in one chunk (host link unless ``d2d``)."""
    return {
        "dma": nbytes * config.dma_pj_per_byte,
        "host_link": 0.0 if d2d else nbytes * config.host_link_pj_per_byte,
        "hbm": (2 if d2d else 1) * nbytes * config.hbm_pj_per_byte,
    }


class HostMap:
    """The IOMMU: host arrays registered for DMA, each at its own I/O virtual address.

    Mappings are page aligned and separated by an unmapped guard page, so an access running
    off the end of one mapping faults instead of landing in the next.
    """

    scope = "npu.iommu"

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray] = {}  # iova -> flat uint8 view of the host array
        self._starts: list[int] = []
        self._shared: set[int] = set()  # iovas of immutable arrays HBM may refer to
        self._next = HOST_IOVA_BASE

    def map(self, array: np.ndarray, *, share: bool = False) -> int:
        """Register a C-contiguous host array; returns its I/O virtual address.

        ``share``: a transfer from this mapping to HBM may leave HBM referring to the array's
        bytes instead of copying them, if they can never change (a read-only view of a file
        mapping or of ``bytes``, :func:`npu_sim.pieces.immutable`); other arrays are copied."""
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise DmaFault(self.scope, f"map_host needs a C-contiguous numpy array, got "
                                       f"{type(array).__name__}"
                                       + ("" if not isinstance(array, np.ndarray)
                                          else " that is not C-contiguous"))
        flat = array if array.dtype is BYTES and array.ndim == 1 \
            else array.reshape(-1).view(np.uint8)  # flat bytes (already, for weights)
        return self.map_uploads([flat], share=share)[0][1]

    def map_uploads(self, arrays: Sequence[np.ndarray], *,
                    share: bool = False) -> list[tuple[np.ndarray, int, bool]]:
        """:meth:`map` each of ``arrays`` in turn, flat C-contiguous ``uint8`` arrays the caller
        has checked (host bytes to upload); ``(root, iova, shared)`` of each (``shared``: HBM
        may refer to its bytes). One loop for the firmware's weight streams, which map one array per
        weight (:meth:`~npu_sim.device.Device.memcpy_h2d_chain`), and :meth:`map`'s work."""
        out: list[tuple[np.ndarray, int, bool]] = []
        arrays_, starts, shared_ = self._arrays, self._starts, self._shared
        iova = self._next
        # A read-only array over a read-only memoryview is immutable exactly when the object
        # the memoryview exports is (a weight's bytes in a mapped binary): asked once an object.
        exporters: dict[int, bool] = {}
        for array in arrays:
            arrays_[iova] = array
            starts.append(iova)  # addresses only grow: the list stays sorted
            base = array.base
            if not share:
                shared = False
            elif type(base) is memoryview and base.readonly and not array.flags.writeable:
                shared = exporters.get(id(base.obj))
                if shared is None:
                    shared = exporters[id(base.obj)] = immutable(array)
            else:
                shared = immutable(array)
            if shared:
                shared_.add(iova)
            out.append((array, iova, shared))
            iova += _span(array.size)
        self._next = iova
        return out

    def unmap(self, iova: int) -> None:
        """Remove the mapping that starts at ``iova``."""
        if iova not in self._arrays:
            raise DmaFault(self.scope, f"unmap_host({iova:#x}): no mapping starts there")
        del self._arrays[iova]
        del self._starts[bisect_right(self._starts, iova) - 1]
        self._shared.discard(iova)

    def locate(self, iova: int, nbytes: int, *, writable: bool = False) -> tuple[int, int]:
        """``(mapping start, offset)`` of a range inside one mapping, else DmaFault."""
        i = bisect_right(self._starts, iova) - 1
        if i >= 0:
            start = self._starts[i]
            raw = self._arrays[start]
            if iova + nbytes <= start + raw.size:
                if writable and not raw.flags.writeable:
                    raise DmaFault(self.scope, f"host range [{iova:#x}, +{nbytes}) is read-only")
                return start, iova - start
        raise DmaFault(self.scope, f"host range [{iova:#x}, +{nbytes}) is not inside one mapping "
                                   f"({len(self._starts)} mapped)")

    def view(self, iova: int, nbytes: int) -> np.ndarray:
        """The mapped host bytes ``[iova, iova + nbytes)`` as a ``uint8`` view."""
        start, offset = self.locate(iova, nbytes)
        return self._arrays[start][offset:offset + nbytes]

    def shared_source(self, iova: int, nbytes: int) -> tuple[np.ndarray, int] | None:
        """``(whole mapped array, offset)`` of a range in a shared mapping (``map(share=True)``
        of immutable bytes), else None."""
        start, offset = self.locate(iova, nbytes)
        return (self._arrays[start], offset) if start in self._shared else None


def is_host(address: int) -> bool:
    """Whether ``address`` is a host I/O virtual address."""
    return address >= HOST_IOVA_BASE


class DmaEngine:
    """``dma_channels`` channels sharing the host link and an HBM copy port."""

    def __init__(self, env: simpy.Environment, config: DeviceConfig, hbm: Hbm,
                 host_map: HostMap, trace: TraceRecorder, scope: str = "npu.dma") -> None:
        self.env = env
        self.config = config
        self.hbm = hbm
        self.host_map = host_map
        self.trace = trace
        self.scope = scope
        self._channels = simpy.Store(env, capacity=config.dma_channels)
        self._channels.items.extend(range(config.dma_channels))
        self.links = {"link": simpy.Resource(env, 1), "hbm": simpy.Resource(env, 1)}
        self._transfer_no = 0
        self._chains: weakref.WeakSet[UploadChain] = weakref.WeakSet()  # for forget_pending
        self.reset_stats()

    def reset_stats(self) -> None:
        """Zero every counter."""
        self._stats: dict[str, int] = {
            "dma.h2d.bytes": 0, "dma.d2h.bytes": 0, "dma.d2d.bytes": 0,
            "dma.transfers": 0, "dma.chunks": 0,
            "dma.busy_cycles.link": 0, "dma.busy_cycles.hbm": 0,
            **{f"dma.energy_fj.{name}": 0 for name in DMA_ENERGY},
        }
        for ch in range(self.config.dma_channels):
            self._stats[f"dma.{ch}.busy_cycles"] = 0
            self._stats[f"dma.{ch}.energy_fj"] = 0

    def stats(self) -> dict[str, float]:
        """Counters: bytes per direction, transfers, chunks, busy cycles per link and channel,
        energy (picojoules) by component and per channel."""
        return dict(self._stats)

    # -- transfers ----------------------------------------------------------------------------

    def transfer(self, src: int, dst: int, nbytes: int, *, name: str = "",
                 deps: Sequence[simpy.Event] = ()) -> simpy.Event:
        """Copy ``nbytes`` from ``src`` to ``dst``; the event succeeds when the last chunk lands.

        Raises :class:`DmaFault` (nothing moved) if the descriptor is invalid. The copy starts
        once every event in ``deps`` has succeeded; a failed dependency fails the transfer.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise DmaFault(self.scope, f"transfer {name!r}: nbytes={nbytes!r}; expected a "
                                       "positive int")
        src, dst, nbytes = int(src), int(dst), int(nbytes)
        if is_host(src) and is_host(dst):
            raise DmaFault(self.scope, f"transfer {name!r}: both {src:#x} and {dst:#x} are host "
                                       "addresses; one side must be HBM")
        return self._start(self._mover(src, dst, nbytes, name), src, dst, nbytes, name, deps)

    def upload_chain(self, uploads: Sequence[tuple[np.ndarray, int, int, bool]],
                     after: simpy.Event | None = None) -> list[simpy.Event]:
        """Copy each ``(root, src, dst, shared)`` of ``uploads``: all of ``root``, the whole host
        mapping at ``src`` (``shared``: made with ``share=True`` over immutable bytes), to HBM at
        ``dst``, which the caller has checked lies in one live allocation and is DMA-aligned,
        each transfer starting once the previous one has arrived (the first once ``after`` has);
        their arrival events. Each mapping is removed when its transfer arrives or fails (the
        chain owns them). The firmware streams a program's weights so, one transfer per weight.

        The transfers, their numbers, chunks, cycles, trace records and faults are those of
        :meth:`transfer` once per upload with the previous arrival as its dependency, without
        checking again what the caller just established, and without a simpy process per
        transfer (:class:`~npu_sim.dma_chain.UploadChain`)."""
        if not uploads:
            return []
        chain = UploadChain(self, uploads, after)
        self._chains.add(chain)
        return chain.arrivals

    def forget_pending(self) -> None:
        """The engine's device is gone and its clock will never run again: every upload chain
        still pending lets go of its arrivals and host bytes (:meth:`UploadChain.forget`)."""
        for chain in list(self._chains):
            chain.forget()

    def _start(self, move: Callable[[int, int], None], src: int, dst: int, nbytes: int,
               name: str, deps: Sequence[simpy.Event]) -> simpy.Event:
        direction = "h2d" if is_host(src) else "d2h" if is_host(dst) else "d2d"
        self._transfer_no += 1
        name = name or f"{direction}#{self._transfer_no}"
        self._stats["dma.transfers"] += 1
        pieces = chunk_plan(self.config, nbytes)
        work = {"direction": direction, "src": src, "dst": dst, "transfer": self._transfer_no,
                "transfer_bytes": nbytes}
        return self.env.process(self._run(move, pieces, name, work, tuple(deps), self.env.now))

    def _issue_uploads(self, uploads: Sequence[tuple[np.ndarray, int, int, bool]]) -> list[
            tuple[np.ndarray, int, int, bool, list[tuple[int, int]], str, dict[str, Any]]]:
        """Number each host-to-device upload ``(root, src, dst, shared)`` as a new transfer, in
        turn, and describe it as :meth:`_start` does: each with its chunks, its name and its
        records' ``work`` (one loop for a chain, which has one upload per weight)."""
        first = self._transfer_no
        config = self.config
        issued = [(root, src, dst, shared,
                   chunk_plan(config, root.size),
                   f"h2d#{no}", {"direction": "h2d", "src": src, "dst": dst, "transfer": no,
                                 "transfer_bytes": root.size})
                  for no, (root, src, dst, shared) in enumerate(uploads, first + 1)]
        self._transfer_no = first + len(issued)
        self._stats["dma.transfers"] += len(issued)
        return issued

    def _uploader(self, root: np.ndarray, dst: int,
                  shared: bool) -> Callable[[int, int], None]:
        """The function moving bytes ``[off, off + n)`` of ``root`` to HBM at ``dst + off``
        (referred to when ``shared``, else copied)."""
        hbm = self.hbm
        if shared:
            def move(off: int, n: int) -> None:
                hbm.share(dst + off, root, off, n)
        else:
            def move(off: int, n: int) -> None:
                hbm.store(dst + off, root[off:off + n])
        return move

    @property
    def transfers(self) -> int:
        """Transfers issued so far: the last one's number (its chunks' ``work["transfer"]``)."""
        return self._transfer_no

    def _mover(self, src: int, dst: int, nbytes: int,
               name: str) -> Callable[[int, int], None]:
        """Validate both sides now; return the function that moves bytes ``[off, off + n)``
        of the transfer at copy time."""
        for address, writable in ((src, False), (dst, True)):
            if is_host(address):
                self.host_map.locate(address, nbytes, writable=writable)
            elif address < 0 or address % DMA_ALIGNMENT:
                raise DmaFault(self.scope, f"transfer {name!r}: device address {address:#x} is "
                                           f"not a multiple of {DMA_ALIGNMENT}")
            else:
                self.hbm.locate(address, nbytes)
        hbm, host_map = self.hbm, self.host_map
        if is_host(dst):
            def to_host(off: int, n: int) -> None:
                host_map.view(dst + off, n)[:] = hbm.peek(src + off, n)
            return to_host
        source = host_map.shared_source(src, nbytes) if is_host(src) else None
        if source is not None:  # immutable host bytes: HBM refers to them
            root, at = source

            def refer(off: int, n: int) -> None:
                hbm.share(dst + off, root, at + off, n)
            return refer

        def copy(off: int, n: int) -> None:
            hbm.store(dst + off, host_map.view(src + off, n) if is_host(src)
                      else hbm.peek(src + off, n))
        return copy

    def _run(self, move, pieces, name, work, deps, submit):
        if deps:
            yield simpy.AllOf(self.env, deps)
        dep_ids = record_ids(deps)
        times = (submit, self.env.now)
        chunks = [self.env.process(self._chunk(move, off, n, i, len(pieces), name, work,
                                               dep_ids, times))
                  for i, (off, n) in enumerate(pieces)]
        last = None
        for proc in chunks:  # completions are reported in order
            result = yield proc
            if isinstance(result, DmaFault):
                raise result
            last = result
        tag(self.env.active_process, last)
        return last

    def _chunk(self, move, off, n, index, count, name, work, dep_ids, times):
        env, cfg = self.env, self.config
        ch = yield self._channels.get()
        start = env.now
        yield env.timeout(cfg.dma_setup_cycles)
        link, cycles = chunk_link(cfg, n, work["direction"])
        with self.links[link].request() as req:
            yield req
            yield env.timeout(cycles)
        try:
            move(off, n)
        except DmaFault as fault:  # a buffer was freed in flight; reported by the transfer
            return fault
        finally:
            self._channels.put(ch)
        end = env.now
        st = self._stats
        st[f"dma.{work['direction']}.bytes"] += n
        st["dma.chunks"] += 1
        st[f"dma.busy_cycles.{link}"] += cycles
        st[f"dma.{ch}.busy_cycles"] += end - start
        energy = chunk_energy(cfg, n, work["direction"] == "d2d")
        for key, value in energy.items():
            st[f"dma.energy_fj.{key}"] += femtojoules(value)
        st[f"dma.{ch}.energy_fj"] += femtojoules(sum(energy.values()))
        chunk_work: dict[str, Any] = {**work, "bytes": n, "offset": off, "chunk": index,
                                      "chunks": count, "link": link, "energy": energy}
        chunk_name = name if count == 1 else f"{name}[{index}/{count}]"
        return self.trace.record("dma", f"dma{ch}", f"{self.scope}{ch}", chunk_name, start, end,
                                 dep_ids, chunk_work, submit=times[0], ready=times[1])


def chunk_plan(config: DeviceConfig, nbytes: int) -> list[tuple[int, int]]:
    """``(offset, bytes)`` of each chunk a transfer of ``nbytes`` is split into."""
    chunk = config.dma_chunk_bytes
    if 0 < nbytes <= chunk:  # most transfers: one chunk
        return [(0, nbytes)]
    return [(off, min(chunk, nbytes - off)) for off in range(0, nbytes, chunk)]


def chunk_link(config: DeviceConfig, nbytes: int, direction: str) -> tuple[str, int]:
    """The link a chunk of ``nbytes`` holds (``"link"``: the host link; ``"hbm"``: the HBM port,
    for d2d, moving each byte twice) and for how many cycles. The chunk's channel is busy for
    ``config.dma_setup_cycles`` before that."""
    if direction == "d2d":
        return "hbm", math.ceil(2 * nbytes / config.hbm_bytes_per_cycle)
    return "link", math.ceil(nbytes / config.host_link_bytes_per_cycle)
