"""The program loader: validate a compiled :class:`~firmware_model.program.Program`, place it in
HBM, and run it.

:func:`load_program` (``Firmware.load``) first checks everything it can without touching the
device (:mod:`firmware_model.validate`; the list is in ``docs/firmware.md``) and raises one
:class:`~npu_sim.errors.InvalidCommand` listing every problem found. Only then does it allocate
the ARENA and WEIGHTS regions, upload the weights through the firmware straight from their
host memory (:mod:`firmware_model.upload`: one DMA per run of weights contiguous in host memory
and in HBM, no staging copy), and relocate the command stream: every ``reloc(region, offset)``
address becomes the region's HBM base plus the offset.
A failed load frees what it allocated.

:meth:`LoadedProgram.run` checks the inputs, then submits one submission: the input DMAs
(host -> arena), a BARRIER, the program's commands, a BARRIER, the output DMAs (arena -> host).
The host streams it through the submission ring however long it is.
In timing-only mode (``functional=False``) kernels compute no values but every DMA and kernel is
still charged, and the outputs are returned as ``None``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import simpy

from npu_sim import dtypes
from npu_sim.dtypes import TensorSpec
from npu_sim.errors import InvalidCommand
from npu_sim.hbm import DeviceBuffer
from npu_sim.kernels import blas

from . import prune, replay
from .commands import U32_MAX, Barrier, Command, Dma, Signal, Wait, pack
from .program import Program, Region, split_reloc
from .validate import SCOPE, validate
from .weights import Placement

if TYPE_CHECKING:
    from npu_sim.device import Device

    from .processor import Firmware

def load_program(fw: Firmware, program: Program, *, functional: bool = True,
                 stream: bool = False,
                 pinned: Mapping[int, tuple[DeviceBuffer, int]] | None = None) -> LoadedProgram:
    """Validate, allocate, upload weights and relocate; see the module docstring. ``stream``
    and ``pinned`` are :meth:`~firmware_model.weights.WeightStore.place`'s: weight uploads
    left in flight (kernels wait for their own weights), weights in caller-provided memory."""
    device = fw.device
    commands = validate(program, cores=device.config.cores, semaphores=len(fw.semaphores),
                        functional=functional)
    loaded = LoadedProgram(fw, program, functional)
    try:
        if program.arena_bytes:
            loaded.arena = device.malloc(program.arena_bytes)
        if program.weights_bytes:
            loaded.placement = fw.weights.place(
                program, shareable=not _reads_region(commands, Region.WEIGHTS),
                stream=stream, pinned=pinned)
            loaded.weights = loaded.placement.region
    except BaseException:
        loaded.unload()
        raise
    loaded.commands = [_relocate(c, loaded) for c in commands]
    return loaded


def _reads_region(commands: Sequence[Command], region: Region) -> bool:
    """Whether a DMA of ``commands`` addresses ``region`` (then its layout must stay whole)."""
    return any(isinstance(c, Dma) and region in (Region(split_reloc(c.src)[0]),
                                                 Region(split_reloc(c.dst)[0]))
               for c in commands)


def _relocate(cmd: Command, loaded: LoadedProgram) -> Command:
    if not isinstance(cmd, Dma):
        return cmd
    return Dma(cmd.cmd_id, loaded.absolute(cmd.src), loaded.absolute(cmd.dst), cmd.nbytes,
               deps=cmd.deps)


def _replayed(schedule: replay.Schedule, loaded: LoadedProgram, host_in: list[np.ndarray],
              host_out: list[np.ndarray]) -> bool:
    with blas.one_thread():
        return schedule.replay(loaded, host_in, host_out)


class LoadedProgram:
    """A program resident on the device: its regions, its relocated commands, and :meth:`run`."""

    def __init__(self, firmware: Firmware, program: Program, functional: bool) -> None:
        self.firmware = firmware
        self.program = program
        self.functional = functional
        self.arena: DeviceBuffer | None = None
        self.weights: DeviceBuffer | None = None
        """The buffer holding the WEIGHTS region as compiled, if the program has one (see
        :class:`~firmware_model.weights.Placement`); its weights may also be shared."""
        self.placement: Placement | None = None
        self.commands: list[Command] = []
        self.last_run_cycles: int | None = None
        self.loaded = True
        self._operands: dict[int, tuple[int, TensorSpec]] = {}
        self.replay = True
        """Whether later runs may replay the first one's schedule (:mod:`.replay`); False
        simulates every run."""
        self._schedules: dict[tuple, replay.Schedule | None] = {}
        """Recorded runs by :func:`.replay.key`; later runs replay them (:mod:`.replay`)."""
        self._pruned: dict[frozenset[int], list[Command]] = {}
        """Command streams of partial runs by wanted outputs (:mod:`.prune`)."""
        self.prepared: tuple[tuple, list] | None = None
        """The kernels and prepared steps every functional schedule replays
        (:func:`.replay.shared_steps`)."""

    def base(self, region: Region) -> int:
        """HBM address of ``region``."""
        buf = self.arena if region == Region.ARENA else self.weights
        if buf is None:
            raise InvalidCommand(SCOPE, f"program {self.program.name!r} has no {region.name} "
                                         "region allocated")
        return buf.address

    def absolute(self, address: int) -> int:
        """The HBM address of a relocatable ``address``."""
        region, offset = split_reloc(address)
        return self.base(Region(region)) + offset

    def operand(self, tensor: int) -> tuple[int, TensorSpec]:
        """``(HBM address, spec)`` of tensor ``tensor`` (what ``compute.execute`` takes)."""
        operand = self._operands.get(tensor)
        if operand is None:  # regions never move while loaded: resolve each tensor once
            t = self.program.tensors[tensor]
            if t.region == Region.WEIGHTS and self.placement is not None:
                address = self.placement.addresses[tensor]
            elif t.spec.nbytes == 0:  # an empty tensor has no byte to address: any region
                address = 0           # may be unallocated (an empty weight makes none)
            else:
                address = self.base(t.region) + t.offset
            operand = self._operands[tensor] = (address, t.spec)
        return operand

    def arrivals(self, tensors: Sequence[int]) -> list[simpy.Event]:
        """The streamed uploads of ``tensors``' weights (what a kernel reading them waits for
        and names as dependencies), until the first run after which all have landed."""
        ready = self.placement.ready if self.placement is not None else None
        if not ready:
            return []
        return list(dict.fromkeys(ready[t] for t in tensors if t in ready))

    def _forget_landed(self) -> None:
        ready = self.placement.ready if self.placement is not None else None
        for t in [t for t in ready or () if ready[t].processed]:
            del ready[t]  # landed: later runs need not wait or depend on it

    @functools.cached_property
    def replayable(self) -> bool:
        """Whether every pair of conflicting kernels is ordered by dependencies
        (:func:`.replay.replayable`; worked out once)."""
        return replay.replayable(self)

    @property
    def relocated_commands(self) -> bytes:
        """The command stream with absolute addresses, as the firmware runs it."""
        return pack(self.commands)

    def run(self, inputs: Sequence[np.ndarray] | None, *, functional: bool = True,
            queue: int = 0, outputs: Sequence[int] | None = None) -> list[np.ndarray | None]:
        """Run once: inputs in, commands, outputs out; returns the outputs (``None`` each in
        timing-only mode, where ``inputs`` may also be None). Raises DeviceFault on a fault.

        ``outputs``: indices of the outputs wanted (default all). For a proper subset the run
        is partial: only the commands those outputs need do work (:mod:`.prune`; the others
        are NOPs), only they are downloaded, the others are returned as ``None``, and the run
        is simulated, never replayed or recorded (:mod:`.replay`)."""
        prog, fw, device = self.program, self.firmware, self.firmware.device
        if not self.loaded:
            raise InvalidCommand(SCOPE, f"program {prog.name!r} was unloaded")
        if functional and not self.functional:
            raise InvalidCommand(SCOPE, f"program {prog.name!r} was loaded timing-only "
                                         "(functional=False); load it again to compute values")
        host_in = self._host_inputs(inputs, functional)
        # An output that is a weight (a constant) is read by a DMA, which cannot wait for a
        # streamed upload: let those land first.
        fw.weights.settle([e for e in self.arrivals(prog.outputs) if not e.processed])
        host_out = [np.zeros(t.shape, dtypes.to_numpy(t.dtype)) for t in prog.output_descs()]
        wanted = frozenset(range(len(host_out)) if outputs is None else outputs)
        partial = len(wanted) < len(host_out)
        body = self.commands
        if partial:
            body = self._pruned.get(wanted)
            if body is None:
                body = self._pruned[wanted] = prune.pruned(self, wanted)
        key = replay.key(self, functional, queue)
        schedule = self._schedules.get(key) if self.replay and not partial else None
        if schedule is not None and _replayed(schedule, self, host_in, host_out):
            self.last_run_cycles = schedule.cycles
            return list(host_out) if functional else [None] * len(host_out)
        before = replay.Schedule.begin(self, queue) if self.replayable and self.replay and \
            schedule is None and not partial else None
        used = {c.semaphore for c in self.commands if isinstance(c, (Signal, Wait))}
        fw.reset_semaphores(sorted(used))
        mapped: list[int] = []
        try:
            io_id = max((c.cmd_id for c in self.commands), default=-1) + 1
            pre: list[Command] = []
            post: list[Command] = []
            for arrays, indices, out in ((host_in, prog.inputs, pre),
                                         (host_out, prog.outputs, post)):
                for k, (array, index) in enumerate(zip(arrays, indices, strict=True)):
                    if not array.nbytes or (out is post and k not in wanted):
                        continue
                    iova = device.map_host(array)
                    mapped.append(iova)
                    address = self.operand(index)[0]
                    src, dst = (iova, address) if out is pre else (address, iova)
                    if io_id + 2 > U32_MAX:
                        raise InvalidCommand(SCOPE, "command ids exhausted for I/O DMAs")
                    out.append(Dma(io_id, src, dst, array.nbytes))
                    io_id += 1
            stream = [*pre, Barrier(io_id), *body, Barrier(io_id + 1), *post]
            self.last_run_cycles = None
            start = device.now
            with blas.one_thread():  # see npu_sim.kernels.blas: once per run, not per kernel
                fw.run(stream, queue=queue, program=self, functional=functional)
            self.last_run_cycles = device.now - start
            self._forget_landed()
            if before is not None:
                self._schedules[key] = replay.Schedule.end(
                    self, before, functional=functional, queue=queue, commands=len(stream),
                    iovas=mapped)
        finally:
            for iova in mapped:
                device.unmap_host(iova)
        if not functional:
            return [None] * len(host_out)
        return [a if k in wanted else None for k, a in enumerate(host_out)]

    def _host_inputs(self, inputs: Sequence[np.ndarray] | None,
                     functional: bool) -> list[np.ndarray]:
        descs = self.program.input_descs()
        if inputs is None and not functional:
            return [np.zeros(t.shape, dtypes.to_numpy(t.dtype)) for t in descs]
        if inputs is None or len(inputs) != len(descs):
            got = "None" if inputs is None else str(len(inputs))
            raise InvalidCommand(SCOPE, f"program {self.program.name!r} takes {len(descs)} "
                                         f"inputs ({', '.join(t.name for t in descs)}), got {got}")
        out = []
        for k, (array, t) in enumerate(zip(inputs, descs, strict=True)):
            want = dtypes.to_numpy(t.dtype)
            shape, dtype = getattr(array, "shape", None), getattr(array, "dtype", None)
            if not isinstance(array, np.ndarray) or shape != t.shape or dtype != want:
                raise InvalidCommand(SCOPE, f"input {k} {t.name!r}: expected shape {t.shape} "
                                             f"{t.dtype}, got "
                                             + (f"shape {shape} {dtype}"
                                                if isinstance(array, np.ndarray)
                                                else type(array).__name__))
            out.append(np.require(array, requirements="C"))  # 0-d stays 0-d
        return out

    def unload(self) -> None:
        """Free the program's arena and release its weights (freed with their last user); it
        cannot run afterwards."""
        if self.arena is not None and not self.arena.freed:
            self.firmware.device.free(self.arena)
        if self.placement is not None:
            self.firmware.weights.release(self.placement)
        self.arena = self.weights = self.placement = None
        self._operands.clear()
        self._schedules.clear()
        self._pruned.clear()
        self.prepared = None
        self.loaded = False


def run_program(device: Device, program: Program, inputs: Sequence[np.ndarray], *,
                functional: bool = True) -> list[np.ndarray | None]:
    """Load ``program`` on ``device`` with a fresh one-queue firmware, run it once, unload it."""
    from .processor import Firmware

    loaded = Firmware(device).load(program, functional=functional)
    try:
        return loaded.run(inputs, functional=functional)
    finally:
        loaded.unload()
