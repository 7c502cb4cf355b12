"""The driver-level API: one simulated NPU on one simpy clock.

:class:`Device` ties the components together and is what a runtime (the firmware model, the
EP, a test) talks to::

    dev = Device("npu-m")
    buf = dev.malloc(x.nbytes)
    dev.memcpy_h2d_async(buf, x)
    out = np.empty_like(x)
    dev.memcpy_d2h_async(out, buf)
    dev.synchronize()          # runs the clock until every queued transfer has landed
    dev.now, dev.stats()["dma.h2d.bytes"]

The components are public attributes for the layers above: ``hbm`` (:class:`~npu_sim.hbm.Hbm`),
``dma`` (:class:`~npu_sim.dma.DmaEngine`), ``compute`` (:class:`~npu_sim.compute.Compute`),
``trace`` (:class:`~npu_sim.trace.TraceRecorder`) and ``env`` (the simpy environment). Nothing
depends on wall-clock time: the same calls always give the same cycles.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import simpy

from .compute import Compute
from .config import DeviceConfig
from .dma import BYTES, DMA_ALIGNMENT, HOST_IOVA_BASE, DmaEngine, HostMap
from .errors import ConfigError, DmaFault
from .hbm import DeviceBuffer, Hbm
from .trace.recorder import TraceRecorder

__all__ = ["DMA_ALIGNMENT", "HOST_IOVA_BASE", "Device", "DeviceBuffer"]


class Device:
    """A simulated NPU: config, clock, HBM, DMA engines, compute cores and a trace.

    ``config`` is a :class:`DeviceConfig`, a preset name, or None for ``npu-m``; ``allocator``
    names the HBM allocation strategy (``first_fit``, ``best_fit``, ``mru``).
    """

    def __init__(self, config: DeviceConfig | str | None = None, *,
                 allocator: str = "best_fit") -> None:
        if config is None:
            config = DeviceConfig.preset("npu-m")
        elif isinstance(config, str):
            config = DeviceConfig.preset(config)
        elif not isinstance(config, DeviceConfig):
            raise ConfigError("config", config, "a DeviceConfig, a preset name or None")
        self.config = config
        self.env = simpy.Environment()
        self.trace = TraceRecorder()
        self.hbm = Hbm(config, allocator)
        self.id = self.hbm.device_id
        self.host_map = HostMap()
        self.dma = DmaEngine(self.env, config, self.hbm, self.host_map, self.trace)
        self.compute = Compute(self.env, config, self.hbm, self.trace)
        weakref.finalize(self, _forget_schedule, self.env, self.dma)

    def __repr__(self) -> str:
        return f"Device(id={self.id}, config={self.config.name!r}, now={self.now})"

    @property
    def now(self) -> int:
        """Simulated time in cycles."""
        return int(self.env.now)

    # -- memory -------------------------------------------------------------------------------

    def malloc(self, nbytes: int) -> DeviceBuffer:
        """Allocate HBM (see :meth:`Hbm.malloc`)."""
        return self.hbm.malloc(nbytes)

    def free(self, buf: DeviceBuffer) -> None:
        """Release HBM (see :meth:`Hbm.free`)."""
        self.hbm.free(buf)

    def map_host(self, array: np.ndarray, *, share: bool = False) -> int:
        """Make a C-contiguous host array reachable by DMA; returns its I/O virtual address.
        ``share``: HBM may refer to the array's bytes instead of copying them, if they can
        never change (see :meth:`HostMap.map`)."""
        return self.host_map.map(array, share=share)

    def unmap_host(self, iova: int) -> None:
        """Remove a mapping made by :meth:`map_host`."""
        self.host_map.unmap(iova)

    # -- copies -------------------------------------------------------------------------------

    # Copies are concurrent unless ordered: there are no implicit streams. Pass the events a
    # copy must wait for as ``deps`` (e.g. a d2h after the kernel that produced its data).

    def memcpy_h2d_async(self, dst: DeviceBuffer, host_array: np.ndarray, dst_offset: int = 0,
                         *, deps: Sequence[simpy.Event] = (), share: bool = False) -> simpy.Event:
        """Copy all of ``host_array`` to ``dst`` at ``dst_offset``; an event for its arrival.
        ``share``: as for :meth:`map_host` (weights from a mapped file are referred to)."""
        array = self._host_array(host_array, writable=False)
        dst_offset = self._check_range(dst, dst_offset, array.nbytes, "dst")
        return self._copy_host(array, dst.address + dst_offset, to_device=True,
                               deps=self._events(deps), share=share)

    def memcpy_h2d_chain(self, dst: DeviceBuffer, copies: Sequence[tuple[np.ndarray, int]], *,
                         after: simpy.Event | None = None,
                         share: bool = False) -> list[simpy.Event]:
        """Copy each ``(host_array, dst_offset)`` of ``copies`` to ``dst``, one transfer each,
        every one queued behind the previous one's arrival (the first behind ``after``); their
        arrival events. The same as :meth:`memcpy_h2d_async` once per copy with the previous
        event as ``deps`` (the same mappings, transfers, chunks, cycles and trace records), with
        the buffer and the dependency checked once for the chain: the firmware streams a
        program's weights so, one transfer per weight. The arrivals of aligned, non-empty copies
        are plain events, not processes (nothing to ``interrupt``; no ``is_alive``).

        Faults are the per-copy calls' (the same :class:`DmaFault`; the copies before a
        faulting one are queued) except which one is raised when several things are wrong at
        the first copy: the chain checks ``dst`` and ``after`` first. With no copies nothing is
        checked or queued, as no per-copy call is made."""
        if not copies:
            return []
        self._check_range(dst, 0, 0, "dst")
        deps = self._events(() if after is None else (after,))
        base, room = dst.address, dst.nbytes
        if all(type(host) is np.ndarray and host.dtype is BYTES and host.ndim == 1
               and host.flags.c_contiguous and type(offset) is int
               and 0 <= offset <= room - host.size and host.size
               and not (base + offset) % DMA_ALIGNMENT for host, offset in copies):
            # Weights (flat bytes, aligned, in range): DMA uploads mapped in one loop and
            # started one after another by the engine (DmaEngine.upload_chain).
            mapped = self.host_map.map_uploads([host for host, _ in copies], share=share)
            return self.dma.upload_chain([
                (root, iova, base + offset, shared)
                for (root, iova, shared), (_, offset) in zip(mapped, copies, strict=True)],
                deps[0] if deps else None)
        arrivals: list[simpy.Event] = []
        for host_array, offset in copies:  # anything else: one copy at a time
            arrivals.append(self.memcpy_h2d_async(dst, host_array, offset, deps=deps,
                                                  share=share))
            deps = arrivals[-1:]
        return arrivals

    def memcpy_d2h_async(self, host_array: np.ndarray, src: DeviceBuffer, src_offset: int = 0,
                         *, deps: Sequence[simpy.Event] = ()) -> simpy.Event:
        """Fill ``host_array`` from ``src`` at ``src_offset``; an event for its arrival."""
        array = self._host_array(host_array, writable=True)
        src_offset = self._check_range(src, src_offset, array.nbytes, "src")
        return self._copy_host(array, src.address + src_offset, to_device=False,
                               deps=self._events(deps), share=False)

    def memcpy_d2d_async(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int,
                         dst_offset: int = 0, src_offset: int = 0,
                         *, deps: Sequence[simpy.Event] = ()) -> simpy.Event:
        """Copy ``nbytes`` within HBM from ``src`` (+offset) to ``dst`` (+offset)."""
        src_offset = self._check_range(src, src_offset, nbytes, "src")
        dst_offset = self._check_range(dst, dst_offset, nbytes, "dst")
        nbytes = int(nbytes)
        return self.dma.transfer(src.address + src_offset, dst.address + dst_offset, nbytes,
                                 deps=self._events(deps))

    def synchronize(self) -> None:
        """Run the clock until nothing is left to happen (every queued copy and command).

        A transfer or kernel that failed and that nobody waited on raises its typed error here.
        """
        self.env.run()

    def _copy_host(self, array: np.ndarray, device_address: int, *, to_device: bool,
                   deps: Sequence[simpy.Event], share: bool) -> simpy.Event:
        if array.nbytes == 0:  # nothing to move: already complete
            return self.env.event().succeed()
        iova = self.host_map.map(array, share=share)
        src, dst = (iova, device_address) if to_device else (device_address, iova)
        try:
            done = self.dma.transfer(src, dst, array.nbytes, deps=deps)
        except DmaFault:
            self.host_map.unmap(iova)
            raise
        done.callbacks.append(lambda _: self.host_map.unmap(iova))
        return done

    def _events(self, deps: Any) -> list[simpy.Event]:
        """``deps`` as a list of this device's events, or :class:`DmaFault` naming the culprit."""
        try:
            events = list(deps)
        except TypeError:
            raise DmaFault("npu.dma", f"deps must be a sequence of events of this device, got "
                                      f"{type(deps).__name__}") from None
        for k, event in enumerate(events):
            if not isinstance(event, simpy.Event) or event.env is not self.env:
                what = "an event of another device" if isinstance(event, simpy.Event) else \
                    f"{type(event).__name__} {event!r}"
                raise DmaFault("npu.dma", f"deps[{k}] is {what}; expected an event returned by "
                                          f"this device")
        return events

    def _host_array(self, array: Any, *, writable: bool) -> np.ndarray:
        if type(array) is np.ndarray and array.dtype is BYTES and array.flags.c_contiguous \
                and not writable:  # host bytes to upload (weights): nothing else to check
            return array
        if not isinstance(array, np.ndarray) or not array.flags.c_contiguous:
            raise DmaFault("npu.dma", f"host array must be a C-contiguous numpy array, got "
                                      f"{type(array).__name__}")
        if array.dtype.hasobject or array.dtype.kind in "OUS":
            raise DmaFault("npu.dma", f"host array of dtype {array.dtype} holds Python objects "
                                      "or strings; DMA moves numeric arrays (bool, ints, floats)")
        if writable and not array.flags.writeable:
            raise DmaFault("npu.dma", "host array is read-only; a d2h copy needs to write it")
        return array

    def _check_range(self, buf: DeviceBuffer, offset: int, nbytes: int, role: str) -> int:
        """``offset`` as an int (a numpy integer would reach the trace's records), once ``buf``
        is a live buffer of this device and ``[offset, offset + nbytes)`` lies in it; else
        :class:`DmaFault`."""
        if not isinstance(buf, DeviceBuffer) or buf.device_id != self.id or buf.freed:
            raise DmaFault("npu.dma", f"{role}={buf!r} is not a live buffer of device {self.id}")
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) \
                or isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)):
            raise DmaFault("npu.dma", f"{role} offset={offset!r}, nbytes={nbytes!r}; expected "
                                      "ints")
        if offset < 0 or nbytes < 0 or offset + nbytes > buf.nbytes:
            raise DmaFault("npu.dma", f"{role} range [{offset}, {offset}+{nbytes}) is outside "
                                      f"the buffer's {buf.nbytes} bytes")
        return int(offset)

    # -- statistics ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """All counters, flat: ``hbm.*``, ``dma.*``, ``compute.*``, ``core.N.*`` and
        ``device.cycles``."""
        return {**self.hbm.stats(), **self.dma.stats(), **self.compute.stats(),
                "device.cycles": self.now}

    @property
    def dma_channel_order(self) -> tuple[int, ...]:
        """The free DMA channels in the order the next transfers take them (channels return to
        the back as they finish): with the clock, what a run's schedule depends on."""
        return tuple(self.dma._channels.items)

    def fast_forward(self, cycles: int, counters: dict[str, int],
                     channel_order: tuple[int, ...]) -> None:
        """Advance an idle device by a run recorded earlier: the clock by ``cycles``, the
        DMA and compute counters (``dma.*``, ``compute.*``, ``core.*``) by ``counters``, and
        leave the free DMA channels in ``channel_order`` (as that run left them).

        Only for a replay of a run whose values were computed and whose trace records were
        re-emitted elsewhere (``firmware_model.replay``); refuses a device with events pending.
        """
        if self.env.peek() != float("inf"):
            raise DmaFault("npu", "fast_forward needs an idle device; events are pending")
        dma, compute = self.dma._stats, self.compute._stats
        unknown = sorted(set(counters) - set(dma) - set(compute))
        if unknown:
            raise ConfigError("counters", unknown, f"names among {sorted({*dma, *compute})}")
        for key, value in counters.items():
            (dma if key in dma else compute)[key] += value
        if sorted(channel_order) != sorted(self.dma._channels.items):
            raise ConfigError("channel_order", channel_order, "a permutation of the channels")
        self.dma._transfer_no += counters.get("dma.transfers", 0)
        self.dma._channels.items[:] = channel_order
        if cycles:
            self.env.run(until=self.env.now + cycles)

    def reset_stats(self) -> None:
        """Zero the counters (the clock, allocations and trace are untouched)."""
        self.hbm.reset_stats()
        self.dma.reset_stats()
        self.compute.reset_stats()


def _forget_schedule(env: simpy.Environment, dma: DmaEngine) -> None:
    """A device nobody refers to any more never runs its clock again: drop the events still
    scheduled on it and the upload chains still pending. simpy's environment refers to itself
    (its bound ``process``, ``timeout``, ... are attributes), and a chain's arrivals refer to
    the chain, so only the cyclic garbage collector would free them; what they hold (the DMA
    engine, the HBM, the host mappings, the file mapping of a context binary's weights) then
    goes at once with the device, not at some later collection."""
    env._queue.clear()
    dma.forget_pending()
